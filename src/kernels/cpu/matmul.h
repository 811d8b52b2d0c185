// CPU linear layer on OpenBLAS: y = x W^T with W in [out, in] layout.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// y [M, N] (+)= x [M, K] W[N, K]^T
template <typename T>
void matmul_forward(T* y, const T* x, const T* w, int64_t M, int64_t N, int64_t K, bool accumulate);

// dx [M, K] += dy W ; dw [N, K] += dy^T x. Either may be nullptr.
template <typename T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx = true);

}  // namespace attnres::kernels::cpu
