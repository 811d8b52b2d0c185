#include "model/config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/mix_rows.h"

namespace attnres::model {

const char* residual_mode_name(ResidualMode m) {
  switch (m) {
    case ResidualMode::Baseline: return "baseline";
    case ResidualMode::Full: return "full";
    case ResidualMode::Block: return "block";
    case ResidualMode::DenseFormer: return "denseformer";
  }
  return "?";
}

ResidualMode parse_residual_mode(const std::string& name, const std::string& where) {
  for (ResidualMode m : {ResidualMode::Baseline, ResidualMode::Full, ResidualMode::Block,
                         ResidualMode::DenseFormer})
    if (name == residual_mode_name(m)) return m;
  fail(where, ": unknown residual mode \"", name, "\" (expected baseline, full, block or denseformer)");
}

const char* mix_query_name(MixQuery q) { return q == MixQuery::Input ? "input" : "static"; }
const char* mix_weights_name(MixWeights w) {
  return w == MixWeights::Scalars ? "scalars" : "attention";
}
const char* mix_score_name(kernels::MixScore s) {
  return s == kernels::MixScore::Sigmoid ? "sigmoid" : "softmax";
}

kernels::MixForm ModelConfig::mix_form() const {
  kernels::MixForm f;
  if (denseformer()) {  // the depth-weighted average: its weights as they are
    f.logits = kernels::MixLogits::Weights;
    return f;
  }
  f.logits = variant.weights == MixWeights::Scalars ? kernels::MixLogits::Scalars
             : variant.query == MixQuery::Input     ? kernels::MixLogits::RowQueries
                                                    : kernels::MixLogits::Query;
  f.score = variant.score;
  f.key_norm = variant.key_norm;
  f.heads = variant.heads;
  return f;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Mix: return "mix";
    case Recompute::Layer: return "layer";
  }
  return "?";
}

const char* moe_balance_name(MoeBalance b) {
  switch (b) {
    case MoeBalance::AuxFree: return "aux_free";
    case MoeBalance::AuxLoss: return "aux_loss";
    case MoeBalance::None: return "none";
  }
  return "?";
}

int64_t ModelConfig::moe_capacity(int64_t N) const {
  if (!has_moe() || moe.capacity_factor <= 0) return 0;
  return static_cast<int64_t>(std::ceil(moe.capacity_factor * static_cast<double>(N) *
                                        static_cast<double>(moe.top_k) /
                                        static_cast<double>(moe.experts)));
}

int64_t ModelConfig::resolved_block_size() const {
  switch (mode) {
    case ResidualMode::Baseline:
    case ResidualMode::DenseFormer: return 0;
    case ResidualMode::Full: return 1;
    case ResidualMode::Block:
      if (block_size > 0) return block_size;
      return (n_sublayers() + n_blocks - 1) / n_blocks;
  }
  return 0;
}

int64_t ModelConfig::resolved_n_blocks() const {
  if (!attnres()) return 0;
  const int64_t S = resolved_block_size();
  return (n_sublayers() + S - 1) / S;
}

int64_t ModelConfig::mix_sources(int64_t s) const {
  if (!attnres()) return 0;
  const int64_t S = resolved_block_size();
  if (variant.window > 0) return 1 + std::min(s, variant.window);  // full mode only
  return 1 + s / S + (s % S > 0 ? 1 : 0);
}

int64_t ModelConfig::mix_group_size() const {
  if (!attnres()) return 0;
  const int64_t S = resolved_block_size();
  if (one_pass_mix()) return 1;
  if (S > 1) return S;
  int64_t G = 1;
  while (G * G < n_sublayers() && G < kernels::mix_rows::kMaxQueries) ++G;
  return G;
}

int64_t ModelConfig::phase1_sources(int64_t s) const {
  // What the group's first sublayer reads: groups start on block boundaries
  // (G = S, or S = 1), so it has no partial sum.
  if (one_pass_mix()) return mix_sources(s);
  const int64_t G = mix_group_size();
  return mix_sources(s / G * G);
}

