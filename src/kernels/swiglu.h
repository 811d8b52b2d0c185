// SwiGLU activation: h = silu(gate) * up, silu(x) = x * sigmoid(x).
#pragma once
#include "core/tensor.h"

namespace attnres::kernels {

void swiglu_forward(Tensor& h, const Tensor& gate, const Tensor& up);  // all [N, F]

// dgate += dh * up * silu'(gate); dup += dh * silu(gate).
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dh, const Tensor& gate,
                     const Tensor& up);

}  // namespace attnres::kernels
