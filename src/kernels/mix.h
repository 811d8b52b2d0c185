// AttnRes depth Mix: the softmax over depth sources that replaces the residual
// stream (MODEL.md section 2). For each token row n:
//
//   logit_j = w . (v_j[n] * rstd_j[n])        keys are RMS-normalised, no gain
//   a_j     = softmax_j(logit_j)              statistics and sums in fp32 (or wider)
//   out[n]  = sum_j a_j v_j[n]
//
// rstd_j[n] = 1/sqrt(mean(v_j[n]^2) + eps). A completed block is a source of
// many sublayers, so its rstd is computed once (mix_source_rstd) and passed in.
//
// Block AttnRes's two-phase form (paper section 4.2) splits a sublayer's Mix
// over [completed blocks..., partial sum p] into
//   phase 1: one pass over the completed blocks for the queries of all the
//            block's sublayers at once (mix_forward with Q queries), giving
//            each query its output o and log-sum-exp lse over those sources;
//   phase 2: per sublayer, a merge with its one extra source p
//            (mix_merge_norm_forward): with z = w . (p rstd_p) and
//            a = exp(z) / (exp(lse) + exp(z)) = sigmoid(z - lse),
//            x = (1 - a) o + a p,
//            exactly the softmax over all the sources (online-softmax merge).
// So every completed block is read once per block of sublayers instead of
// once per sublayer. Full AttnRes (S = 1) is the case of one query and no
// merge.
#pragma once
#include "core/span.h"
#include "core/tensor.h"

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
// in the same order (bit-identical on the CPU).
void mix_backward(Span<Tensor> dsources, Span<Tensor> dws, Span<const Tensor> douts,
                  const Tensor* dlse, Span<const Tensor> ws, Span<const Tensor> sources,
                  Span<const Tensor> rstds, const Tensor& probs);

// One query (Full AttnRes, a block's first sublayer, the final Mix without a
// partial): out [N, d], probs [N, k], w [d].
void mix_forward(Tensor& out, Tensor& probs, const Tensor& w, Span<const Tensor> sources,
                 Span<const Tensor> rstds);
void mix_backward(Span<Tensor> dsources, Tensor& dw, const Tensor& dout, const Tensor& w,
                  Span<const Tensor> sources, Span<const Tensor> rstds, const Tensor& probs);

// ---- phase 2: merge with the partial sum, fused with the RMSNorm after it ----
// The merged input x = (1 - a) o + a p, a = sigmoid(w . (p rstd_p) - lse),
// where o [N, d] and lse [N] come from phase 1 and rstd_p is computed here,
// is only ever read by the sublayer's RMSNorm, so the op returns
// u [N, d] = RMSNorm(x; gain) directly and x is never stored (the backward
// recomputes it from o, p and a). One eps for both norms. stats [N, 3] saves
// {a, rstd_p, rstd_x} per row.
void mix_merge_norm_forward(Tensor& u, Tensor& stats, const Tensor& w, const Tensor& o,
                            const Tensor& lse, const Tensor& p, const Tensor& gain, float eps);

// From du = dL/du: d_o = dL/do and dlse = dL/dlse are written (Store::Set
// semantics); dp += dL/dp (p's gradient is also a running sum's), dw +=
// dL/dw, dgain += dL/dgain.
void mix_merge_norm_backward(Tensor& d_o, Tensor& dlse, Tensor& dp, Tensor& dw, Tensor& dgain,
                             const Tensor& du, const Tensor& w, const Tensor& o, const Tensor& p,
                             const Tensor& gain, const Tensor& stats);

}  // namespace attnres::kernels
