// The depth Mix of the residual variants (model.residual's query, weights,
// score, key_norm and heads keys; docs/model.md "Residual variants"): one
// pass over all k sources of one Mix, for every token row n and head h (the
// d channels in H contiguous groups of dh = d / H; H = 1 is today's Mix):
//
//   key_jh   = RMSNorm(v_jh) over the group's dh channels, no gain
//              (key_norm), or v_jh itself
//   logit_jh = q_h . key_jh       q: one query [d] (MixLogits::Query), or one
//                                 per row [N, d] (RowQueries: an input query)
//            = s_j                Scalars: k learnt logits, no query, no key
//   a_jh     = softmax_j(logit_jh)   or sigmoid(logit_jh), not normalised
//            = s_j                Weights: the k learnt values are the weights
//                                 (DenseFormer's depth-weighted average; no score)
//   out_h    = sum_j a_jh v_jh
//
// With the defaults (Query, Softmax, key_norm, one head) this is the Mix of
// kernels/mix.h, which the model runs in its two-phase form instead; the
// variants run in this one pass (docs/model.md says why), and the tests hold
// the two equal on the defaults. Statistics (the weights) in fp32 or wider.
#pragma once
#include <cstdint>

#include "core/span.h"
#include "core/tensor.h"

namespace attnres::kernels {

enum class MixLogits { Query, RowQueries, Scalars, Weights };
enum class MixScore { Softmax, Sigmoid };

struct MixForm {
  MixLogits logits = MixLogits::Query;
  MixScore score = MixScore::Softmax;
  bool key_norm = true;
  int64_t heads = 1;  // H, dividing d; 1 with Scalars and Weights
};

// out [N, d]; weights [N, H, k] (statistics' dtype; saved for the backward);
// query: [d] (Query), [N, d] (RowQueries) or [k] (Scalars, Weights); sources: k >= 1
// tensors [N, d]; eps: the key norm's.
void mix_variant_forward(Tensor& out, Tensor& weights, const Tensor& query,
                         Span<const Tensor> sources, const MixForm& form, float eps);

// From dout = dL/dout: dsources[j] += dL/dv_j (through the weights and, with
// key_norm, through the key's rstd; they may alias each other), dquery +=
// dL/dquery (its shape; the row sums of Query, Scalars and Weights in a fixed order,
// whatever the thread count).
void mix_variant_backward(Span<Tensor> dsources, Tensor& dquery, const Tensor& dout,
                          const Tensor& query, Span<const Tensor> sources, const Tensor& weights,
                          const MixForm& form, float eps);

}  // namespace attnres::kernels
