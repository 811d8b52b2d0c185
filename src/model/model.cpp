// The model's frame: construction and its typed parameter handles, the
// embedding, chunks of layers (each sublayer through residual.cpp, its
// function in attention.cpp, mlp.cpp or moe.cpp), the whole model in one
// process and decoding. The head is head.cpp, scoring logprobs.cpp.
#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/common.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/mix.h"
#include "kernels/reduce.h"

namespace attnres::model {

namespace kern = attnres::kernels;

Model::Model(const ModelConfig& cfg, DType dtype, const ModelParts& parts, Device device)
    : cfg_(cfg),
      dtype_(dtype),
      device_(device),
      params_(make_params(cfg, dtype, parts, device)),
      state_(make_state(cfg, dtype, parts, device)),
      w_(resolve_params(params_, state_, cfg_, parts)) {
  cfg_.validate();
}

Tensor Model::new_act(int64_t rows, int64_t cols) const {
  return Tensor::empty({rows, cols}, dtype_, device_);
}
Tensor Model::zero_act(int64_t rows, int64_t cols) const {
  return Tensor::zeros({rows, cols}, dtype_, device_);
}
Tensor Model::new_stat(const Shape& shape) const {
  return Tensor::empty(shape, kern::stat_dtype(dtype_), device_);
}
Tensor Model::on_device(const Tensor& t) const {
  return t.device() == device_ ? t : t.to(device_);
}

const LayerParams& Model::layer(int64_t l) const {
  const int64_t i = l - w_.layer_begin;
  ATTNRES_CHECK(i >= 0 && i < static_cast<int64_t>(w_.layers.size()), "layer ", l,
                " is not in this model part");
  return w_.layers[static_cast<size_t>(i)];
}

// Sublayer s is layer s/2's attention (even s) or MLP (odd s).
Param& Model::out_proj_of(int64_t s) const {
  const LayerParams& L = layer(s / 2);
  if (s % 2 == 1) return *L.down;
  return cfg_.kda_layer(s / 2) ? *L.kda.o : cfg_.mla_layer(s / 2) ? *L.mla.o : *L.o;
}
const Tensor& Model::out_proj_input(int64_t s, const SublayerActs& a) const {
  if (s % 2 == 1) return a.h;
  return cfg_.kda_layer(s / 2) ? a.kda.gated : cfg_.mla_layer(s / 2) ? a.mla.att : a.att;
}
KdaDims Model::kda_dims() const {
  KdaDims d;
  d.H = cfg_.kda.heads, d.K = cfg_.kda.head_dim, d.conv = cfg_.kda.conv_size;
  d.norm_eps = cfg_.norm_eps;
  return d;
}
MlaDims Model::mla_dims() const {
  const MlaConfig& m = cfg_.mla;
  MlaDims d;
  d.H = cfg_.n_heads, d.r = m.kv_lora_rank, d.dn = m.qk_nope_head_dim, d.dr = m.qk_rope_head_dim;
  d.dv = m.v_head_dim;
  d.rope_theta = m.rope ? cfg_.rope_theta : 0.0;
  d.norm_eps = cfg_.norm_eps;
  return d;
}
Param& Model::norm_gain(int64_t s) const {
  return s % 2 == 0 ? *layer(s / 2).attn_norm : *layer(s / 2).mlp_norm;
}
Param& Model::mix_query(int64_t s) const {
  return s % 2 == 0 ? *layer(s / 2).attn_query : *layer(s / 2).mlp_query;
}

// ---------------------------------------------------------------------------
// Embedding
// ---------------------------------------------------------------------------

void Model::embed_forward(const Tensor& tokens, int64_t B, int64_t T, DepthState& st,
                          Activations& acts) const {
  ATTNRES_CHECK(tokens.numel() == B * T, "embed_forward: ", tokens.numel(), " tokens for B*T = ",
                B * T);
  acts.B = B;
  acts.T = T;
  acts.tokens = on_device(tokens);
  Tensor e = new_act(B * T, cfg_.d_model);
  kern::embedding_forward(e, w_.embedding->value, acts.tokens);
  st = DepthState{};
  if (cfg_.depth_sources()) {
    // b_0 = e (DenseFormer's X_0): the embedding is always a source of its own.
    Tensor rstd = new_stat({B * T});
    kern::mix_source_rstd(rstd, e, static_cast<float>(cfg_.norm_eps));
    st.sources.push_back(e);
    st.source_rstd.push_back(rstd);
  } else {
    st.hidden = e;
  }
}

void Model::embed_backward(const Activations& acts, DepthGrad& g) {
  const Tensor& de = cfg_.depth_sources() ? g.sources.at(0) : g.hidden;
  if (cfg_.depth_sources())
    ATTNRES_CHECK(g.sources.size() == 1 && !g.partial.defined(),
                  "embed_backward: depth gradient should hold only b_0, has ", g.sources.size());
  kern::embedding_backward(w_.embedding->grad, de, acts.tokens);
}

// ---------------------------------------------------------------------------
// Chunks of layers
// ---------------------------------------------------------------------------

void Model::layers_forward(int64_t l0, int64_t l1, DepthState& st, Activations& acts) const {
  acts.first_sublayer = 2 * l0;
  acts.sub.assign(static_cast<size_t>(2 * (l1 - l0)), SublayerActs{});
  sublayers_forward(2 * l0, 2 * l1, st, acts.sub, acts.B, acts.T);
}

void Model::layers_backward(int64_t l0, int64_t l1, Activations& acts, DepthGrad& g) {
  ATTNRES_CHECK(acts.first_sublayer == 2 * l0 && acts.sub.size() == size_t(2 * (l1 - l0)),
                "layers_backward: activations are for another layer range");
  const int64_t G = cfg_.mix_group_size();
  for (int64_t s = 2 * l1 - 1; s >= 2 * l0; --s) {
    SublayerActs& a = acts.sub[s - 2 * l0];
    if (recompute_ != Recompute::None) {
      // The leader of s's Mix group in this chunk (s itself for the baseline).
      const int64_t lead = cfg_.attnres() ? std::max(s / G * G, 2 * l0) : s;
      recompute_sublayer(s, a, acts.sub[lead - 2 * l0], acts.B, acts.T);
    }
    sublayer_backward(s, a, g, acts);
    if (cfg_.one_pass_mix() || cfg_.denseformer()) {  // its Mix's backward is done too: nothing is left to keep
      a = SublayerActs{};
      continue;
    }
    // Free as we go: the group's phase-1 backward (at its leader) needs only
    // the leader's record and every member's d_o and dlse row.
    SublayerActs rest;
    rest.group_size = a.group_size;
    rest.mix_sources = std::move(a.mix_sources);
    rest.mix_rstd = std::move(a.mix_rstd);
    rest.mix_probs = a.mix_probs;
    rest.mix_dlse = a.mix_dlse;
    rest.mix_dlse_row = a.mix_dlse_row;
    rest.d_o = a.d_o;
    a = std::move(rest);
    if (a.group_size > 0) {  // a group leader: its group is done
      Span<SublayerActs> group(&a, static_cast<size_t>(a.group_size));
      mix_phase1_backward(s, group, g);
      for (SublayerActs& m : group) m = SublayerActs{};
    }
  }
}
// ---------------------------------------------------------------------------
// Whole model
// ---------------------------------------------------------------------------

double Model::forward_backward(const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T,
                               double grad_scale) {
  DepthState st;
  Activations acts;
  embed_forward(tokens, B, T, st, acts);
  layers_forward(0, cfg_.n_layers, st, acts);
  DepthGrad g;
  double loss = head_forward_backward(st, targets, acts, g, grad_scale);
  acts.loss_scale = grad_scale;
  st = DepthState{};  // the activations keep what backward needs
  layers_backward(0, cfg_.n_layers, acts, g);
  embed_backward(acts, g);
  return loss;
}

double Model::forward_loss(const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T) {
  DepthState st;
  Activations acts;
  embed_forward(tokens, B, T, st, acts);
  layers_forward(0, cfg_.n_layers, st, acts);
  acts.sub.clear();
  return head_loss(st, targets, acts);
}

DecodeCache Model::new_decode_cache(int64_t max_len) const {
  DecodeCache c;
  c.max_len = max_len;
  const MlaDims m = mla_dims();
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    if (cfg_.kda_layer(l)) {
      c.k.emplace_back();
      c.v.emplace_back();
      c.kda.push_back(kda_new_cache(kda_dims(), dtype_, device_));
      continue;
    }
    c.kda.emplace_back();
    const bool mla = cfg_.mla_layer(l);
    const int64_t kw = mla ? m.H * (m.dn + m.dr) : cfg_.n_kv_heads * cfg_.head_dim();
    const int64_t vw = mla ? m.H * m.dv : cfg_.n_kv_heads * cfg_.head_dim();
    c.k.push_back(Tensor::zeros({1, max_len, kw}, dtype_, device_));
    c.v.push_back(Tensor::zeros({1, max_len, vw}, dtype_, device_));
  }
  return c;
}

std::vector<float> Model::decode_step(int32_t token, DecodeCache& cache) const {
  DepthState st;
  Activations acts;
  Tensor tok = Tensor::from_vector(std::vector<int32_t>{token}, {1});
  embed_forward(tok, 1, 1, st, acts);
  std::vector<SublayerActs> subs(static_cast<size_t>(cfg_.n_sublayers()));
  sublayers_forward(0, cfg_.n_sublayers(), st, subs, 1, 1, &cache);
  ++cache.pos;
  // Head without the loss: final Mix (or stream), norm, logits.
  const Tensor h = final_norm(st, acts);
  Tensor logits = new_act(1, cfg_.vocab_size);
  kern::matmul_forward(logits, h, w_.lm_head->value);
  Tensor l32 = logits.to(Device::CPU).to(DType::F32);
  return std::vector<float>(l32.data<float>(), l32.data<float>() + cfg_.vocab_size);
}

}  // namespace attnres::model
