#include "train/stepper.h"

namespace attnres::train {

Stepper::Stepper(const parallel::ProcessGrid& grid, const Config& cfg,
                 const parallel::RuntimeOptions& ro) {
  const TrainingConfig& tc = cfg.training;
  rt_ = std::make_unique<parallel::Runtime>(grid, cfg.model, tc.precision, tc.device, ro,
                                            tc.micro_batch_size, tc.seq_len);
  auto& rm = rt_->model();
  for (int v = 0; v < rm.size(); ++v) {
    rm.chunk(v).set_logits(logit_dtype(tc.logits, tc.precision));
    rm.chunk(v).set_attention_kernel(tc.attention_kernel);
    // AdamW takes the table's shapes; its moments start at zero.
    opts_.push_back(std::make_unique<Optimizer>(rm.chunk(v).params(), cfg.optimizer, rt_->zero_shard(v)));
  }
}

std::vector<model::ParamTable*> Stepper::tables() {
  std::vector<model::ParamTable*> out;
  for (int v = 0; v < rt_->model().size(); ++v) out.push_back(&rt_->model().chunk(v).params());
  return out;
}

std::vector<model::ParamTable*> Stepper::state_tables() {
  std::vector<model::ParamTable*> out;
  for (int v = 0; v < rt_->model().size(); ++v) out.push_back(&rt_->model().chunk(v).state());
  return out;
}

std::vector<Optimizer*> Stepper::optimizers() {
  std::vector<Optimizer*> out;
  for (auto& o : opts_) out.push_back(o.get());
  return out;
}

void Stepper::init_weights(uint64_t seed) {
  for (model::ParamTable* t : tables()) t->init(seed);
  for (model::ParamTable* t : state_tables()) t->init(seed);
}

parallel::StepStats Stepper::forward_backward(int A, const parallel::DataFn& data,
                                              double grad_scale, bool graph) {
  return rt_->train_step(A, data, grad_scale, graph);
}

void Stepper::update(double lr, double norm) {
  for (auto& opt : opts_) opt->step(lr, norm);
  rt_->gather_updated_weights();  // ZeRO-1: every replica gets the others' slices
}

}  // namespace attnres::train
