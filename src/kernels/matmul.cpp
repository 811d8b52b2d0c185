// Matmul dispatcher: argument checks and dtype dispatch.
#include "kernels/matmul.h"

#include <cstdint>
#include <vector>

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/reduce.h"
#include "kernels/cpu/matmul.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/matmul.h"
#endif

namespace attnres::kernels {

namespace {

// Reads M, K from x [M, K] and N from w [N, K]; checks both are 2-D and that
// the inner dims agree. OpenBLAS takes 32-bit dims (blasint = int).
void matmul_dims(const char* op, const Tensor& x, const Tensor& w, int64_t& M, int64_t& N,
                 int64_t& K) {
  if (!x.defined() || x.ndim() != 2)
    fail(op, ": x must be 2-D [M, K], got ", x.defined() ? shape_str(x.shape()) : "undefined");
  if (!w.defined() || w.ndim() != 2)
    fail(op, ": w must be 2-D [N, K], got ", w.defined() ? shape_str(w.shape()) : "undefined");
  M = x.dim(0);
  K = x.dim(1);
  N = w.dim(0);
  if (w.dim(1) != K)
    fail(op, ": inner dims differ: x ", shape_str(x.shape()), " vs w ", shape_str(w.shape()),
         " (w is [out, in])");
  check_arg(op, "w", w, x, {N, K});
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
    fail(op, ": dims [", M, ", ", N, ", ", K, "] exceed the BLAS 32-bit index range");
}

// The row blocks of w (kernels/matmul.h) must cover its N rows.
void check_row_blocks(const char* op, const std::vector<int64_t>& sizes, int64_t N) {
  if (sizes.empty()) return;
  int64_t rows = 0;
  for (int64_t b : sizes) {
    if (b < 0) fail(op, ": a row block of w has ", b, " rows");
    rows += b;
  }
  if (rows != N) fail(op, ": w's row blocks sum to ", rows, " rows, w has ", N);
}

// fn(first row, rows) for each row block of w, in order: the given ones, or
// the one block of all N rows (the CPU computes a product per block).
template <typename Fn>
void for_each_row_block(const std::vector<int64_t>& sizes, int64_t N, Fn fn) {
  if (sizes.empty()) return fn(int64_t(0), N);
  int64_t n0 = 0;
  for (int64_t b : sizes) {
    fn(n0, b);
    n0 += b;
  }
}

}  // namespace

void matmul_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* residual,
                    const std::vector<int64_t>& w_row_blocks) {
  const char* op = "matmul_forward";
  int64_t M, N, K;
  matmul_dims(op, x, w, M, N, K);
  check_arg(op, "y", y, x, {M, N});
  if (residual) check_arg(op, "residual", *residual, x, {M, N});
  check_row_blocks(op, w_row_blocks, N);
  ATTNRES_CUDA_DISPATCH(x, op, cuda::matmul_forward(y, x, w, residual));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    const bool in_place = residual && residual->raw() == y.raw();
    for_each_row_block(w_row_blocks, N, [&](int64_t n0, int64_t b) {
      cpu::matmul_forward<T>(y.data<T>() + n0, x.data<T>(), w.data<T>() + n0 * K, M, b, K,
                             in_place, N);
    });
    if (residual && !in_place) add_(y, *residual);
  });
}

void matmul_backward(Tensor* dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                     Store dx_store, const std::vector<int64_t>& w_row_blocks) {
  const char* op = "matmul_backward";
  int64_t M, N, K;
  matmul_dims(op, x, w, M, N, K);
  check_arg(op, "dy", dy, x, {M, N});
  if (dx) check_arg(op, "dx", *dx, x, {M, K});
  if (dw) check_arg(op, "dw", *dw, x.device(), grad_dtype(x.dtype()), {N, K});
  check_row_blocks(op, w_row_blocks, N);
  ATTNRES_CUDA_DISPATCH(x, op, cuda::matmul_backward(dx, dw, dy, x, w, dx_store));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    for_each_row_block(w_row_blocks, N, [&](int64_t n0, int64_t b) {
      cpu::matmul_backward<T>(dx ? dx->data<T>() : nullptr, dw ? dw->data<T>() + n0 * K : nullptr,
                              dy.data<T>() + n0, x.data<T>(), w.data<T>() + n0 * K, M, b, K,
                              n0 > 0 || dx_store == Store::Add, N);
    });
  });
}

}  // namespace attnres::kernels
