#include "train/moe_balance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

namespace attnres::train {

MoeStepReport finish_moe_step(model::MoeStats& stats, const std::vector<model::Model*>& chunks,
                              const model::ModelConfig& cfg, const parallel::Comm& world) {
  const model::MoeConfig& moe = cfg.moe;
  const int64_t L = cfg.n_layers, E = moe.experts;
  for (auto* part : {&stats.load, &stats.dropped, &stats.tokens, &stats.aux_sum, &stats.aux_count})
    world.allreduce_sum(part->data(), static_cast<int>(part->size()));

  // The biases: nudged where they live, their range gathered (max of hi and
  // of -lo: -inf where a rank holds no such layer).
  const bool aux_free = moe.balance == model::MoeBalance::AuxFree;
  std::vector<double> lo(static_cast<size_t>(L), std::numeric_limits<double>::infinity());
  std::vector<double> hi(static_cast<size_t>(L), -std::numeric_limits<double>::infinity());
  if (aux_free) {
    for (model::Model* m : chunks) m->update_router_bias(stats, moe.bias_rate, lo, hi);
    for (double& x : lo) x = -x;
    world.allreduce_max(lo.data(), static_cast<int>(L));
    world.allreduce_max(hi.data(), static_cast<int>(L));
    for (double& x : lo) x = -x;
  }

  MoeStepReport r;
  nlohmann::json load = nlohmann::json::array(), dropped = nlohmann::json::array(),
                 bias = nlohmann::json::array();
  double worst = 0, aux = 0, all_dropped = 0, all_slots = 0, bias_lo = 0, bias_hi = 0;
  int64_t worst_layer = -1;
  for (int64_t l = 0; l < L; ++l) {
    if (!cfg.moe_layer(l)) continue;
    const double* ld = stats.load.data() + l * E;
    const double total = std::accumulate(ld, ld + E, 0.0);
    const double ratio = total > 0 ? *std::max_element(ld, ld + E) / (total / E) : 0;
    load.push_back(ratio);
    dropped.push_back(stats.dropped[l]);
    if (ratio > worst) worst = ratio, worst_layer = l;
    all_dropped += stats.dropped[l];
    all_slots += total;
    if (stats.aux_count[l] > 0) aux += stats.aux_sum[l] / stats.aux_count[l];
    if (aux_free) {
      bias.push_back({lo[l], hi[l]});
      bias_lo = std::min(bias_lo, lo[l]);
      bias_hi = std::max(bias_hi, hi[l]);
    }
  }
  r.fields["moe_load"] = load;
  r.fields["moe_dropped"] = dropped;
  r.line = fmt::format(" | load max/mean {:.2f} (layer {})", worst, worst_layer);
  if (moe.capacity_factor > 0)
    r.line += fmt::format(" | dropped {:.2f}%", all_slots > 0 ? 100 * all_dropped / all_slots : 0.0);
  if (moe.balance == model::MoeBalance::AuxLoss) {
    r.fields["aux_loss"] = aux;
    r.line += fmt::format(" | aux loss {:.5f}", aux);
  } else if (aux_free) {
    r.fields["moe_bias"] = bias;
    r.line += fmt::format(" | bias [{:.4f}, {:.4f}]", bias_lo, bias_hi);
  }
  return r;
}

}  // namespace attnres::train
