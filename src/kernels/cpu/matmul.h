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

// dx [M, K] (+)= dy W alone, dy's rows ldy apart (a column block of a wider dy
// times the matching row block of W: kernels/matmul.h's w_row_blocks).
template <typename T>
void matmul_backward_dx(T* dx, const T* dy, int64_t ldy, const T* w, int64_t M, int64_t N,
                        int64_t K, bool accumulate);

}  // namespace attnres::kernels::cpu
