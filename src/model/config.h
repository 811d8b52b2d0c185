// Model hyper-parameters (docs/model.md section 1) and their validation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mix_variant.h"
#include "kernels/moe.h"

namespace attnres::model {

// DenseFormer (Pagliardini et al. 2024; docs/model.md "DenseFormer"): the
// PreNorm stream inside each layer, and between layers a learnt weighted
// average of the embedding and every earlier layer's output.
enum class ResidualMode { Baseline, Full, Block, DenseFormer };
const char* residual_mode_name(ResidualMode m);  // "baseline" | "full" | "block" | "denseformer"
// The mode of that name; an error naming `where` (a key or flag) otherwise.
ResidualMode parse_residual_mode(const std::string& name, const std::string& where);

// What a chunk's forward keeps for its backward (training.recompute). The
// backward recomputes the rest just before each sublayer's own backward, with
// the same kernels on the same inputs, so losses and gradients are the same
// bit for bit in every mode; only memory and time differ.
//   None   keep everything.
//   Mix    keep the GEMM and attention outputs (q, k, v, attention output,
//          gate | up); recompute the cheap rest: the Mix's phase-1 output,
//          the merge + RMSNorm output u and its statistics, SwiGLU's h.
//   Layer  keep only each sublayer's input (the depth state it reads: the
//          sources and partial sums, or the baseline's stream, which the
//          model holds anyway) and the Mix's softmax weights; recompute the
//          sublayer's forward up to its last projection.
enum class Recompute { None, Mix, Layer };
const char* recompute_name(Recompute r);  // "none" | "mix" | "layer"

// The model.moe section (docs/model.md, "Mixture of experts"): without it
// (experts == 0) every MLP is dense. With it, layers from dense_layers on
// replace their MLP by a mixture of `experts` routed SwiGLU experts of width
// expert_d_ff, top_k of them per token, plus shared_experts always-on ones
// (together one SwiGLU of width shared_experts x expert_d_ff).
enum class MoeBalance { AuxFree, AuxLoss, None };
const char* moe_balance_name(MoeBalance b);  // "aux_free" | "aux_loss" | "none"
struct MoeConfig {
  int64_t experts = 0;  // E routed experts; 0: no MoE layers
  int64_t top_k = 0;
  int64_t shared_experts = 0;
  int64_t expert_d_ff = 0;
  kernels::MoeRouter router = kernels::MoeRouter::Sigmoid;
  double routed_scale = 1.0;
  MoeBalance balance = MoeBalance::AuxFree;
  double bias_rate = 1e-3;      // aux_free: the bias step after each optimizer step
  double aux_loss_coef = 1e-2;  // aux_loss: the balance term's weight
  int64_t dense_layers = 1;     // the first layers keep the dense MLP
  double capacity_factor = 0;   // 0: dropless
};

// Kimi Linear's hybrid (model.kda; docs/model.md "KDA layer"): the
// attention sublayer of most layers is KDA, a few keep softmax attention
// (full_attention_every: the 1-based layers l with l % every == 0, and the
// last; or the explicit 1-based full_attention_layers; neither: every 4).
struct KdaConfig {
  int64_t heads = 0;        // H; 0 (the section absent): every layer softmax attention
  int64_t head_dim = 0;     // K = V per head
  int64_t conv_size = 4;    // the short convolutions' width
  int64_t full_attention_every = 0;               // 0: unset
  std::vector<int64_t> full_attention_layers;     // 1-based; empty: unset
};

// The softmax layers as multi-head latent attention (model.mla; docs/model.md
// "MLA layer"), DeepSeek-V2's and Kimi Linear's: without it (kv_lora_rank
// 0) they are grouped-query attention with RoPE. Every layer is MLA when
// the model has no KDA layers.
struct MlaConfig {
  int64_t kv_lora_rank = 0;      // r, the latent width; 0: no MLA
  int64_t qk_nope_head_dim = 0;  // dn, a head's key and query dims without position
  int64_t qk_rope_head_dim = 0;  // dr, the dims of the key shared by the heads (k_r)
  int64_t v_head_dim = 0;        // dv, a head's value width
  bool rope = false;             // false: NoPE (Kimi Linear); true: RoPE on the dr dims
};

// The residual variants of the paper's ablations (model.residual's query,
// weights, score, key_norm, heads and window; docs/model.md "Residual
// variants"). The defaults are the AttnRes Mix of section 2; any other value
// makes every depth Mix one pass over its sources (kernels/mix_variant.h).
enum class MixQuery { Static, Input };        // w_l, or q_l = W_l v (v: the most recent source)
enum class MixWeights { Attention, Scalars };  // the query's softmax, or softmax_j(s_l,j)
const char* mix_query_name(MixQuery q);       // "static" | "input"
const char* mix_weights_name(MixWeights w);   // "attention" | "scalars"
const char* mix_score_name(kernels::MixScore s);  // "softmax" | "sigmoid"
struct ResidualVariant {
  MixQuery query = MixQuery::Static;
  MixWeights weights = MixWeights::Attention;
  kernels::MixScore score = kernels::MixScore::Softmax;
  bool key_norm = true;
  int64_t heads = 1;   // H: the channels in H groups, each its own key norm and softmax
  int64_t window = 0;  // W > 0 (full mode): the embedding plus the W most recent outputs
  bool is_default() const {
    return query == MixQuery::Static && weights == MixWeights::Attention &&
           score == kernels::MixScore::Softmax && key_norm && heads == 1 && window == 0;
  }
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t d_ff = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  ResidualMode mode = ResidualMode::Baseline;
  // Exactly one of block_size / n_blocks is set in `block` mode (0 = unset).
  int64_t block_size = 0;
  int64_t n_blocks = 0;
  std::string init_from;
  ResidualVariant variant;
  MoeConfig moe;
  KdaConfig kda;
  MlaConfig mla;

