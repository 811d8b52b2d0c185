// CUDA grouped linear layers: a MoE layer's expert GEMMs as one
// cublasGemmGroupedBatchedEx each (forward, dx, dw), instead of a cuBLASLt
// GEMM per expert (kernels/cuda/matmul.cu).
//
// Why: a layer's experts are E GEMMs of one weight shape over row counts the
// routing decides. Per expert that is E launches (each too small to fill an
// H100 at E = 64+), and with cuBLASLt a plan per new row count (a dropless
// layer's counts change every step, so the plan cache keeps growing and
// every new count pays a heuristic query). The grouped call takes every
// problem's sizes at run time in one launch.
//
// The row-major mapping is gemm.cu's: row-major C[m, n] = A B^T is the
// column-major C^T = B A^T, so each problem below names our operands in
// swapped order. The groups' pointers go to the device (cuBLAS reads them
// there) through a small buffer per call; sizes, leading dimensions, alpha
// and beta stay on the host, one entry per group (group_size 1: each expert
// is its own group, since the row counts differ).
//
// Types: F32 (true fp32) or BF16 inputs with fp32 accumulation; dw's C is
// F32 for BF16 inputs, a mix cuBLAS does not document for the grouped call:
// that pass runs a GEMM per group. Each mix is decided once per process
// (class Blas below, said on stderr); ATTNRES_MOE_GROUPED_GEMM=0 runs every
// pass per group (to compare the two on a GPU).
//
// Never run on a GPU yet (docs/cuda.md): tests/gpu/test_moe.cpp checks it
// against the CPU's GEMM per group.
#include "kernels/cuda/grouped_matmul.h"

#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "core/device.h"
#include "kernels/common.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/reduce.h"

namespace attnres::kernels::cuda {

namespace {

cudaDataType_t cublas_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: fail("grouped GEMM: F32 or BF16, got ", dtype_name(t));
  }
}

// The cuBLAS handle of the process (created on first use, on the compute
// stream; destroyed at exit), as gemm.cu's cuBLASLt handle, and which type
// mixes run grouped.
//
// Which GEMM runs must not depend on what ran before (the recompute test
// compares a forward with its recomputation bit for bit), so each (A/B, C)
// mix is decided once, the first time it is asked, for the rest of the
// process, and said once on stderr: grouped where cuBLAS documents the mix
// for cublasGemmGroupedBatchedEx (A, B and C of one type: F32 or BF16, with
// CUBLAS_COMPUTE_32F) and a one-element probe call of it returns the right
// value; a GEMM per expert otherwise (BF16 inputs with an F32 C, the experts'
// dw in a bf16 run, is not among the documented mixes) or with
// ATTNRES_MOE_GROUPED_GEMM=0. A grouped call of a mix decided grouped that
// cuBLAS then refuses is an error, not a silent switch.
class Blas {
 public:
  static Blas& get() {
    static Blas b;
    return b;
  }
  cublasHandle_t handle() const { return handle_; }
  bool grouped(DType ab, DType c) {
    std::lock_guard<std::mutex> lock(mu_);
    const int key = 4 * static_cast<int>(ab) + static_cast<int>(c);
    auto it = decided_.find(key);
    if (it != decided_.end()) return it->second;
    std::string why;
    bool on = false;
    if (disabled_) why = "ATTNRES_MOE_GROUPED_GEMM=0";
    else if (ab != c || (ab != DType::F32 && ab != DType::BF16))
      why = "not a type mix cublasGemmGroupedBatchedEx documents";
    else if (!(on = probe(ab, c, why))) why = "its probe call: " + why;
    std::fprintf(stderr, "grouped GEMM, A/B %s C %s: %s%s%s\n", dtype_name(ab), dtype_name(c),
                 on ? "one cublasGemmGroupedBatchedEx per layer and pass" : "a GEMM per expert (",
                 on ? "" : why.c_str(), on ? "" : ")");
    decided_[key] = on;
    return on;
  }

 private:
  Blas() {
    stream();  // the runtime first, so it outlives the handle
    const cublasStatus_t st = cublasCreate(&handle_);
    if (st != CUBLAS_STATUS_SUCCESS) fail_internal("cublasCreate failed: ", cublasGetStatusString(st));
    // CUBLAS_COMPUTE_32F below: F32 inputs compute in true fp32 (no TF32), as gemm.cu's.
    const char* env = std::getenv("ATTNRES_MOE_GROUPED_GEMM");
    disabled_ = env && std::string(env) == "0";
  }
  ~Blas() { cublasDestroy(handle_); }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // One 1 x 1 x 1 problem, 1.5 x 2 into C: true when cuBLAS takes it and
  // writes 3 (exact in both types).
  bool probe(DType ab, DType c, std::string& why);

