// CPU linear layer on OpenBLAS: y = x W^T with W in [out, in] layout.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// y and dy are [M, N] with rows ldy elements apart (0: N), so that a call can
// work on a column block of a wider y (kernels/matmul.h's w_row_blocks).

// y [M, N] (+)= x [M, K] W[N, K]^T
template <typename T>
void matmul_forward(T* y, const T* x, const T* w, int64_t M, int64_t N, int64_t K, bool accumulate,
                    int64_t ldy = 0);

// dx [M, K] (+)= dy W ; dw [N, K] += dy^T x. Either may be nullptr.
template <typename T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx = true, int64_t ldy = 0);

}  // namespace attnres::kernels::cpu
