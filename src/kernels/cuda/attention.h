// CUDA causal GQA attention (see kernels/attention.h): flash-style, online
// softmax, no T x T matrix in memory. qkv, out F32 or BF16; lse F32.
#pragma once
#include "core/tensor.h"
#include "kernels/attention.h"

namespace attnres::kernels::cuda {
// qkv [B*T, (H + 2 Hkv) hd]: q | k | v column blocks (kernels/attention.h), so
// q, k and v share the row stride (H + 2 Hkv) hd; out [B*T, H hd] contiguous.
void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttnShape& s);
// dqkv has qkv's layout; Store::Set writes its q, k and v blocks, Store::Add
// adds to all three. dout [B*T, H hd] contiguous, like out.
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const AttnShape& s, Store store);
// q, out [B, H hd] contiguous; caches [B, Tmax, Hkv hd] (not the joint layout).
void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t len, const AttnShape& s);

// Values of a width of their own (s.dv() != s.hd: MLA), which the tiled
// kernels above do not take; they call these (kernels/cuda/attention_values.cu:
// a block per query or key row, fp32, correctness first). Layouts as above
// with the values' blocks vd wide: qkv [B*T, (H + Hkv) hd + Hkv vd], out
// [B*T, H vd], v_cache [B, Tmax, Hkv vd].
void attention_forward_values(Tensor& out, Tensor& lse, const Tensor& qkv, const AttnShape& s);
void attention_backward_values(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                               const Tensor& out, const Tensor& lse, const AttnShape& s,
                               Store store);
void attention_decode_values(Tensor& out, const Tensor& q, const Tensor& k_cache,
                             const Tensor& v_cache, int64_t len, const AttnShape& s);
}  // namespace attnres::kernels::cuda