  cublasHandle_t handle_ = nullptr;
  std::mutex mu_;
  bool disabled_ = false;
  std::map<int, bool> decided_;  // by 4 * A/B type + C type
};

// One problem per non-empty group, column-major:
//   C_g (m x n_g, ldc) = op_a(A_g) op_b(B_g) (k_g) + beta C_g
// where exactly one of n and k varies with the group (its row count).
struct Problems {
  cublasOperation_t op_a, op_b;
  int m = 0, lda = 0, ldb = 0, ldc = 0;
  std::vector<int> n, k;
  std::vector<const void*> a, b;
  std::vector<void*> c;
};

// The grouped call itself; cuBLAS's status.
cublasStatus_t call_grouped(const Problems& p, DType ab, DType c_type, float beta) {
  const int G = static_cast<int>(p.c.size());
  Blas& blas = Blas::get();
  std::vector<cublasOperation_t> op_a(G, p.op_a), op_b(G, p.op_b);
  std::vector<int> m(G, p.m), lda(G, p.lda), ldb(G, p.ldb), ldc(G, p.ldc), size(G, 1);
  std::vector<float> alpha(G, 1.0f), betas(G, beta);
  // The pointer arrays on the device: A, B, C of every problem, in one copy
  // (from pageable memory: the call returns once it was read).
  std::vector<const void*> host;
  host.insert(host.end(), p.a.begin(), p.a.end());
  host.insert(host.end(), p.b.begin(), p.b.end());
  host.insert(host.end(), p.c.begin(), p.c.end());
  static_assert(sizeof(void*) == 2 * sizeof(int32_t), "pointers are two I32 elements");
  Tensor ptrs = Tensor::empty({static_cast<int64_t>(2 * host.size())}, DType::I32, Device::CUDA);
  ATTNRES_CUDA_CHECK(cudaMemcpyAsync(ptrs.raw(), host.data(), host.size() * sizeof(void*),
                                     cudaMemcpyHostToDevice, stream()));
  auto** dev = static_cast<void**>(ptrs.raw());
  ATTNRES_CHECK(cublasSetStream(blas.handle(), stream()) == CUBLAS_STATUS_SUCCESS,
                "cublasSetStream failed");
  const cublasStatus_t st = cublasGemmGroupedBatchedEx(
      blas.handle(), op_a.data(), op_b.data(), m.data(), p.n.data(), p.k.data(), alpha.data(),
      const_cast<const void* const*>(dev), cublas_type(ab), lda.data(),
      const_cast<const void* const*>(dev + G), cublas_type(ab), ldb.data(), betas.data(),
      dev + 2 * G, cublas_type(c_type), ldc.data(), G, size.data(), CUBLAS_COMPUTE_32F);
  return st;
}

bool Blas::probe(DType ab, DType c, std::string& why) {
  const Tensor a = Tensor::from_vector(std::vector<float>{1.5f}, {1}).to(Device::CUDA);
  const Tensor b = Tensor::from_vector(std::vector<float>{2.0f}, {1}).to(Device::CUDA);
  Tensor a_t = Tensor::empty({1}, ab, Device::CUDA), b_t = Tensor::empty({1}, ab, Device::CUDA);
  kernels::convert(a_t, a);
  kernels::convert(b_t, b);
  Tensor out = Tensor::zeros({1}, c, Device::CUDA);
  Problems p{CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, 1, {1}, {1}, {a_t.raw()}, {b_t.raw()}, {out.raw()}};
  const cublasStatus_t st = call_grouped(p, ab, c, 0.0f);
  if (st != CUBLAS_STATUS_SUCCESS) {
    why = cublasGetStatusString(st);
    return false;
  }
  Tensor f = Tensor::empty({1}, DType::F32, Device::CUDA);
  kernels::convert(f, out);
  const float got = f.to(Device::CPU).data<float>()[0];
  if (got != 3.0f) {
    why = "1.5 x 2 gave " + std::to_string(got);
    return false;
  }
  return true;
}

// Runs them as one grouped call; false where the type mix runs per group.
bool run_grouped(const Problems& p, DType ab, DType c_type, float beta) {
  const int G = static_cast<int>(p.c.size());
  if (G == 0) return true;
  if (!Blas::get().grouped(ab, c_type)) return false;
  const cublasStatus_t st = call_grouped(p, ab, c_type, beta);
  if (st != CUBLAS_STATUS_SUCCESS)
    fail_internal("cublasGemmGroupedBatchedEx failed: ", cublasGetStatusString(st), " (", G,
                  " groups, A/B ", dtype_name(ab), ", C ", dtype_name(c_type), ")");
  return true;
}

