// The optimizer over a ParamTable (docs/model.md section 4): AdamW, or Muon for
// the 2-D weights inside the layers and AdamW for the rest (optimizer.type),
// with global-norm gradient clipping.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/params.h"
#include "parallel/zero.h"
#include "train/config.h"

namespace attnres::train {

class Optimizer {
 public:
  // `shard` (ZeRO-1, parallel/zero.h): the optimizer keeps moments for, and
  // updates, only the elements of each parameter this replica owns; nullptr:
  // all of them.
  Optimizer(model::ParamTable& params, const OptimizerConfig& cfg,
        const parallel::ZeroShard* shard = nullptr);

  // Global L2 norm of all gradients (deterministic, accumulated in double).
  double grad_norm() const;
  // One AdamW update at learning rate lr, with clipping folded into it: if
  // cfg.grad_clip > 0 and norm > clip, the update uses g * clip / (norm + 1e-6)
  // (AdamWStep::grad_scale); p.grad itself is left unclipped. `norm` is
  // grad_norm()'s value.
  void step(double lr, double norm);

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }

  // First/second moments as named tensors ("exp_avg.<param>", "exp_avg_sq.<param>"):
  // entry i is parameter i's first moment, entry n + i its second (n parameters).
  // A Muon matrix has its momentum buffer ("momentum_buffer.<param>") at i and
  // nothing at n + i (an undefined tensor, no name).
  // Sharded: each is the owned part only, flat (Runtime::all_gather_owned
  // makes them whole).
  std::vector<NamedTensor> state_tensors() const;
  bool sharded() const { return shard_ != nullptr; }
  // ZeRO-1: which elements of each parameter this replica owns; nullptr unsharded.
  const parallel::ZeroShard* zero_shard() const { return shard_; }
  // ZeRO-1 in a bf16 run: once the weights are final (initialised, loaded,
  // resumed), the optimizer takes over the fp32 master weights of its owned
  // slices and frees the parameters' whole copies (their weights() are then
  // the bf16 values, which the all-gather after each update refreshes). A
  // no-op without a shard or without masters.
  void take_master_slices();
  // The owned master slices (flat; undefined where nothing is owned), or an
  // empty vector when the optimizer holds none. A parameter kept at full
  // precision (ParamShape::full_precision: a router) has no master: its entry
  // is a view of the owned part of its fp32 value.
  const std::vector<Tensor>& master_slices() const { return master_; }
  // Bytes of moments held (1/D of the whole with ZeRO-1, up to padding).
  int64_t state_bytes() const;
  static std::string first_moment_name(const std::string& param) { return "exp_avg." + param; }
  static std::string second_moment_name(const std::string& param) { return "exp_avg_sq." + param; }
  static std::string momentum_name(const std::string& param) { return "momentum_buffer." + param; }
  // Whether optimizer.type = muon updates p with Muon (else AdamW), by its
  // name and number of dims.
  static bool takes_muon(const std::string& name, int ndim);
  static bool takes_muon(const model::Param& p) {
    return p.trainable && takes_muon(p.name, p.value.ndim());
  }
  // Restore from whole moments (a checkpoint's; a sharded optimizer takes its
  // part); every moment must be present with the right shape, else the error
  // names the missing/mismatched tensor and `source`.
  void load_state_tensors(const std::vector<NamedTensor>& tensors, const std::string& source);

 private:
  // Its value is a bf16 copy of fp32 master weights the update writes into.
  static bool low_precision(const model::Param& p);
  model::ParamTable& params_;
  OptimizerConfig cfg_;
  const parallel::ZeroShard* shard_;
  std::vector<Tensor> m_, v_;  // AdamW's moments; a Muon matrix's momentum in m_
  std::vector<bool> muon_;     // per parameter: updated by Muon
  std::vector<Tensor> master_;  // see master_slices()
  int64_t t_ = 0;
};

}  // namespace attnres::train
