// Linear layer without bias: y = x W^T with W in [out, in] layout.
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// y [M, N] = x [M, K] W[N, K]^T (+ residual [M, N]). The residual may be y
// itself (accumulate) or another tensor: then on the GPU it is added in the
// GEMM's epilogue (read once, one rounding) instead of by a separate pass.
// On the CPU the product is rounded first and then added to, as by add_.
void matmul_forward(Tensor& y, const Tensor& x, const Tensor& w,
                    const Tensor* residual = nullptr);

// dx [M, K] += dy W (dx_store Set: dx = dy W); dw [N, K] += dy^T x. Either
// gradient may be nullptr. dx_residual (with Store::Set, a tensor other than
// dx): dx = dy W + dx_residual. On the GPU the GEMM's epilogue reads it (one
// rounding; a bf16 dx accumulated in place costs a pass more, see
// kernels/cuda/gemm.cu); on the CPU it is copied into dx and the product
// added onto it, the bits of Store::Add.
void matmul_backward(Tensor* dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                     Store dx_store = Store::Add, const Tensor* dx_residual = nullptr);

}  // namespace attnres::kernels