int64_t ModelConfig::recent_sources(int64_t s) const {
  return mix_sources(s) - phase1_sources(s);
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) fail("config key ", key, ": must be a positive integer, got ", v);
  };
  positive(vocab_size, "model.vocab_size");
  positive(d_model, "model.d_model");
  positive(n_layers, "model.n_layers");
  positive(n_heads, "model.n_heads");
  positive(n_kv_heads, "model.n_kv_heads");
  positive(d_ff, "model.d_ff");
  if (vocab_size > 2147483647) fail("config key model.vocab_size: too large (", vocab_size, ")");
  // GQA's heads split d (MLA's widths are model.mla's own).
  if (!has_mla() && d_model % n_heads != 0)
    fail("config key model.n_heads: ", n_heads, " heads do not divide model.d_model = ", d_model);
  if (!has_mla() && head_dim() % 2 != 0)
    fail("config key model.n_heads: head dim d_model/n_heads = ", head_dim(),
         " must be even for RoPE");
  if (n_kv_heads > n_heads || n_heads % n_kv_heads != 0)
    fail("config key model.n_kv_heads: ", n_kv_heads,
         " must divide model.n_heads = ", n_heads, " (grouped-query attention)");
  if (!(norm_eps > 0)) fail("config key model.norm_eps: must be > 0, got ", norm_eps);
  if (!(rope_theta > 0)) fail("config key model.rope_theta: must be > 0, got ", rope_theta);
  if (mode == ResidualMode::Block) {
    if ((block_size > 0) == (n_blocks > 0))
      fail("config key model.residual: block mode needs exactly one of residual.block_size or "
           "residual.n_blocks (positive)");
    if (block_size > n_sublayers())
      fail("config key model.residual.block_size: ", block_size, " exceeds the ", n_sublayers(),
           " sublayers of ", n_layers, " layers");
    if (n_blocks > n_sublayers())
      fail("config key model.residual.n_blocks: ", n_blocks, " exceeds the ", n_sublayers(),
           " sublayers of ", n_layers, " layers");
  } else if (block_size > 0 || n_blocks > 0) {
    fail("config key model.residual: block_size / n_blocks only apply to residual.mode = "
         "\"block\" (mode is \"", residual_mode_name(mode), "\")");
  }
  validate_variant();
  if (has_moe()) {
    positive(moe.top_k, "model.moe.top_k");
    positive(moe.expert_d_ff, "model.moe.expert_d_ff");
    if (moe.top_k > moe.experts)
      fail("config key model.moe.top_k: ", moe.top_k, " exceeds the ", moe.experts,
           " routed experts (model.moe.experts)");
    if (moe.shared_experts < 0)
      fail("config key model.moe.shared_experts: must be >= 0, got ", moe.shared_experts);
    if (moe.dense_layers < 0 || moe.dense_layers >= n_layers)
      fail("config key model.moe.dense_layers: ", moe.dense_layers, " leaves no MoE layer of the ",
           n_layers, " layers (it must be in [0, model.n_layers))");
    if (!(moe.routed_scale > 0))
      fail("config key model.moe.routed_scale: must be > 0, got ", moe.routed_scale);
    if (!(moe.bias_rate >= 0)) fail("config key model.moe.bias_rate: must be >= 0, got ", moe.bias_rate);
    if (!(moe.aux_loss_coef >= 0))
      fail("config key model.moe.aux_loss_coef: must be >= 0, got ", moe.aux_loss_coef);
    if (!(moe.capacity_factor >= 0))
      fail("config key model.moe.capacity_factor: must be >= 0 (0: dropless), got ",
           moe.capacity_factor);
  } else if (moe.experts < 0) {
    fail("config key model.moe.experts: must be positive, got ", moe.experts);
  }
  if (has_kda()) {
    positive(kda.head_dim, "model.kda.head_dim");
    if (kda.conv_size < 1) fail("config key model.kda.conv_size: must be >= 1, got ", kda.conv_size);
    if (kda.full_attention_every != 0 && !kda.full_attention_layers.empty())
      fail("config key model.kda: full_attention_every and full_attention_layers exclude each "
           "other (give one)");
    if (kda.full_attention_every < 0)
      fail("config key model.kda.full_attention_every: must be >= 1, got ", kda.full_attention_every);
    std::vector<int64_t> seen;
    for (int64_t l : kda.full_attention_layers) {
      if (l < 1 || l > n_layers)
        fail("config key model.kda.full_attention_layers: layer ", l, " is outside 1..", n_layers,
             " (1-based, as Kimi's full_attn_layers)");
      if (std::find(seen.begin(), seen.end(), l) != seen.end())
        fail("config key model.kda.full_attention_layers: layer ", l, " is listed twice");
      seen.push_back(l);
    }
  } else if (kda.heads < 0) {
    fail("config key model.kda.heads: must be positive, got ", kda.heads);
  } else if (kda.head_dim != 0 || kda.full_attention_every != 0 || !kda.full_attention_layers.empty()) {
    fail("config key model.kda: the section needs heads (a positive number of KDA heads)");
  }
  if (has_mla()) {
    if (mla.qk_nope_head_dim < 0)
      fail("config key model.mla.qk_nope_head_dim: must be >= 0, got ", mla.qk_nope_head_dim);
    if (mla.qk_rope_head_dim < 0)
      fail("config key model.mla.qk_rope_head_dim: must be >= 0, got ", mla.qk_rope_head_dim);
    if (mla.qk_nope_head_dim + mla.qk_rope_head_dim < 1)
      fail("config key model.mla: qk_nope_head_dim + qk_rope_head_dim must be >= 1 (a head's "
           "key width), got ", mla.qk_nope_head_dim, " + ", mla.qk_rope_head_dim);
    positive(mla.v_head_dim, "model.mla.v_head_dim");
    if (mla.rope && (mla.qk_rope_head_dim < 2 || mla.qk_rope_head_dim % 2 != 0))
      fail("config key model.mla.qk_rope_head_dim: rope = true rotates these dims in pairs: it "
           "must be even and >= 2, got ", mla.qk_rope_head_dim);
  } else if (mla.kv_lora_rank < 0) {
    fail("config key model.mla.kv_lora_rank: must be positive, got ", mla.kv_lora_rank);
  } else if (mla.qk_nope_head_dim != 0 || mla.qk_rope_head_dim != 0 || mla.v_head_dim != 0 ||
             mla.rope) {
    fail("config key model.mla: the section needs kv_lora_rank (a positive latent width)");
  }
}

