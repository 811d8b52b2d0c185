// A training step's mixture-of-experts bookkeeping (docs/model.md, "Mixture
// of experts"): the routing statistics the step's forward passes gathered
// (model::MoeStats, per layer) summed over the job, the auxiliary-loss-free
// balancing of the routers' biases, and what metrics.jsonl and the step line
// report of it.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "parallel/mpi.h"

namespace attnres::train {

// What one step's MoE layers did, over its global batch.
struct MoeStepReport {
  nlohmann::json fields;  // added to the step's metrics.jsonl record
  std::string line;       // appended to the step line
};

// After the optimizer step (collective over `world`): sums `stats` over every
// rank (each pipeline rank fills its own layers, each replica its own
// microbatches), nudges the biases of the MoE layers of `chunks` (aux_free),
// and reports per MoE layer the load of the busiest expert over the mean
// ("moe_load"), the slots dropped past capacity ("moe_dropped"), and the
// auxiliary loss ("aux_loss": its sum over layers, each the mean over the
// step's microbatches) or the biases' range ("moe_bias": [min, max]).
MoeStepReport finish_moe_step(model::MoeStats& stats, const std::vector<model::Model*>& chunks,
                              const model::ModelConfig& cfg, const parallel::Comm& world);

}  // namespace attnres::train
