// Linear layer without bias: y = x W^T with W in [out, in] layout.
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// y [M, N] = x [M, K] W[N, K]^T  (accumulate: y += ...)
void matmul_forward(Tensor& y, const Tensor& x, const Tensor& w, bool accumulate = false);

// dx [M, K] += dy W (dx_store Set: dx = dy W); dw [N, K] += dy^T x. Either
// gradient may be nullptr.
void matmul_backward(Tensor* dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                     Store dx_store = Store::Add);

}  // namespace attnres::kernels
