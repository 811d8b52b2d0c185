// RMSNorm over the last dim: y = x * rstd * g, rstd = 1/sqrt(mean(x^2) + eps).
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// x, y [N, d]; rstd [N] (saved for backward); gain [d] or nullptr (no gain).
void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor* gain, float eps);

// dx [N, d] += dL/dx (dx_store Set: dx = dL/dx); dgain [d] += dL/dgain (if
// both gain and dgain are given).
void rmsnorm_backward(Tensor& dx, Tensor* dgain, const Tensor& dy, const Tensor& x,
                      const Tensor& rstd, const Tensor* gain, Store dx_store = Store::Add);

}  // namespace attnres::kernels
