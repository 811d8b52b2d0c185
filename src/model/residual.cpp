// The residual bookkeeping around each sublayer (docs/model.md section 1):
// the baseline stream, or the AttnRes depth Mix in its two phases with the
// block partial sums, the input norm, and a sublayer's forward and backward
// through it. The sublayer functions themselves live in their own files.
#include "model/model.h"

#include <algorithm>

#include "kernels/matmul.h"
#include "kernels/mix.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"

namespace attnres::model {

namespace kern = attnres::kernels;

namespace {
// A sublayer's recent sources (or their gradients): those past the first
// `first` of the state's, then the partial sum when it exists.
template <typename State>
std::vector<Tensor> recent_of(const State& st, int64_t first) {
  std::vector<Tensor> r(st.sources.begin() + first, st.sources.end());
  if (st.partial.defined()) r.push_back(st.partial);
  return r;
}
}  // namespace

// ---------------------------------------------------------------------------
// One sublayer with its residual bookkeeping
// ---------------------------------------------------------------------------
//
// AttnRes (block size S; full = S 1). Sublayer s is position i = s mod S of
// its block. Its sources are the completed blocks, plus the partial sum p of
// the block's earlier outputs when i > 0. After f_s: p = y (i == 0) or
// p + y; when i == S-1 the block is complete and p becomes a new source.
//
// The Mix runs in two phases (kernels/mix.h) over groups of consecutive
// sublayers (ModelConfig::mix_group_size: the block, or for Full AttnRes
// groups of about sqrt(2L) sublayers). Before a group's first sublayer in a
// chunk (its leader), phase 1 mixes the sources that existed when the group
// started, for every query of the group in one pass; each sublayer with
// recent sources (added since its group started: the partial sum, or a Full
// group's earlier outputs) then merges them in. The split of a sublayer's
// sources depends only on the config, and phase 1's results per query do not
// depend on how many queries share the pass, so the results do not depend on
// where chunks are cut (see mix_forward).

void Model::mix_phase1_forward(int64_t s, Span<SublayerActs> g, const DepthState& st) const {
  std::vector<Tensor> ws;
  std::vector<bool> merging;
  for (size_t q = 0; q < g.size(); ++q) {
    ws.push_back(mix_query(s + static_cast<int64_t>(q)).value);
    merging.push_back(cfg_.recent_sources(s + static_cast<int64_t>(q)) > 0);  // all but maybe the leader
  }
  const int64_t k = cfg_.phase1_sources(s);
  ATTNRES_CHECK(static_cast<int64_t>(st.sources.size()) >= k, "sublayer ", s, ": ",
                st.sources.size(), " sources, phase 1 needs ", k);
  phase1_forward(g, ws, k, merging, st);
}

void Model::phase1_forward(Span<SublayerActs> g, Span<const Tensor> ws, int64_t k,
                           const std::vector<bool>& merging, const DepthState& st) const {
  const int64_t Q = static_cast<int64_t>(g.size());
  const int64_t N = st.sources.at(0).dim(0), d = cfg_.d_model;
  SublayerActs& leader = g[0];
  leader.group_size = Q;
  leader.mix_sources.assign(st.sources.begin(), st.sources.begin() + k);
  leader.mix_rstd.assign(st.source_rstd.begin(), st.source_rstd.begin() + k);
  leader.mix_probs = new_stat({Q, N, k});
  // Queries that merge read their lse, and their backward writes their row
  // of dlse (phase1_backward zeroes the others' rows).
  const bool merges = std::find(merging.begin(), merging.end(), true) != merging.end();
  Tensor lse;
  if (merges) {
    lse = new_stat({Q, N});
    leader.mix_dlse = new_stat({Q, N});
  }
  std::vector<Tensor> outs;
  for (int64_t q = 0; q < Q; ++q) {
    g[q].mix_o = new_act(N, d);
    outs.push_back(g[q].mix_o);
    if (merging[q]) {
      g[q].mix_lse = lse.rows(q, 1).reshape({N});
      g[q].mix_dlse_row = leader.mix_dlse.rows(q, 1).reshape({N});
    }
  }
  kern::mix_forward(outs, leader.mix_probs, merges ? &lse : nullptr, ws, leader.mix_sources,
                 leader.mix_rstd);
}

void Model::sublayers_forward(int64_t s0, int64_t s1, DepthState& st,
                              std::vector<SublayerActs>& subs, int64_t B, int64_t T,
                              DecodeCache* cache) const {
  const int64_t G = cfg_.mix_group_size();
  for (int64_t s = s0; s < s1;) {
    // The group: up to the end of s's Mix group or of the chunk.
    const int64_t end = cfg_.attnres() ? std::min((s / G + 1) * G, s1) : s + 1;
    if (cfg_.attnres() && !cfg_.one_pass_mix())
      mix_phase1_forward(s, Span<SublayerActs>(subs.data() + (s - s0), size_t(end - s)), st);
    for (; s < end; ++s) {
      sublayer_forward(s, st, subs[s - s0], B, T, cache);
      if (!cache) drop_recomputable(subs[s - s0]);
    }
  }
}

void Model::sublayer_forward(int64_t s, DepthState& st, SublayerActs& a, int64_t B, int64_t T,
                             DecodeCache* cache) const {
  const int64_t l = s / 2, N = B * T, d = cfg_.d_model;
  const bool is_attn = (s % 2 == 0);
  const float eps = static_cast<float>(cfg_.norm_eps);
  const int64_t S = cfg_.resolved_block_size();
  const int64_t i = cfg_.attnres() ? s % S : 0;

  // The sublayer's input x and u = RMSNorm(x; g): the stream (baseline), the
  // phase-1 output (AttnRes, no recent sources: phase 1 saw them all), or its
  // merge with the recent sources; or a residual variant's one-pass Mix.
  const int64_t m = cfg_.attnres() ? cfg_.recent_sources(s) : 0;
  if (cfg_.denseformer()) {
    // The layer's stream h' (MLP), X_0 = e (layer 0's attention), or the
    // depth-weighted average of X_0 .. X_l (layer l's attention).
    if (s % 2 == 1) {
      a.x = st.hidden;
    } else if (s == 0) {
      a.x = st.sources.at(0);
    } else {
      a.mix_sources = st.sources;
      one_pass_forward(a, mix_query(s));
    }
  } else if (cfg_.one_pass_mix()) {
    a.mix_sources = one_pass_sources(st);
    one_pass_forward(a, mix_query(s));
  } else if (m > 0) {
    a.mix_recent = recent_of(st, cfg_.phase1_sources(s));
    ATTNRES_CHECK(static_cast<int64_t>(a.mix_recent.size()) == m, "sublayer ", s, ": ",
                  a.mix_recent.size(), " recent sources, expected ", m);
  } else {
    a.x = cfg_.attnres() ? a.mix_o : st.hidden;
  }
  norm_forward(a, cfg_.attnres() ? &mix_query(s).value : nullptr, norm_gain(s).value);

  // f_s. Where y_s only ever enters a running sum (the baseline's stream
  // x_{s+1} = x_s + y_s, a block's partial p + y_s), f_s's last projection
  // adds it there itself (on the GPU in the GEMM's epilogue: no pass of its
  // own); the old sum stays saved (the stream as a.x, p as a Mix source).
  // (DenseFormer: the stream inside the layer, x + y.)
  const Tensor* sum_into = cfg_.denseformer() ? &a.x
                           : !cfg_.attnres()  ? &st.hidden
                                              : (i > 0 ? &st.partial : nullptr);
  Tensor out = new_act(N, d);
  if (is_attn) attention_forward(l, a, out, B, T, cache, sum_into);
  else mlp_forward(l, a, out, sum_into);
  if (depth_stats_) {
    // y_s itself; where it went straight into a sum, computed again on the
    // side (observing must not change what is computed)
    Tensor y = out;
    if (sum_into) {
      y = new_act(N, d);
      if (!is_attn && cfg_.moe_layer(l)) moe_output(l, a, y, nullptr);
      else kern::matmul_forward(y, out_proj_input(s, a), out_proj_of(s).value);
    }
    depth_stats_->output_sumsq.at(s) += kern::sum_squares(y);
    depth_stats_->output_count.at(s) += static_cast<double>(y.numel());
  }

  if (cfg_.denseformer()) {  // h' = x + y, or the layer's output X_{l+1} = h' + y: a source
    st.hidden = out;
    if (s % 2 == 1) {
      Tensor rstd = new_stat({N});
      kern::mix_source_rstd(rstd, out, eps);  // unread, but every source has one (depth_state.h)
      st.sources.push_back(out);
      st.source_rstd.push_back(rstd);
      st.hidden = Tensor();
    }
    return;
  }
  if (!cfg_.attnres()) {
    st.hidden = out;
    return;
  }
  st.partial = out;
  if (i == S - 1) {  // block complete: it becomes a source
    Tensor rstd = new_stat({N});
    kern::mix_source_rstd(rstd, st.partial, eps);
    st.sources.push_back(st.partial);
    st.source_rstd.push_back(rstd);
    st.partial = Tensor();
  }
}

void Model::sublayer_backward(int64_t s, SublayerActs& a, DepthGrad& g, const Activations& acts) {
  const int64_t l = s / 2, B = acts.B, T = acts.T;
  const bool is_attn = (s % 2 == 0);
  const int64_t S = cfg_.resolved_block_size();
  const int64_t i = cfg_.attnres() ? s % S : 0;

  Tensor dy;  // gradient of this sublayer's output y_s
  if (cfg_.denseformer()) {
    // The layer's output X_{l+1} = h' + y was the last source: its gradient
    // is the stream's (h''s and y's) from here down to the attention.
    if (s % 2 == 1) {
      ATTNRES_CHECK(!g.hidden.defined() && !g.sources.empty(), "sublayer ", s,
                    ": depth gradient out of step");
      g.hidden = g.sources.back();
      g.sources.pop_back();
    }
    dy = g.hidden;
  } else if (!cfg_.attnres()) {
    // x_{s+1} = x_s + y_s: dy = dx_{s+1}, and dx_s = dx_{s+1} + f_s'(dy).
    dy = g.hidden;
  } else {
    if (i == S - 1) {  // undo the push: the block's gradient is the partial's
      ATTNRES_CHECK(!g.partial.defined() && !g.sources.empty(), "sublayer ", s,
                    ": depth gradient out of step");
      g.partial = g.sources.back();
      g.sources.pop_back();
    }
    // p_after = p_before + y (or = y at i == 0): both receive dp_after.
    dy = g.partial;
    if (i == 0) g.partial = Tensor();
  }

  if (depth_stats_) {  // dL/dy_s, complete: every later sublayer is done
    depth_stats_->grad_sumsq.at(s) += kern::sum_squares(dy);
    depth_stats_->grad_count.at(s) += static_cast<double>(dy.numel());
  }

  // f_s backward: dy -> du (dy is fully consumed here, before the norm and
  // Mix backward below add into the same buffer: the stream's gradient, or
  // the partial's as d p_before).
  const Tensor du =
      is_attn ? attention_backward(l, a, dy, B, T) : mlp_backward(l, a, dy, acts.loss_scale);
  if (!cfg_.attnres()) {  // dx_s = dx_{s+1} + RMSNorm'(du), in place
    norm_backward(a, du, nullptr, norm_gain(s), {}, &g.hidden);
    if (cfg_.denseformer() && s % 2 == 0) {  // x = e, or the average of X_0 .. X_l
      if (a.mix_sources.empty()) {
        kern::add_(g.sources.at(0), g.hidden);
      } else {
        a.d_o = g.hidden;
        one_pass_backward(a, mix_query(s), Span<Tensor>(g.sources.data(), g.sources.size()));
      }
      g.hidden = Tensor();
    }
    return;
  }
  // The recent sources' gradients, as in the forward: sources past phase 1's,
  // then d p_before (the partial's, defined exactly when it merged).
  std::vector<Tensor> drecent;
  if (a.mix_stats.defined()) drecent = recent_of(g, cfg_.phase1_sources(s));
  norm_backward(a, du, &mix_query(s), norm_gain(s), drecent, nullptr);
  if (cfg_.one_pass_mix()) {  // g holds the state before s again: the sources s read
    std::vector<Tensor> dsources = one_pass_sources(g);
    one_pass_backward(a, mix_query(s), dsources);
  }
}

void Model::norm_forward(SublayerActs& a, const Tensor* w, const Tensor& gain) const {
  const float eps = static_cast<float>(cfg_.norm_eps);
  const bool merge = !a.mix_recent.empty();
  const int64_t N = (merge ? a.mix_o : a.x).dim(0), d = cfg_.d_model;
  a.u = new_act(N, d);
  if (merge) {  // one op: x is never stored
    const int64_t m = static_cast<int64_t>(a.mix_recent.size());
    a.mix_stats = new_stat({N, 2 * m + 2});
    kern::mix_merge_norm_forward(a.u, a.mix_stats, *w, a.mix_o, a.mix_lse, a.mix_recent, gain, eps);
    a.mix_lse = Tensor();  // read only here
  } else {
    a.norm_rstd = new_stat({N});
    kern::rmsnorm_forward(a.u, a.norm_rstd, a.x, &gain, eps);
  }
}

void Model::norm_backward(SublayerActs& a, const Tensor& du, Param* query, Param& gain,
                          Span<Tensor> drecent, Tensor* stream, kern::Store drecent_store) {
  if (stream) {
    kern::rmsnorm_backward(*stream, &gain.grad, du, a.x, a.norm_rstd, &gain.value);
    return;
  }
  a.d_o = new_act(du.dim(0), du.dim(1));
  if (!a.mix_stats.defined()) {  // x was the phase-1 output (or the head's stream) itself
    kern::rmsnorm_backward(a.d_o, &gain.grad, du, a.x, a.norm_rstd, &gain.value, kern::Store::Set);
    return;
  }
  // merge + norm backward: d o and dlse for the group's phase 1, recent sources +=
  ATTNRES_CHECK(drecent.size() == a.mix_recent.size(), drecent.size(),
                " recent source gradients for ", a.mix_recent.size(), " recent sources");
  kern::mix_merge_norm_backward(a.d_o, a.mix_dlse_row, drecent, query->grad, gain.grad, du,
                                query->value, a.mix_o, a.mix_recent, gain.value, a.mix_stats,
                                drecent_store);
}

void Model::mix_phase1_backward(int64_t s, Span<SublayerActs> g, DepthGrad& grad) {
  const int64_t S = cfg_.resolved_block_size();
  // The gradients of the sources before s (those of s's own block are back in
  // the partial's); phase 1 read the first mix_sources.size() of them.
  ATTNRES_CHECK(static_cast<int64_t>(grad.sources.size()) == 1 + s / S, "sublayer ", s, ": ",
                grad.sources.size(), " source gradients, expected ", 1 + s / S);
  std::vector<Param*> queries;
  for (size_t q = 0; q < g.size(); ++q) queries.push_back(&mix_query(s + static_cast<int64_t>(q)));
  phase1_backward(g, queries, grad);
}

void Model::phase1_backward(Span<SublayerActs> g, Span<Param* const> queries, DepthGrad& grad,
                            kern::Store sources_store) {
  SublayerActs& leader = g[0];
  std::vector<Tensor> dws, douts, ws;
  for (size_t q = 0; q < g.size(); ++q) {
    dws.push_back(queries[q]->grad);
    ws.push_back(queries[q]->value);
    douts.push_back(g[q].d_o);
    // A query that did not merge has no dlse (its backward wrote no row).
    if (leader.mix_dlse.defined() && !g[q].mix_dlse_row.defined())
      leader.mix_dlse.rows(static_cast<int64_t>(q), 1).zero_();
  }
  kern::mix_backward(Span<Tensor>(grad.sources.data(), leader.mix_sources.size()), dws, douts,
                  leader.mix_dlse.defined() ? &leader.mix_dlse : nullptr, ws, leader.mix_sources,
                  leader.mix_rstd, leader.mix_probs, sources_store);
}

}  // namespace attnres::model
