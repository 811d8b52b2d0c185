#include "model/flops.h"

namespace attnres::model {

double matmul_params(const ModelConfig& c, const ModelParts& parts) {
  // The GEMM weights of param_shapes: the layers' projections and the output
  // projection (the LM head, or the embedding when tied: it is the head too).
  // A MoE layer's router and shared experts meet every token, its routed
  // experts top_k of E tokens on average: activated parameters.
  double n = 0, experts = 0;
  for (const auto& p : param_shapes(c, parts))
    switch (p.slot) {
      case Slot::Q: case Slot::K: case Slot::V: case Slot::O:
      case Slot::Gate: case Slot::Up: case Slot::Down: case Slot::LmHead:
      case Slot::Router: case Slot::SharedGate: case Slot::SharedUp: case Slot::SharedDown:
      case Slot::KdaQ: case Slot::KdaK: case Slot::KdaV: case Slot::KdaFA: case Slot::KdaFB:
      case Slot::KdaB: case Slot::KdaGA: case Slot::KdaGB: case Slot::KdaO:
      case Slot::MlaQ: case Slot::MlaKvA: case Slot::MlaKvB: case Slot::MlaO:
        n += static_cast<double>(p.numel());
        break;
      case Slot::ExpertGate: case Slot::ExpertUp: case Slot::ExpertDown:
        experts += static_cast<double>(p.numel());
        break;
      case Slot::Embedding:
        if (c.tie_embeddings && parts.head) n += static_cast<double>(p.numel());
        break;
      default:
        break;
    }
  if (c.has_moe()) n += experts * static_cast<double>(c.moe.top_k) / static_cast<double>(c.moe.experts);
  return n;
}

double kda_core_flops_per_token(const ModelConfig& c) {
  // The chunkwise core over chunks of C = 64 (kernels/kda.h): per token and
  // head Kb S_0, Qb S_0 and the state's Ke^T U (2 K V each), P U (2 C V), A
  // and P (2 C K), the substitution (C V); and the three convolutions (2 W
  // a channel each).
  const double H = static_cast<double>(c.kda.heads), K = static_cast<double>(c.kda.head_dim);
  const double C = 64, W = static_cast<double>(c.kda.conv_size);
  return H * (6 * K * K + 3 * C * K + 2 * C * K) + 3 * 2 * W * H * K;
}

double forward_flops_per_token(const ModelConfig& c, int64_t T, const ModelParts& parts) {
  const int64_t end = parts.layer_end < 0 ? c.n_layers : parts.layer_end;
  // Softmax attention's QK^T and PV, causal (half of 2 T each): T H (hd +
  // hd) = 2 T d a GQA layer, T H (dn + dr + dv) an MLA layer; a KDA layer's
  // core instead (kda_core_flops_per_token).
  const double Td = static_cast<double>(T);
  const double mla = Td * static_cast<double>(c.n_heads) *
                     static_cast<double>(c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim +
                                         c.mla.v_head_dim);
  double f = 2 * matmul_params(c, parts);
  for (int64_t l = parts.layer_begin; l < end; ++l)
    f += c.kda_layer(l)   ? kda_core_flops_per_token(c)
         : c.mla_layer(l) ? mla
                          : 2.0 * Td * static_cast<double>(c.d_model);
  return f;
}

double training_flops_per_token(const ModelConfig& c, int64_t T) {
  // Every term is a whole number below 2^53, so the sums are exact.
  double f = 3 * forward_flops_per_token(c, T);
  if (c.denseformer()) {
    // The depth-weighted average before layer l >= 1 and the head's: l + 1
    // sources, a weighted add each, 2 d forward and 6 d with the backward.
    double sources = 0;
    for (int64_t l = 1; l <= c.n_layers; ++l) sources += static_cast<double>(l + 1);
    f += 6.0 * sources * c.d_model;
  }
  if (c.attnres()) {
    // Each Mix: k sources x (dot + weighted sum) = 4 k d forward, ~3x with
    // backward; scalar weights have no dot (2 k d forward, 6 k d in all).
    // Heads split the same dots, a window reads fewer sources (mix_sources).
    double sources = 0;
    for (int64_t s = 0; s <= c.n_sublayers(); ++s) sources += c.mix_sources(s);  // + the final Mix
    const bool scalars = c.variant.weights == MixWeights::Scalars;
    f += (scalars ? 6.0 : 12.0) * sources * c.d_model;
    // An input query's q = W v per Mix: a d x d GEMM, 2 d^2 forward, 6 d^2 in all.
    if (c.variant.query == MixQuery::Input && !scalars)
      f += 6.0 * static_cast<double>(c.n_sublayers() + 1) * c.d_model * c.d_model;
  }
  return f;
}

}  // namespace attnres::model
