// CUDA RMSNorm (see kernels/rmsnorm.h): x, y, gain F32 or BF16; rstd F32;
// dgain F32 for BF16 weights, reduced over rows in a fixed order.
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels::cuda {
void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor* gain, float eps);
void rmsnorm_backward(Tensor& dx, Tensor* dgain, const Tensor& dy, const Tensor& x,
                      const Tensor& rstd, const Tensor* gain, Store dx_store);
}  // namespace attnres::kernels::cuda
