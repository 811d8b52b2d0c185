// SwiGLU activation: h = silu(gate) * up, silu(x) = x * sigmoid(x).
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

void swiglu_forward(Tensor& h, const Tensor& gate, const Tensor& up);  // all [N, F]

// dgate += dh * up * silu'(gate); dup += dh * silu(gate) (store Set: =).
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dh, const Tensor& gate,
                     const Tensor& up, Store store = Store::Add);

}  // namespace attnres::kernels
