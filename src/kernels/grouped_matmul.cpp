// Grouped linear layers (kernels/grouped_matmul.h): the argument checks, the
// CPU's GEMM per group, and the switch to CUDA's grouped GEMM.
#include "kernels/grouped_matmul.h"

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/grouped_matmul.h"
#endif

namespace attnres::kernels {

namespace {

// The groups' count and shapes: offsets [G + 1] from 0 to M, ascending, and
// G weights of one shape [N, K] with x's dtype and device.
void check_groups(const char* op, const Tensor& x, Span<const Tensor> w,
                  const std::vector<int64_t>& offsets) {
  ATTNRES_CHECK(x.ndim() == 2, op, ": x ", x.describe(), " is not a matrix");
  ATTNRES_CHECK(offsets.size() == w.size() + 1 && offsets.front() == 0 &&
                    offsets.back() == x.dim(0),
                op, ": ", offsets.size(), " offsets for ", w.size(), " groups of ", x.dim(0),
                " rows");
  for (size_t g = 0; g < w.size(); ++g) {
    ATTNRES_CHECK(offsets[g + 1] >= offsets[g], op, ": group ", g, " ends before it starts");
    ATTNRES_CHECK(w[g].ndim() == 2 && w[g].shape() == w[0].shape() && w[g].dim(1) == x.dim(1) &&
                      w[g].dtype() == x.dtype() && w[g].device() == x.device(),
                  op, ": weight ", g, " ", w[g].describe(), " for x ", x.describe());
  }
}

Tensor group_rows(const Tensor& t, const std::vector<int64_t>& offsets, size_t g) {
  return t.rows(offsets[g], offsets[g + 1] - offsets[g]);
}

}  // namespace

void grouped_matmul_forward(Tensor& y, const Tensor& x, Span<const Tensor> w,
                            const std::vector<int64_t>& offsets) {
  const char* op = "grouped_matmul_forward";
  check_groups(op, x, w, offsets);
  if (w.empty()) return;
  check_arg(op, "y", y, x, {x.dim(0), w[0].dim(0)});
  ATTNRES_CUDA_DISPATCH(x, op, cuda::grouped_matmul_forward(y, x, w, offsets));
  for (size_t g = 0; g < w.size(); ++g) {
    if (offsets[g + 1] == offsets[g]) continue;
    Tensor yg = group_rows(y, offsets, g);
    matmul_forward(yg, group_rows(x, offsets, g), w[g]);
  }
}

void grouped_matmul_backward(Tensor* dx, Span<Tensor> dw, const Tensor& dy, const Tensor& x,
                             Span<const Tensor> w, const std::vector<int64_t>& offsets,
                             Store dx_store) {
  const char* op = "grouped_matmul_backward";
  check_groups(op, x, w, offsets);
  ATTNRES_CHECK(dw.empty() || dw.size() == w.size(), op, ": ", dw.size(), " weight gradients for ",
                w.size(), " groups");
  if (w.empty()) return;
  // Every operand checked here, before either backend: CUDA hands raw
  // pointers to cuBLAS, which would read or write past a misfit silently
  // (tensors are dense and row-major, so shape, dtype and device say all).
  const int64_t M = x.dim(0), N = w[0].dim(0), K = x.dim(1);
  check_arg(op, "dy", dy, x, {M, N});
  if (dx) check_arg(op, "dx", *dx, x, {M, K});
  for (size_t g = 0; g < dw.size(); ++g)
    check_arg(op, "dw", dw[g], x.device(), grad_dtype(x.dtype()), {N, K});
  ATTNRES_CUDA_DISPATCH(x, op, cuda::grouped_matmul_backward(dx, dw, dy, x, w, offsets, dx_store));
  for (size_t g = 0; g < w.size(); ++g) {
    if (offsets[g + 1] == offsets[g]) continue;
    Tensor dxg = dx ? group_rows(*dx, offsets, g) : Tensor();
    matmul_backward(dx ? &dxg : nullptr, dw.empty() ? nullptr : &dw[g], group_rows(dy, offsets, g),
                    group_rows(x, offsets, g), w[g], dx_store);
  }
}

}  // namespace attnres::kernels
