// AttnRes depth Mix: the softmax over depth sources that replaces the residual
// stream (docs/model.md section 2). For each token row n:
//
//   logit_j = w . (v_j[n] * rstd_j[n])        keys are RMS-normalised, no gain
//   a_j     = softmax_j(logit_j)              statistics and sums in fp32 (or wider)
//   out[n]  = sum_j a_j v_j[n]
//
// rstd_j[n] = 1/sqrt(mean(v_j[n]^2) + eps). A completed block is a source of
// many sublayers, so its rstd is computed once (mix_source_rstd) and passed to
// phase 1; the merge (phase 2) computes its recent sources' rstd from the rows
// it reads anyway.
//
// The two-phase form (paper section 4.2) computes a sublayer's Mix in two
// steps over a split of its sources that is fixed by the sublayer's "Mix
// group" (model/config.h, mix_group_size): Block AttnRes's block, or for Full
// AttnRes groups of consecutive sublayers.
//   phase 1: one pass over the sources that existed when the group started,
//            for the queries of all the group's sublayers at once
//            (mix_forward with Q queries), giving each query its output o and
//            the log-sum-exp lse of its logits over those sources;
//   phase 2: per sublayer, a merge with the m >= 1 sources added since (the
//            "recent" sources: Block AttnRes's partial sum of the block, or
//            the outputs of a Full AttnRes group's earlier sublayers):
//            with z_j = w . (e_j rstd_j),
//              (a_0, a_1, ..., a_m) = softmax(lse, z_1, ..., z_m),
//              x = a_0 o + sum_j a_j e_j,
//            exactly the softmax over all the sources (an online-softmax merge,
//            mix_merge_norm_forward).
// So a source is read once per group of sublayers instead of once per
// sublayer. A sublayer with no recent source (the first of its group) uses
// the phase-1 output as is.
#pragma once
#include "core/span.h"
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// rstd [N] of a source v [N, d].
void mix_source_rstd(Tensor& rstd, const Tensor& v, float eps);

// ---- phase 1: Q queries over the same k sources ----------------------------------
// outs: Q tensors [N, d], out_i = Mix of query ws[i] [d]; probs [Q, N, k]
// (softmax weights, saved for backward); lse [Q, N] (log-sum-exp of each
// query's logits, for a merge) or nullptr. sources: k tensors [N, d]; rstds: k
// tensors [N]. k >= 1, Q >= 1. Each query's results are the same, bit for bit,
// whatever other queries share the call.
void mix_forward(Span<Tensor> outs, Tensor& probs, Tensor* lse, Span<const Tensor> ws,
                 Span<const Tensor> sources, Span<const Tensor> rstds);

// dsources[j] += dL/dv_j (including the path through rstd_j), dws[i] +=
// dL/dw_i, from douts[i] = dL/dout_i and, when given, dlse [Q, N] = dL/dlse.
// The queries' contributions to a source are added in descending query order,
// so a group split over two calls (later queries first) adds the same terms
// in the same order (bit-identical on the CPU). With Store::Set (the first
// backward to reach the sources: the final Mix) dsources[j] = dL/dv_j
// instead, their old contents never read (kernels/store.h); they must then
// be distinct tensors.
void mix_backward(Span<Tensor> dsources, Span<Tensor> dws, Span<const Tensor> douts,
                  const Tensor* dlse, Span<const Tensor> ws, Span<const Tensor> sources,
                  Span<const Tensor> rstds, const Tensor& probs, Store store = Store::Add);

// One query (the Q = 1 case, with probs [N, k]): out [N, d], w [d].
void mix_forward(Tensor& out, Tensor& probs, const Tensor& w, Span<const Tensor> sources,
                 Span<const Tensor> rstds);
void mix_backward(Span<Tensor> dsources, Tensor& dw, const Tensor& dout, const Tensor& w,
                  Span<const Tensor> sources, Span<const Tensor> rstds, const Tensor& probs,
                  Store store = Store::Add);

// ---- phase 2: merge with the recent sources, fused with the RMSNorm after it ----
// The merged input x (above; o [N, d] and lse [N] from phase 1, recent
// sources e_1..e_m [N, d], their rstd computed here) is only ever read by the
// sublayer's RMSNorm, so the op returns u [N, d] = RMSNorm(x; gain) directly
// and x is never stored (the backward recomputes it). One eps for both norms.
// stats [N, 2m + 2] saves per row {a_0, ..., a_m, rstd_1, ..., rstd_m, rstd_x}.
void mix_merge_norm_forward(Tensor& u, Tensor& stats, const Tensor& w, const Tensor& o,
                            const Tensor& lse, Span<const Tensor> recent, const Tensor& gain,
                            float eps);

// From du = dL/du: d_o = dL/do and dlse = dL/dlse are written (Store::Set
// semantics); drecent[j] += dL/de_j (the recent sources' gradients are running
// sums too; they may alias each other), dw += dL/dw, dgain += dL/dgain. With
// drecent_store Set (the final Mix's partial sum) drecent[j] = dL/de_j, the
// old contents never read; they must then be distinct tensors.
void mix_merge_norm_backward(Tensor& d_o, Tensor& dlse, Span<Tensor> drecent, Tensor& dw,
                             Tensor& dgain, const Tensor& du, const Tensor& w, const Tensor& o,
                             Span<const Tensor> recent, const Tensor& gain, const Tensor& stats,
                             Store drecent_store = Store::Add);

}  // namespace attnres::kernels
