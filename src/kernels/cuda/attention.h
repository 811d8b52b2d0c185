// CUDA causal GQA attention (see kernels/attention.h): flash-style, online
// softmax, no T x T matrix in memory. q, k, v, out F32 or BF16; lse F32.
#pragma once
#include "core/tensor.h"
#include "kernels/attention.h"

namespace attnres::kernels::cuda {
void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttnShape& s);
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttnShape& s, Store store);
void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t len, const AttnShape& s);
}  // namespace attnres::kernels::cuda
