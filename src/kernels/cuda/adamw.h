// CUDA AdamW (see kernels/adamw.h): p, g, m, v F32; p_lowp (optional) BF16
// receives the updated weights rounded to nearest even. Per-element math is
// math::adamw_element, shared with the CPU.
#pragma once
#include "core/tensor.h"

namespace attnres::kernels::cuda {
void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, double lr, double beta1,
                  double beta2, double eps, double decay_factor, double bc1, double bc2,
                  double grad_scale, Tensor* p_lowp);
}  // namespace attnres::kernels::cuda