void ModelConfig::validate_variant() const {
  const ResidualVariant& v = variant;
  if (v.is_default()) return;
  if (!attnres())
    fail("config key model.residual: query, weights, score, key_norm, heads and window are "
         "variants of the AttnRes depth Mix; mode \"", residual_mode_name(mode),
         "\" has none (use mode \"full\" or \"block\")");
  if (v.heads < 1 || d_model % v.heads != 0)
    fail("config key model.residual.heads: ", v.heads, " heads must be >= 1 and divide "
         "model.d_model = ", d_model, " (each takes d / H contiguous channels)");
  if (v.window < 0) fail("config key model.residual.window: must be >= 0 (0: every source), got ",
                         v.window);
  if (v.window > 0 && mode != ResidualMode::Full)
    fail("config key model.residual.window: the depth window is Full AttnRes's (the embedding "
         "plus the W most recent sublayer outputs); mode is \"", residual_mode_name(mode), "\"");
  if (v.weights == MixWeights::Scalars &&
      (v.query != MixQuery::Static || v.score != kernels::MixScore::Softmax || !v.key_norm ||
       v.heads != 1))
    fail("config key model.residual.weights: \"scalars\" are softmax_j(s_l,j) of learnt "
         "scalars, with no query and no key: query, score, key_norm and heads must keep their "
         "defaults (static, softmax, true, 1)");
}

bool ModelConfig::kda_layer(int64_t l) const {
  if (!has_kda()) return false;
  const int64_t one_based = l + 1;
  if (!kda.full_attention_layers.empty())
    return std::find(kda.full_attention_layers.begin(), kda.full_attention_layers.end(),
                     one_based) == kda.full_attention_layers.end();
  const int64_t every = kda.full_attention_every > 0 ? kda.full_attention_every : 4;
  return one_based % every != 0 && one_based != n_layers;
}

}  // namespace attnres::model