int to_int(int64_t v, const char* what) {
  ATTNRES_CHECK(v <= 2147483647, "grouped GEMM: ", what, " ", v, " exceeds cuBLAS's int");
  return static_cast<int>(v);
}

// Row `row` of a row-major matrix.
void* at(const Tensor& t, int64_t row) { return t.rows(row, 0).raw(); }

// f(g, first row, rows) for every non-empty group g.
template <typename F>
void for_groups(const std::vector<int64_t>& offsets, F f) {
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    if (offsets[g + 1] > offsets[g]) f(g, offsets[g], offsets[g + 1] - offsets[g]);
}

}  // namespace

bool uses_grouped_gemm(DType ab, DType c) { return Blas::get().grouped(ab, c); }

void grouped_matmul_forward(Tensor& y, const Tensor& x, Span<const Tensor> w,
                            const std::vector<int64_t>& offsets) {
  const int K = to_int(x.dim(1), "K"), N = to_int(w[0].dim(0), "N");
  // y_g[M_g, N] = x_g w_g^T: column-major y_g^T (N x M_g, ld N) = w_g (N x K:
  // w_g^T stored K x N, ld K, transposed) x_g^T (K x M_g, ld K).
  Problems p{CUBLAS_OP_T, CUBLAS_OP_N, N, K, K, N};
  for_groups(offsets, [&](size_t g, int64_t row, int64_t rows) {
    p.n.push_back(to_int(rows, "rows"));
    p.k.push_back(K);
    p.a.push_back(w[g].raw());
    p.b.push_back(at(x, row));
    p.c.push_back(at(y, row));
  });
  if (run_grouped(p, x.dtype(), y.dtype(), 0.0f)) return;
  for_groups(offsets, [&](size_t g, int64_t row, int64_t rows) {
    Tensor yg = y.rows(row, rows);
    matmul_forward(yg, x.rows(row, rows), w[g], nullptr);
  });
}

void grouped_matmul_backward(Tensor* dx, Span<Tensor> dw, const Tensor& dy, const Tensor& x,
                             Span<const Tensor> w, const std::vector<int64_t>& offsets,
                             Store dx_store) {
  const int K = to_int(x.dim(1), "K"), N = to_int(w[0].dim(0), "N");
  if (dx) {
    // dx_g[M_g, K] (+)= dy_g[M_g, N] w_g[N, K]: column-major dx_g^T (K x M_g)
    // = w_g^T (K x N, ld K) dy_g^T (N x M_g, ld N), no transposes.
    Problems p{CUBLAS_OP_N, CUBLAS_OP_N, K, K, N, K};
    for_groups(offsets, [&](size_t g, int64_t row, int64_t rows) {
      p.n.push_back(to_int(rows, "rows"));
      p.k.push_back(N);
      p.a.push_back(w[g].raw());
      p.b.push_back(at(dy, row));
      p.c.push_back(at(*dx, row));
    });
    // Added in place in bf16 is gemm.cu's special case: per group there.
    const bool add = dx_store == Store::Add;
    if ((add && dx->dtype() == DType::BF16) ||
        !run_grouped(p, x.dtype(), dx->dtype(), add ? 1.0f : 0.0f))
      for_groups(offsets, [&](size_t g, int64_t row, int64_t rows) {
        Tensor dxg = dx->rows(row, rows);
        matmul_backward(&dxg, nullptr, dy.rows(row, rows), x.rows(row, rows), w[g], dx_store);
      });
  }
  if (dw.empty() || N == 0) return;
  // dw_g[N, K] += dy_g^T x_g: column-major dw_g^T (K x N, ld K) = x_g^T
  // (K x M_g, ld K) dy_g (M_g x N: dy_g^T stored N x M_g, ld N, transposed).
  Problems p{CUBLAS_OP_N, CUBLAS_OP_T, K, K, N, K};
  for_groups(offsets, [&](size_t g, int64_t row, int64_t rows) {
    p.n.push_back(N);
    p.k.push_back(to_int(rows, "rows"));
    p.a.push_back(at(x, row));
    p.b.push_back(at(dy, row));
    p.c.push_back(dw[g].raw());
  });
  if (run_grouped(p, x.dtype(), dw[0].dtype(), 1.0f)) return;
  for_groups(offsets, [&](size_t g, int64_t row, int64_t rows) {
    matmul_backward(nullptr, &dw[g], dy.rows(row, rows), x.rows(row, rows), w[g], Store::Set);
  });
}

}  // namespace attnres::kernels::cuda
