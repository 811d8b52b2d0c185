// Multi-head latent attention's key/value expansion (model/mla_layer.h,
// docs/model.md "MLA layer"): the step between MLA's projections and our
// softmax attention. A head's query is [q_n (dn) | q_r (dr)], its key
// [k_n,h (dn) | k_r (dr)] with k_r shared by every head, its value v_h
// (dv): the layout kernels/attention.h reads, with H KV heads (one per
// query head), key width dn + dr and value width dv.
//
// The op is linear, so its backward is its transpose: the q and kv blocks
// are copied back, and k_r's gradient is the sum of the H heads' k_r
// gradients (in head order: the same bits for any thread count).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/attention.h"

namespace attnres::kernels {

struct MlaShape {
  int64_t B, T, H, dn, dr, dv;
  int64_t dqk() const { return dn + dr; }
  // The attention over the expanded heads: H query and H KV heads.
  AttnShape attn() const { return {B, T, H, H, dqk(), dv}; }
};

// qkv [B*T, qkv_width(s.attn())] from q [B*T, H (dn + dr)] (per head q_n |
// q_r), kv [B*T, H (dn + dv)] (per head k_n | v) and kr [B*T, dr]. With
// rope_theta > 0, the dr dims of every query and of k_r are rotated by our
// RoPE (kernels/rope.h, width dr) at position pos0 + t; 0: no rotation
// (NoPE).
void mla_expand_forward(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& kr,
                        const MlaShape& s, double rope_theta, int64_t pos0 = 0);

// The transpose: dq, dkv, dkr written (their shapes as q, kv, kr) from dqkv.
void mla_expand_backward(Tensor& dq, Tensor& dkv, Tensor& dkr, const Tensor& dqkv,
                         const MlaShape& s, double rope_theta, int64_t pos0 = 0);

}  // namespace attnres::kernels
