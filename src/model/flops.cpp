#include "model/flops.h"

namespace attnres::model {

double matmul_params(const ModelConfig& c) {
  const double d = c.d_model, hd = c.head_dim(), F = c.d_ff;
  const double attn = d * c.n_heads * hd * 2 + d * c.n_kv_heads * hd * 2;  // q, o, k, v
  const double mlp = 3 * d * F;
  return c.n_layers * (attn + mlp) + c.vocab_size * d;
}

double training_flops_per_token(const ModelConfig& c, int64_t T) {
  double f = 6 * matmul_params(c) + 6.0 * c.n_layers * T * c.d_model;
  if (c.attnres()) {
    // Each Mix: k sources x (dot + weighted sum) = 4 k d forward, ~3x with backward.
    const int64_t S = c.resolved_block_size();
    double sources = 0;
    for (int64_t s = 0; s < c.n_sublayers(); ++s) sources += 1 + s / S + (s % S ? 1 : 0);
    sources += c.final_sources();
    f += 12.0 * sources * c.d_model;
  }
  return f;
}

}  // namespace attnres::model
