// CUDA SwiGLU (see kernels/swiglu.h).
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels::cuda {
void swiglu_forward(Tensor& h, const Tensor& gate, const Tensor& up);
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dh, const Tensor& gate,
                     const Tensor& up, Store store);
}  // namespace attnres::kernels::cuda