  int64_t head_dim() const { return d_model / n_heads; }
  int64_t n_sublayers() const { return 2 * n_layers; }
  // The AttnRes modes (Full and Block: a softmax Mix before every sublayer).
  bool attnres() const { return mode == ResidualMode::Full || mode == ResidualMode::Block; }
  bool denseformer() const { return mode == ResidualMode::DenseFormer; }
  // Whether the depth state between layers is a list of sources (AttnRes'
  // b_0 = e and the completed blocks; DenseFormer's X_0 = e and the layers'
  // outputs X_1 ..), rather than one stream: what the pipeline moves.
  bool depth_sources() const { return attnres() || denseformer(); }
  // Sublayers per block S: 1 for full, block_size or ceil(2L / n_blocks) for block.
  int64_t resolved_block_size() const;
  // Blocks the 2L sublayers form, the last one possibly partial: ceil(2L / S)
  // (0 for baseline).
  int64_t resolved_n_blocks() const;
  // Sources the depth Mix before sublayer s reads, s = n_sublayers() being
  // the final Mix: the embedding b_0, the s / S blocks completed before s,
  // and the partial sum of s's block when s is inside one (s % S > 0);
  // 0 for baseline. The one place this count is written: the FLOPs, the
  // planner's Mix traffic and the two-phase split below derive from it.
  // With a depth window W (variant.window): 1 + min(s, W).
  int64_t mix_sources(int64_t s) const;
  // Whether the depth Mix is a residual variant's (kernels/mix_variant.h): one
  // pass per Mix over all its sources, no two-phase groups (docs/model.md
  // "Residual variants" says why), and its kernel form.
  bool one_pass_mix() const { return attnres() && !variant.is_default(); }
  // The form of the one-pass Mix: a residual variant's, or DenseFormer's
  // depth-weighted average (MixLogits::Weights).
  kernels::MixForm mix_form() const;
  // Sublayers whose depth Mix shares one phase-1 pass (kernels/mix.h, "two-phase
  // form"), aligned from sublayer 0: Block AttnRes's block (S), and for Full
  // AttnRes (S = 1) groups of G = min(ceil(sqrt(2L)), 8) sublayers. A group of
  // G reads each older source once instead of G times, and each of its
  // sublayers also merges the up to G - 1 sources added inside the group: per
  // sublayer about s / G + G / 2 + 3 row passes instead of s + 4 (s = its
  // number of sources), least near G = sqrt(2L). At most 8 (only deeper
  // models than L = 32 reach it): the CUDA rows kernels take 8 queries a
  // launch and merge at most 8 recent sources (kernels/mix_rows.h), and a
  // group of 10 at L = 48 would read every older source twice per group,
  // 37% more passes than groups of 8 (docs/cuda.md). A computation choice:
  // the function is the same for any grouping, the rounding is not, so it is
  // fixed by the config rather than by where a pipeline chunk starts. 1
  // with a residual variant (one_pass_mix).
  int64_t mix_group_size() const;
  // AttnRes sublayer s's sources read by its Mix group's phase 1 (a prefix of
  // the depth state's sources), and its recent sources, merged in phase 2:
  // the completed blocks since the group started (Full only) and the partial
  // sum of s's block. With a residual variant: every source in phase 1 (the
  // one pass), none recent.
  int64_t phase1_sources(int64_t s) const;
  int64_t recent_sources(int64_t s) const;
  // Sources the final Mix sees: mix_sources(n_sublayers()).
  int64_t final_sources() const { return mix_sources(n_sublayers()); }

  // Mixture of experts: whether layer l's MLP is one (model.moe, from
  // dense_layers on), and the rows an expert takes of a microbatch of N
  // tokens: ceil(capacity_factor N top_k / experts), 0 without a limit.
  bool has_moe() const { return moe.experts > 0; }
  bool moe_layer(int64_t l) const { return has_moe() && l >= moe.dense_layers; }
  int64_t moe_capacity(int64_t N) const;

  // The hybrid: whether it is one (model.kda), and whether layer l (0-based)
  // has a KDA sublayer rather than softmax attention.
  bool has_kda() const { return kda.heads > 0; }
  bool kda_layer(int64_t l) const;
  // Whether the softmax layers are MLA (model.mla), and whether layer l is one.
  bool has_mla() const { return mla.kv_lora_rank > 0; }
  bool mla_layer(int64_t l) const { return has_mla() && !kda_layer(l); }

  // Throws attnres::Error naming the offending `model.*` key and the reason.
  void validate() const;

 private:
  void validate_variant() const;
};

}  // namespace attnres::model
