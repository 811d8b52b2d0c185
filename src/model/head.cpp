// The head: the final Mix (or the stream), the final norm, the LM head and
// the cross-entropy loss, with its backward. Scoring is in logprobs.cpp.
#include "model/model.h"

#include "kernels/cross_entropy.h"
#include "kernels/matmul.h"
#include "kernels/mix.h"
#include "kernels/rmsnorm.h"

namespace attnres::model {

namespace kern = attnres::kernels;

// ---------------------------------------------------------------------------
// Head: final Mix, norm, LM head, loss
// ---------------------------------------------------------------------------

Tensor Model::final_norm(const DepthState& st, Activations& acts) const {
  // The head's input is a Mix group of one query over all the completed
  // sources, merged with the unfinished block's partial sum when 2L % S != 0
  // (AttnRes), or the stream (baseline); then the final norm.
  SublayerActs& a = acts.head = SublayerActs{};
  const Tensor* w = nullptr;
  if (cfg_.one_pass_mix() || cfg_.denseformer()) {  // (DenseFormer: the average of X_0 .. X_L)
    a.mix_sources = one_pass_sources(st);
    one_pass_forward(a, *w_.final_query);
  } else if (cfg_.attnres()) {
    w = &w_.final_query->value;
    const bool merge = st.partial.defined();
    phase1_forward(Span<SublayerActs>(&a, 1), Span<const Tensor>(w, 1),
                   static_cast<int64_t>(st.sources.size()), {merge}, st);
    if (merge) a.mix_recent = {st.partial};
    else a.x = a.mix_o;
  } else {
    a.x = st.hidden;
  }
  norm_forward(a, w, w_.final_norm->value);
  return a.u;
}

void Model::set_logits(DType logits) {
  if (logits == DType::BF16 && dtype_ != DType::BF16)
    fail("bf16 logits need a bf16 model (training.precision = bf16); this one computes in ",
         dtype_name(dtype_));
  ATTNRES_CHECK(logits == DType::F32 || logits == DType::BF16, "logits must be F32 or BF16, got ",
                dtype_name(logits));
  logits_ = logits;
}

double Model::head_loss(const DepthState& st, const Tensor& targets, Activations& acts) {
  const Tensor h = final_norm(st, acts);
  return kern::lm_head_cross_entropy(h, w_.lm_head->value, on_device(targets), nullptr, nullptr, 0.0,
                                     kern::Store::Add, logits_);
}

double Model::head_forward_backward(const DepthState& st, const Tensor& targets, Activations& acts,
                                    DepthGrad& grad, double grad_scale) {
  const int64_t N = acts.B * acts.T, d = cfg_.d_model;
  const Tensor h = final_norm(st, acts);
  Param& w_out = *w_.lm_head;
  const Tensor tgt = on_device(targets);
  Tensor dh = new_act(N, d);
  double loss = kern::lm_head_cross_entropy(h, w_out.value, tgt, &dh, &w_out.grad, grad_scale,
                                            kern::Store::Set, logits_);
  grad = DepthGrad{};
  SublayerActs& a = acts.head;
  Param& g_final = *w_.final_norm;
  if (!cfg_.depth_sources()) {
    norm_backward(a, dh, nullptr, g_final, {}, nullptr);
    grad.hidden = a.d_o;
    return loss;
  }
  if (cfg_.one_pass_mix() || cfg_.denseformer()) {  // every source's gradient starts at 0 and is added to
    for (size_t j = 0; j < st.sources.size(); ++j) grad.sources.push_back(zero_act(N, d));
    if (st.partial.defined()) grad.partial = zero_act(N, d);
    norm_backward(a, dh, nullptr, g_final, {}, nullptr);
    std::vector<Tensor> dsources = one_pass_sources(grad);
    one_pass_backward(a, *w_.final_query, dsources);
    return loss;
  }
  // The head is the first backward to reach the sources: its ops write their
  // gradients (Store::Set), so no buffer is zero-filled first. The final Mix
  // reads every source (a source it did not read would be zeroed here).
  const size_t k = a.mix_sources.size();
  for (size_t j = 0; j < st.sources.size(); ++j)
    grad.sources.push_back(j < k ? new_act(N, d) : zero_act(N, d));
  if (a.mix_stats.defined()) grad.partial = new_act(N, d);
  Param* q = w_.final_query;
  norm_backward(a, dh, q, g_final, a.mix_stats.defined() ? Span<Tensor>(&grad.partial, 1)
                                                         : Span<Tensor>(),
                nullptr, kern::Store::Set);
  phase1_backward(Span<SublayerActs>(&a, 1), Span<Param* const>(&q, 1), grad, kern::Store::Set);
  return loss;
}

}  // namespace attnres::model
