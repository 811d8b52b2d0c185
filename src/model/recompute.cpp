// Recomputation (training.recompute): what a sublayer's record drops after
// its forward, and how its backward gets it back.
#include "model/model.h"

#include "kernels/mix.h"

namespace attnres::model {

namespace kern = attnres::kernels;

// ---------------------------------------------------------------------------
// Recomputation (training.recompute)
// ---------------------------------------------------------------------------

void Model::drop_recomputable(SublayerActs& a) const {
  if (recompute_ == Recompute::None) return;
  // Kept in every mode: the sublayer's inputs (mix_recent, the baseline's
  // stream x), the group leader's phase-1 sources, weights and dlse buffer,
  // and this sublayer's row of it. The phase-1 output (x in AttnRes modes
  // without a merge) is recomputed.
  a.mix_o = Tensor();
  a.mix_lse = Tensor();
  const bool dwa = cfg_.denseformer() && !a.mix_sources.empty();  // a DenseFormer average
  if (cfg_.attnres() || dwa) a.x = Tensor();
  a.mix_stats = a.norm_rstd = a.u = Tensor();
  if (cfg_.one_pass_mix() || cfg_.denseformer()) a.mix_probs = a.mix_q = Tensor();  // one_pass_forward again
  a.h = a.moe_h = Tensor();
  if (recompute_ == Recompute::Layer) {
    a.qkv = a.att = a.lse = a.gu = a.moe_x = a.moe_gu = a.moe_y = Tensor();
    a.kda = KdaActs{};
    a.mla = MlaActs{};
  }
}

void Model::recompute_sublayer(int64_t s, SublayerActs& a, const SublayerActs& leader, int64_t B,
                               int64_t T) const {
  const int64_t N = B * T;
  if (cfg_.one_pass_mix() || (cfg_.denseformer() && !a.mix_sources.empty())) {  // its sources were kept
    one_pass_forward(a, mix_query(s));
  } else if (cfg_.attnres()) {
    // This query's phase 1 alone: its results are the same bits as in the
    // group's pass (kernels/mix.h); the group's weights were kept.
    const int64_t k = static_cast<int64_t>(leader.mix_sources.size());
    ATTNRES_CHECK(leader.group_size > 0 && k > 0, "sublayer ", s,
                  ": no phase-1 record to recompute from");
    Tensor probs = new_stat({1, N, k});
    Tensor lse;
    const bool merge = !a.mix_recent.empty();
    if (merge) lse = new_stat({1, N});
    a.mix_o = new_act(N, cfg_.d_model);
    kern::mix_forward(Span<Tensor>(&a.mix_o, 1), probs, merge ? &lse : nullptr,
                      Span<const Tensor>(&mix_query(s).value, 1), leader.mix_sources,
                      leader.mix_rstd);
    if (merge) a.mix_lse = lse.reshape({N});
    else a.x = a.mix_o;
  }
  norm_forward(a, cfg_.attnres() ? &mix_query(s).value : nullptr, norm_gain(s).value);
  if (s % 2 == 1) mlp_core(s / 2, a);
  else if (!out_proj_input(s, a).defined()) attention_core(s / 2, a, B, T, nullptr);
}

}  // namespace attnres::model
