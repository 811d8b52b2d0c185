#include "train/optimizer.h"

#include <cmath>
#include <unordered_map>

#include "kernels/adamw.h"
#include "kernels/reduce.h"

namespace attnres::train {

namespace kern = attnres::kernels;

AdamW::AdamW(model::ParamTable& params, const OptimizerConfig& cfg) : params_(params), cfg_(cfg) {
  // Moments in the precision of the weights the optimizer updates (fp32
  // master weights in a bf16 run), on the same device.
  for (const auto& p : params_.all()) {
    const Tensor& w = p.weights();
    m_.push_back(Tensor::zeros(w.shape(), w.dtype(), w.device()));
    v_.push_back(Tensor::zeros(w.shape(), w.dtype(), w.device()));
  }
}

double AdamW::grad_norm() const {
  std::vector<Tensor> grads;
  for (const auto& p : params_.all()) grads.push_back(p.grad);
  double sq = 0;
  for (double s : kern::sum_squares_each(grads)) sq += s;  // fixed order
  return std::sqrt(sq);
}

void AdamW::step(double lr, double norm) {
  // Clipping scales the gradients inside the update (no pass of its own).
  const double clip = cfg_.grad_clip > 0 && norm > cfg_.grad_clip ? cfg_.grad_clip / (norm + 1e-6)
                                                                   : 1.0;
  ++t_;
  const kern::AdamWStep st{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, t_, clip};
  auto& ps = params_.all();
  std::vector<kern::AdamWTensors> all;
  for (size_t i = 0; i < ps.size(); ++i) {
    model::Param& p = ps[i];
    // Mixed precision: update the fp32 master and write the bf16 copy in one pass.
    all.push_back({&p.weights(), &p.grad, &m_[i], &v_[i], p.decay,
                   p.master.defined() ? &p.value : nullptr});
  }
  kern::adamw_update_each(all, st);
}

std::vector<NamedTensor> AdamW::state_tensors() const {
  std::vector<NamedTensor> out;
  const auto& ps = params_.all();
  for (size_t i = 0; i < ps.size(); ++i) out.push_back({first_moment_name(ps[i].name), m_[i]});
  for (size_t i = 0; i < ps.size(); ++i) out.push_back({second_moment_name(ps[i].name), v_[i]});
  return out;
}

void AdamW::load_state_tensors(const std::vector<NamedTensor>& tensors, const std::string& source) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t.tensor;
  const auto& ps = params_.all();
  auto load = [&](const std::string& name, Tensor& dst) {
    auto it = by_name.find(name);
    if (it == by_name.end()) fail(source, ": optimizer state lacks tensor '", name, "'");
    if (it->second->shape() != dst.shape())
      fail(source, ": optimizer tensor '", name, "' has shape ", shape_str(it->second->shape()),
           ", the model needs ", shape_str(dst.shape()));
    dst.copy_from(it->second->dtype() == dst.dtype() ? *it->second : it->second->to(dst.dtype()));
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    load(first_moment_name(ps[i].name), m_[i]);
    load(second_moment_name(ps[i].name), v_[i]);
  }
}

}  // namespace attnres::train
