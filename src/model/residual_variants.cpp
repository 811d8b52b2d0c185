// The residual variants' depth Mix (model.residual's query, weights, score,
// key_norm, heads, window; docs/model.md "Residual variants"): each Mix is
// one pass over all its sources (kernels/mix_variant.h), before its sublayer's
// RMSNorm as the two-phase Mix's output is. residual.cpp, head.cpp and
// recompute.cpp call these where ModelConfig::one_pass_mix() holds, and for
// DenseFormer's depth-weighted averages (the same pass with its weights).
#include "model/model.h"

#include "kernels/matmul.h"
#include "kernels/mix_variant.h"

namespace attnres::model {

namespace kern = attnres::kernels;

namespace {
// The completed sources, then the partial sum when there is one; with a
// depth window W (Full AttnRes: no partial) the embedding and the W most
// recent. The last entry is always the most recent source: an input query's v.
template <typename State>
std::vector<Tensor> sources_read(const ModelConfig& cfg, const State& st) {
  std::vector<Tensor> all(st.sources.begin(), st.sources.end());
  if (st.partial.defined()) all.push_back(st.partial);
  const int64_t W = cfg.variant.window;
  if (W > 0 && static_cast<int64_t>(all.size()) > W + 1)
    all.erase(all.begin() + 1, all.end() - W);
  return all;
}
}  // namespace

std::vector<Tensor> Model::one_pass_sources(const DepthState& st) const {
  return sources_read(cfg_, st);
}
std::vector<Tensor> Model::one_pass_sources(const DepthGrad& g) const {
  return sources_read(cfg_, g);
}

void Model::one_pass_forward(SublayerActs& a, const Param& p) const {
  const kern::MixForm form = cfg_.mix_form();
  const std::vector<Tensor>& src = a.mix_sources;
  const int64_t N = src.at(0).dim(0), k = static_cast<int64_t>(src.size());
  ATTNRES_CHECK(form.logits != kern::MixLogits::Scalars || p.value.numel() == k,
                "a Mix of ", k, " sources with ", p.value.numel(), " scalar logits (", p.name, ")");
  ATTNRES_CHECK(form.logits != kern::MixLogits::Weights || p.value.numel() == k,
                "a depth-weighted average of ", k, " sources with ", p.value.numel(), " weights (",
                p.name, ")");
  const Tensor* query = &p.value;
  if (form.logits == kern::MixLogits::RowQueries) {  // q = W_l v, v the most recent source
    a.mix_q = new_act(N, cfg_.d_model);
    kern::matmul_forward(a.mix_q, src.back(), p.value);
    query = &a.mix_q;
  }
  a.mix_probs = new_stat({N, form.heads, k});
  a.x = new_act(N, cfg_.d_model);
  kern::mix_variant_forward(a.x, a.mix_probs, *query, src, form, static_cast<float>(cfg_.norm_eps));
}

void Model::one_pass_backward(SublayerActs& a, Param& p, Span<Tensor> dsources) {
  const kern::MixForm form = cfg_.mix_form();
  const float eps = static_cast<float>(cfg_.norm_eps);
  if (form.logits != kern::MixLogits::RowQueries) {
    kern::mix_variant_backward(dsources, p.grad, a.d_o, p.value, a.mix_sources, a.mix_probs, form,
                               eps);
    return;
  }
  // The query rows' gradient, then through q = W_l v: dW_l += dq^T v and
  // dv += dq W_l (v's gradient: the last of dsources).
  Tensor dq = zero_act(a.d_o.dim(0), cfg_.d_model);
  kern::mix_variant_backward(dsources, dq, a.d_o, a.mix_q, a.mix_sources, a.mix_probs, form, eps);
  kern::matmul_backward(&dsources[dsources.size() - 1], &p.grad, dq, a.mix_sources.back(), p.value);
}

}  // namespace attnres::model
