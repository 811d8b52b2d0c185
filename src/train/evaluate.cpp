#include "train/evaluate.h"

#include <algorithm>

namespace attnres::train {

std::pair<double, int64_t> evaluate(model::Model& model, data::TokenLoader& loader, int64_t batches,
                                    int64_t B, int64_t T) {
  const int64_t n = std::min(batches, loader.units_per_epoch());
  double sum = 0;
  for (int64_t u = 0; u < n; ++u) {
    auto batch = loader.unit(u);
    sum += model.forward_loss(batch.inputs, batch.targets, B, T);
  }
  const int64_t tokens = n * B * T;
  return {sum / static_cast<double>(tokens), tokens};
}

}  // namespace attnres::train
