// Helpers shared by the tests that build small models (model, train, gpu,
// mpi): a tiny configuration, random parameters away from their
// initialisation, and the parameters as the literal reference (reference.h)
// reads them.
#pragma once
#include <string>

#include "model/config.h"
#include "model/model.h"
#include "model/params.h"
#include "model/reference.h"
#include "testing.h"

namespace attnres::testing {

// A configuration with a name for SECTIONs.
struct NamedConfig {
  const char* name;
  model::ModelConfig cfg;
};

// `c` with these widths (vocabulary, d_model, heads, KV heads, d_ff), validated.
inline model::ModelConfig resized(model::ModelConfig c, int64_t vocab, int64_t d, int64_t heads,
                                  int64_t kv_heads, int64_t d_ff) {
  c.vocab_size = vocab;
  c.d_model = d;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.d_ff = d_ff;
  c.validate();
  return c;
}

inline model::ModelConfig tiny(model::ResidualMode mode, int64_t block_size = 0,
                               int64_t n_blocks = 0, bool tie = false, int64_t layers = 2) {
  model::ModelConfig c;
  c.n_layers = layers;
  c.tie_embeddings = tie;
  c.mode = mode;
  c.block_size = block_size;
  c.n_blocks = n_blocks;
  return resized(c, 11, 8, 2, 1, 12);
}

// `c` with a model.moe section: `experts` routed experts of width 6, top_k of
// them, `shared` shared experts, MoE layers from dense_layers on; the rest
// of the section at its defaults unless changed after.
inline model::ModelConfig with_moe(model::ModelConfig c, int64_t experts, int64_t top_k,
                                   int64_t shared, int64_t dense_layers = 1,
                                   kernels::MoeRouter router = kernels::MoeRouter::Sigmoid,
                                   model::MoeBalance balance = model::MoeBalance::AuxFree) {
  c.moe.experts = experts;
  c.moe.top_k = top_k;
  c.moe.shared_experts = shared;
  c.moe.expert_d_ff = 6;
  c.moe.dense_layers = dense_layers;
  c.moe.router = router;
  c.moe.balance = balance;
  c.validate();
  return c;
}

// `c` as a Kimi Linear hybrid (model.kda): `heads` KDA heads of head_dim,
// convolutions of width conv, softmax attention every `every` layers (and
// the last).
inline model::ModelConfig with_kda(model::ModelConfig c, int64_t heads, int64_t head_dim,
                                   int64_t conv = 3, int64_t every = 0) {
  c.kda.heads = heads;
  c.kda.head_dim = head_dim;
  c.kda.conv_size = conv;
  c.kda.full_attention_every = every;
  c.validate();
  return c;
}

// The softmax layers as MLA (model.mla): r, dn, dr, dv, rope.
inline model::ModelConfig with_mla(model::ModelConfig c, int64_t r, int64_t dn, int64_t dr,
                                   int64_t dv, bool rope = false) {
  c.mla.kv_lora_rank = r;
  c.mla.qk_nope_head_dim = dn;
  c.mla.qk_rope_head_dim = dr;
  c.mla.v_head_dim = dv;
  c.mla.rope = rope;
  c.validate();
  return c;
}

// `c` with a residual variant (model.residual's query ... window), validated.
inline model::ModelConfig with_variant(model::ModelConfig c, model::ResidualVariant v) {
  c.variant = v;
  c.validate();
  return c;
}
inline model::ResidualVariant variant(model::MixQuery q, model::MixWeights w = model::MixWeights::Attention,
                                      kernels::MixScore s = kernels::MixScore::Softmax,
                                      bool key_norm = true, int64_t heads = 1, int64_t window = 0) {
  model::ResidualVariant v;
  v.query = q, v.weights = w, v.score = s, v.key_norm = key_norm, v.heads = heads, v.window = window;
  return v;
}

// Random parameters everywhere (queries and gains too, so every Mix and norm
// is exercised away from its zero/one initialisation).
inline void randomize(model::ParamTable& t, uint64_t seed) {
  uint64_t i = 0;
  for (auto& p : t.all()) {
    // An input query's W_l [d, d] meets unnormalised sources: at 0.5 its
    // logits reach tens and the loss curves so much that finite differences
    // at h = 3e-5 err by 1e-3 of the gradient (falling as h^2).
    const bool input_query = p.name.find("query_proj") != std::string::npos;
    fill_normal(p.value, seed + i++, input_query ? 0.1 : 0.5);
    if (p.value.ndim() == 1 && p.name.find("layernorm") != std::string::npos)
      for (int64_t j = 0; j < p.value.numel(); ++j) set(p.value, j, 1.0 + 0.3 * at(p.value, j));
  }
}

// A model of cfg in dtype with random parameters (randomize(seed)), and
// random model state (a MoE router's bias: the choice away from the scores').
inline model::Model random_model(const model::ModelConfig& cfg, DType dtype, uint64_t seed) {
  model::Model m(cfg, dtype);
  randomize(m.params(), seed);
  randomize(m.state(), seed + 1000);
  return m;
}

// B sequences of T random token ids below vocab and their targets (seeds seed
// and seed + 1), as Model::forward_loss and forward_backward take them.
struct Microbatch {
  int64_t B, T;
  Tensor tokens, targets;
};
inline Microbatch random_microbatch(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  return {B, T, random_tokens(B * T, vocab, seed), random_tokens(B * T, vocab, seed + 1)};
}

inline reference::ParamFn param_fn(const model::ParamTable& t) {
  return [&t](const std::string& name) {
    Tensor v = t.get(name).value.to(DType::F64);
    return reference::Vec(v.data<double>(), v.data<double>() + v.numel());
  };
}
// A model's parameters and its state.
inline reference::ParamFn param_fn(const model::Model& m) {
  return [&m](const std::string& name) {
    const model::ParamTable& t = m.state().contains(name) ? m.state() : m.params();
    Tensor v = t.get(name).value.to(DType::F64);
    return reference::Vec(v.data<double>(), v.data<double>() + v.numel());
  };
}

}  // namespace attnres::testing
