// CUDA SwiGLU (see kernels/swiglu.h).
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels::cuda {
void swiglu_forward(Tensor& h, const Tensor& gu);
void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, Store store);
}  // namespace attnres::kernels::cuda
