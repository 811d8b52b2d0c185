// CUDA LM head + cross-entropy (see kernels/cross_entropy.h): h, w F32 or BF16,
// targets I32 on the device (ids checked there), dw F32 for BF16 weights;
// logits F32, or BF16 with BF16 h/w (the dispatcher checks the combination).
// Logits are produced and consumed in row chunks; no [N, V] probability buffer.
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels::cuda {
double lm_head_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, Tensor* dh,
                             Tensor* dw, double grad_scale, Store dh_store, DType logits);
}  // namespace attnres::kernels::cuda
