// LM head fused with softmax cross-entropy: logits = h W^T are produced and
// consumed in row chunks, so the [N, V] probability matrix never exists whole.
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// h [N, d], w [V, d], targets I32 [N]. Returns sum_n -log softmax(h_n W^T)[t_n]
// (accumulated in double). If dh / dw are non-null, also accumulates the
// gradient of grad_scale * (that sum): dh += grad_scale * (p - onehot) W
// (dh_store Set: dh =), dw += grad_scale * (p - onehot)^T h. Throws if a
// target is outside [0, V).
//
// logits: the dtype the logits are stored in between the LM-head GEMM and the
// softmax. F32: as computed (the CPU's F64 path keeps F64). BF16 (CUDA, BF16
// h and w only): the GEMM rounds its fp32 sums to bf16, and so are the
// dlogits the gradient GEMMs read; max, log-sum-exp and loss are still fp32
// (double for the sums) from the rounded values, so a logit near 30 is off by
// up to 0.06 (half a bf16 ulp), which moves the loss and the softmax.
double lm_head_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, Tensor* dh,
                             Tensor* dw, double grad_scale, Store dh_store = Store::Add,
                             DType logits = DType::F32);

}  // namespace attnres::kernels
