#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "kernels/cpu/blas.h"

namespace attnres::kernels::cpu {

template <typename T>
void matmul_forward(T* y, const T* x, const T* w, int64_t M, int64_t N, int64_t K, bool accumulate,
                    int64_t ldy) {
  if (ldy == 0) ldy = N;
  if (M == 0 || N == 0) return;
  if (K == 0) {  // empty sum: y = 0 (or unchanged when accumulating)
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill_n(y + i * ldy, N, T(0));
    return;
  }
  // y[M,N] = x[M,K] * (w[N,K])^T
  gemm(false, true, M, N, K, T(1), x, K, w, K, accumulate ? T(1) : T(0), y, ldy);
}

template <typename T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx, int64_t ldy) {
  if (ldy == 0) ldy = N;
  // With M or K == 0 the gradients are empty tensors. With N == 0 they are
  // empty sums: += 0 does nothing, = 0 zeroes dx.
  if (M == 0 || K == 0) return;
  if (N == 0) {
    if (dx && !accumulate_dx) std::fill_n(dx, M * K, T(0));
    return;
  }
  // dx[M,K] (+)= dy[M,N] w[N,K];  dw[N,K] += dy^T[N,M] x[M,K]
  if (dx) gemm(false, false, M, K, N, T(1), dy, ldy, w, K, accumulate_dx ? T(1) : T(0), dx, K);
  if (dw) gemm(true, false, N, K, M, T(1), dy, ldy, x, K, T(1), dw, K);
}

template void matmul_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t,
                                    bool, int64_t);
template void matmul_forward<double>(double*, const double*, const double*, int64_t, int64_t,
                                     int64_t, bool, int64_t);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t, int64_t, int64_t, bool, int64_t);
template void matmul_backward<double>(double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t, bool, int64_t);

}  // namespace attnres::kernels::cpu
