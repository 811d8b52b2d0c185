// One MLA sublayer (multi-head latent attention, docs/model.md "MLA
// layer"; DeepSeek-V2's, as Kimi Linear's softmax layers), from the
// sublayer's normed input u [N, d] to its output y [N, d]:
//   q = u W_q^T, per head [q_n (dn) | q_r (dr)];
//   [c_kv (r) | k_r (dr)] = u W_kva^T (kv_a_proj_with_mqa), two GEMMs over
//     the weight's two row blocks, so each output is a tensor of its own;
//   [k_n | v] per head = RMSNorm_r(c_kv; kv_a_layernorm) W_kvb^T;
//   head h's key [k_n,h | k_r] (k_r shared by the heads), RoPE on the dr
//   dims when model.mla.rope (kernels/mla.h), causal softmax attention with
//   scale 1/sqrt(dn + dr) and values of width dv (kernels/attention.h), o_proj.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/mla.h"
#include "model/params.h"

namespace attnres::model {

struct MlaDims {
  int64_t H = 0, r = 0, dn = 0, dr = 0, dv = 0;
  double rope_theta = 0;   // 0: NoPE; else model.rope_theta (model.mla.rope)
  double norm_eps = 1e-5;  // the latent norm's (model.norm_eps)
  kernels::MlaShape shape(int64_t B, int64_t T) const { return {B, T, H, dn, dr, dv}; }
};

// The layer's tensors, Kimi Linear's names (self_attn.*) beside each; the
// same struct holds their gradients.
struct MlaWeights {
  Tensor q;        // q_proj [H (dn + dr), d]
  Tensor kv_a;     // kv_a_proj_with_mqa [r + dr, d]: c_kv's rows, then k_r's
  Tensor kv_norm;  // kv_a_layernorm [r]
  Tensor kv_b;     // kv_b_proj [H (dn + dv), r]
  Tensor o;        // o_proj [d, H dv]
};

// What the forward keeps for the backward: the latent before and after its
// norm (with the norm's statistics), the attention's joint q | k | v (its
// keys expanded per head), its output and log-sum-exp.
struct MlaActs {
  Tensor ckv, ckv_rstd, cn;  // [N, r], [N], [N, r]
  Tensor qkv, att, lse;      // kernels/attention.h with H KV heads, hd = dn + dr, vd = dv
};

// Incremental decoding (B = T = 1): the keys and values of the tokens so
// far, expanded per head as attention reads them.
struct MlaCache {
  Tensor k, v;  // [1, max_len, H (dn + dr)], [1, max_len, H dv]
  int64_t pos = 0, max_len = 0;
};

// The layer's tensors of a model's MlaParams: each parameter's `of`
// (&Param::value or &Param::grad).
MlaWeights mla_weights(const MlaParams& p, Tensor Param::*of);

// Everything up to o_proj's input (a.att): what recomputation redoes. With
// a cache, one token at position cache->pos, its key and value appended.
void mla_layer_core(MlaActs& a, const Tensor& u, const MlaWeights& w, const MlaDims& d, int64_t B,
                    int64_t T, MlaCache* cache = nullptr);

// du (written) from dy = dL/dy; the weights' gradients added into `grad`.
void mla_layer_backward(Tensor& du, MlaWeights& grad, const MlaActs& a, const Tensor& u,
                        const Tensor& dy, const MlaWeights& w, const MlaDims& d, int64_t B,
                        int64_t T);

}  // namespace attnres::model
