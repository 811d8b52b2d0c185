// One rank's optimizer step, as `attnres train` runs it and `attnres bench`
// times it: the rank's model chunks and the pipeline runtime (executor and
// transport, parallel/runtime.h), one AdamW per chunk, and the step
//   forward + backward of A microbatches through the schedule, the tied and
//   data-parallel gradient sums -> the global gradient norm -> AdamW (with the
//   norm's clipping) -> with ZeRO-1, the all-gather of the updated weights.
// A single process is the P = D = 1 job on parallel::Comm::solo().
#pragma once
#include <memory>
#include <vector>

#include "parallel/runtime.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace attnres::train {

class Stepper {
 public:
  // The model as cfg.model, on cfg.training's device and precision, with
  // cfg.training's logits and B x T microbatches; cfg.optimizer's AdamW.
  // `ro.transport` must be resolved (Mpi or Nccl). The weights are zero:
  // init_weights, or load them into tables().
  Stepper(const parallel::ProcessGrid& grid, const Config& cfg, const parallel::RuntimeOptions& ro);

  parallel::Runtime& runtime() { return *rt_; }
  // Per local chunk: its parameter table and its optimizer, and its model
  // state (Model::state: no optimizer).
  std::vector<model::ParamTable*> tables();
  std::vector<Optimizer*> optimizers();
  std::vector<model::ParamTable*> state_tables();
  // docs/model.md section 3, from the seed (every chunk: its own tensors).
  void init_weights(uint64_t seed);

  // The step's M = A microbatches (data(mb): this replica's microbatch mb),
  // gradients summed over the replicas. Collective. `graph`: as a CUDA graph
  // when the runtime was made with RuntimeOptions::cuda_graphs.
  parallel::StepStats forward_backward(int A, const parallel::DataFn& data, double grad_scale,
                                       bool graph = true);
  // The global gradient norm. Collective.
  double grad_norm() { return rt_->grad_norm(); }
  // AdamW at `lr`, clipped by `norm` (grad_norm()'s value), then every
  // replica gets the others' updated slices (ZeRO-1). Collective.
  void update(double lr, double norm);

 private:
  std::unique_ptr<parallel::Runtime> rt_;
  std::vector<std::unique_ptr<Optimizer>> opts_;  // one per local chunk
};

}  // namespace attnres::train
