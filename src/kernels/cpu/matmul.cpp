#include "kernels/cpu/matmul.h"

#include <cstring>

#include "kernels/cpu/blas.h"

namespace attnres::kernels::cpu {

template <typename T>
void matmul_forward(T* y, const T* x, const T* w, int64_t M, int64_t N, int64_t K, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // empty sum: y = 0 (or unchanged when accumulating)
    if (!accumulate) std::memset(y, 0, sizeof(T) * M * N);
    return;
  }
  // y[M,N] = x[M,K] * (w[N,K])^T
  gemm(false, true, M, N, K, T(1), x, K, w, K, accumulate ? T(1) : T(0), y, N);
}

template <typename T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx) {
  // dx[M,K] (+)= dy[M,N] w[N,K];  dw[N,K] += dy^T[N,M] x[M,K]. With M or K
  // == 0 the gradients are empty tensors; with N == 0 empty sums (+= 0 does
  // nothing, = 0 zeroes dx).
  if (dx) matmul_backward_dx(dx, dy, N, w, M, N, K, accumulate_dx);
  if (dw && M > 0 && N > 0 && K > 0) gemm(true, false, N, K, M, T(1), dy, N, x, K, T(1), dw, K);
}

template <typename T>
void matmul_backward_dx(T* dx, const T* dy, int64_t ldy, const T* w, int64_t M, int64_t N,
                        int64_t K, bool accumulate) {
  if (M == 0 || K == 0) return;
  if (N == 0) {
    if (!accumulate) std::memset(dx, 0, sizeof(T) * M * K);
    return;
  }
  gemm(false, false, M, K, N, T(1), dy, ldy, w, K, accumulate ? T(1) : T(0), dx, K);
}

template void matmul_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t,
                                    bool);
template void matmul_forward<double>(double*, const double*, const double*, int64_t, int64_t,
                                     int64_t, bool);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t, int64_t, int64_t, bool);
template void matmul_backward<double>(double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t, bool);
template void matmul_backward_dx<float>(float*, const float*, int64_t, const float*, int64_t,
                                        int64_t, int64_t, bool);
template void matmul_backward_dx<double>(double*, const double*, int64_t, const double*, int64_t,
                                         int64_t, int64_t, bool);

}  // namespace attnres::kernels::cpu
