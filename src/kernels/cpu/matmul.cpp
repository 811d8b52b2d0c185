#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

namespace attnres::kernels::cpu {

namespace {

// One row-major GEMM, C = alpha op(A) op(B) + beta C, routed to sgemm/dgemm.
// Leading dimensions are the row lengths of the stored (untransposed) arrays.
// BLAS rejects a leading dimension of 0, hence the max(1, .).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a,
              static_cast<blasint>(std::max<int64_t>(1, lda)), b,
              static_cast<blasint>(std::max<int64_t>(1, ldb)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, ldc)));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0, a,
              static_cast<blasint>(std::max<int64_t>(1, lda)), b,
              static_cast<blasint>(std::max<int64_t>(1, ldb)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, ldc)));
}

}  // namespace

template <typename T>
void matmul_forward(T* y, const T* x, const T* w, int64_t M, int64_t N, int64_t K, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // empty sum: y = 0 (or unchanged when accumulating)
    if (!accumulate) std::memset(y, 0, sizeof(T) * M * N);
    return;
  }
  // y[M,N] = x[M,K] * (w[N,K])^T
  gemm(false, true, M, N, K, x, K, w, K, accumulate ? T(1) : T(0), y, N);
}

template <typename T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx) {
  // With M or K == 0 the gradients are empty tensors. With N == 0 they are
  // empty sums: += 0 does nothing, = 0 zeroes dx.
  if (M == 0 || K == 0) return;
  if (N == 0) {
    if (dx && !accumulate_dx) std::memset(dx, 0, sizeof(T) * M * K);
    return;
  }
  // dx[M,K] (+)= dy[M,N] w[N,K]
  if (dx) gemm(false, false, M, K, N, dy, N, w, K, accumulate_dx ? T(1) : T(0), dx, K);
  if (dw) gemm(true, false, N, K, M, dy, N, x, K, T(1), dw, K);   // dw[N,K] += dy^T[N,M] x[M,K]
}

template void matmul_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t,
                                    bool);
template void matmul_forward<double>(double*, const double*, const double*, int64_t, int64_t,
                                     int64_t, bool);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t, int64_t, int64_t, bool);
template void matmul_backward<double>(double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t, bool);

}  // namespace attnres::kernels::cpu
