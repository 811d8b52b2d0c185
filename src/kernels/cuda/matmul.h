// CUDA linear layer through cuBLASLt (see kernels/matmul.h). fp32 accumulation
// always; F32 tensors use true fp32 (no TF32) so results match the CPU to ~1e-6.
// dw is F32 when x/w are BF16 (accumulated into by the GEMM epilogue, beta = 1).
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels::cuda {
void matmul_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* residual);
void matmul_backward(Tensor* dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                     Store dx_store);
}  // namespace attnres::kernels::cuda
