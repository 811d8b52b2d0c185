#include "model/flops.h"

#include "model/params.h"

namespace attnres::model {

double matmul_params(const ModelConfig& c) {
  // The GEMM weights of param_shapes: the layers' projections and the output
  // projection (the LM head, or the embedding when tied: it is the head too).
  double n = 0;
  for (const auto& p : param_shapes(c))
    switch (p.slot) {
      case Slot::Q: case Slot::K: case Slot::V: case Slot::O:
      case Slot::Gate: case Slot::Up: case Slot::Down: case Slot::LmHead:
        n += static_cast<double>(p.numel());
        break;
      case Slot::Embedding:
        if (c.tie_embeddings) n += static_cast<double>(p.numel());
        break;
      default:
        break;
    }
  return n;
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
