#include "model/depth_attention.h"

#include "core/error.h"

namespace attnres::model {

std::vector<std::vector<double>> depth_attention(Model& model, const Tensor& tokens, int64_t B,
                                                 int64_t T) {
  ATTNRES_CHECK(model.config().depth_sources(),
                "depth attention exists only in the AttnRes modes and DenseFormer");
  DepthState st;
  Activations acts;
  model.embed_forward(tokens, B, T, st, acts);
  model.layers_forward(0, model.config().n_layers, st, acts);
  Tensor dummy_targets = Tensor::zeros({B * T}, DType::I32, model.device());
  model.head_loss(st, dummy_targets, acts);
  // Mean over tokens of one Mix's weights: its phase-1 weights probs [N, k],
  // scaled by a_0 and followed by a_1..a_m (the recent sources' weights) when
  // it merged (stats [N, 2m + 2] = {a_0..a_m, rstds...}).
  auto mean_weights = [&](const Tensor& probs, const Tensor& stats) {
    const int64_t n = probs.dim(0), k = probs.dim(1);
    const int64_t ns = stats.defined() ? stats.dim(1) : 0, mm = stats.defined() ? ns / 2 - 1 : 0;
    const Tensor p64 = probs.to(Device::CPU).to(DType::F64);
    Tensor s64;
    if (stats.defined()) s64 = stats.to(Device::CPU).to(DType::F64);
    std::vector<double> m(static_cast<size_t>(k + mm), 0.0);
    for (int64_t r = 0; r < n; ++r) {
      const double* a = stats.defined() ? s64.data<double>() + r * ns : nullptr;
      for (int64_t j = 0; j < k; ++j)
        m[j] += p64.data<double>()[r * k + j] * (a ? a[0] : 1.0) / n;
      for (int64_t j = 0; j < mm; ++j) m[k + j] += a[1 + j] / n;
    }
    return m;
  };
  std::vector<std::vector<double>> out;
  if (model.config().denseformer()) {  // its learnt weights: one row per layer l >= 1, then the head's
    auto row = [](const Tensor& probs) {
      const Tensor p64 = probs.to(Device::CPU).to(DType::F64);
      return std::vector<double>(p64.data<double>(), p64.data<double>() + probs.dim(2));
    };
    for (const SublayerActs& a : acts.sub)
      if (a.mix_probs.defined()) out.push_back(row(a.mix_probs));
    out.push_back(row(acts.head.mix_probs));
    return out;
  }
  if (model.config().one_pass_mix()) {
    // A residual variant's Mix: its weights [N, H, k], averaged over tokens
    // and heads (a sigmoid's need not sum to one; the window's row covers
    // the embedding and the W most recent sources).
    auto row = [](const Tensor& probs) {
      const int64_t n = probs.dim(0) * probs.dim(1), k = probs.dim(2);
      const Tensor p64 = probs.to(Device::CPU).to(DType::F64);
      std::vector<double> m(static_cast<size_t>(k), 0.0);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < k; ++j) m[j] += p64.data<double>()[r * k + j] / n;
      return m;
    };
    for (const SublayerActs& a : acts.sub) out.push_back(row(a.mix_probs));
    out.push_back(row(acts.head.mix_probs));
    return out;
  }
  const SublayerActs* leader = nullptr;
  for (size_t s = 0; s < acts.sub.size(); ++s) {
    const SublayerActs& a = acts.sub[s];
    if (a.group_size > 0) leader = &a;
    const int64_t q = static_cast<int64_t>(s) - (leader - acts.sub.data());
    const Tensor& probs = leader->mix_probs;
    out.push_back(mean_weights(probs.rows(q, 1).reshape({probs.dim(1), probs.dim(2)}),
                               a.mix_stats));
  }
  const Tensor& fp = acts.head.mix_probs;
  out.push_back(mean_weights(fp.reshape({fp.dim(1), fp.dim(2)}), acts.head.mix_stats));
  return out;
}

}  // namespace attnres::model
