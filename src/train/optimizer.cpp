#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "kernels/adamw.h"
#include "kernels/muon.h"
#include "kernels/reduce.h"

namespace attnres::train {

namespace kern = attnres::kernels;

Optimizer::Optimizer(model::ParamTable& params, const OptimizerConfig& cfg,
             const parallel::ZeroShard* shard)
    : params_(params), cfg_(cfg), shard_(shard) {
  // Moments in the precision of the weights the optimizer updates (fp32
  // master weights in a bf16 run), on the same device; sharded: the owned
  // part, flat.
  const auto& ps = params_.all();
  if (shard_)
    ATTNRES_CHECK(shard_->owned().size() == ps.size(), "AdamW: a shard of ",
                  shard_->owned().size(), " parameters for a table of ", ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const Tensor& w = ps[i].weights();
    const Shape shape = shard_ ? Shape{shard_->owned()[i].size()} : w.shape();
    muon_.push_back(cfg_.type == OptimizerType::Muon && takes_muon(ps[i]));
    // ZeRO-1: a Muon matrix is owned whole by one replica (ZeroShard).
    ATTNRES_CHECK(!(shard_ && muon_.back()) || shard_->owned()[i].size() == 0 ||
                      shard_->owned()[i].size() == w.numel(),
                  "Muon: ", ps[i].name, " is sliced by the ZeRO-1 shard (its owner needs all of it)");
    m_.push_back(Tensor::zeros(shape, w.dtype(), w.device()));  // Muon: the momentum buffer
    v_.push_back(muon_.back() ? Tensor() : Tensor::zeros(shape, w.dtype(), w.device()));
  }
}

bool Optimizer::takes_muon(const std::string& name, int ndim) {
  // The 2-D weights inside the transformer layers: q, k, v, o, the MLP's
  // gate, up and down, each routed and shared expert's; not the routers
  // (mlp.gate.weight), nor the embedding, head, norm gains and depth
  // parameters (an input query's W_l, attn_res.query_proj.weight, included).
  const std::string router = "mlp.gate.weight";
  return ndim == 2 && name.rfind("model.layers.", 0) == 0 &&
         name.find("_res.") == std::string::npos &&
         !(name.size() >= router.size() &&
           name.compare(name.size() - router.size(), router.size(), router) == 0);
}

bool Optimizer::low_precision(const model::Param& p) { return p.value.dtype() == DType::BF16; }

void Optimizer::take_master_slices() {
  auto& ps = params_.all();
  if (!shard_ || !master_.empty() ||
      std::none_of(ps.begin(), ps.end(), [](const model::Param& p) { return p.master.defined(); }))
    return;
  for (size_t i = 0; i < ps.size(); ++i) {
    model::Param& p = ps[i];
    if (shard_->owned()[i].size() == 0) {
      master_.emplace_back();
    } else if (p.master.defined()) {
      master_.push_back(shard_->owned_view(i, p.master).clone());
    } else {  // kept at full precision (a router): its owned part of the value itself
      master_.push_back(shard_->owned_view(i, p.value));
    }
    p.master = Tensor();
  }
}

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < m_.size(); ++i)
    b += static_cast<int64_t>(m_[i].nbytes() + (v_[i].defined() ? v_[i].nbytes() : 0));
  return b;
}

double Optimizer::grad_norm() const {
  std::vector<Tensor> grads;
  for (const auto& p : params_.all()) grads.push_back(p.grad);
  double sq = 0;
  for (double s : kern::sum_squares_each(grads)) sq += s;  // fixed order
  return std::sqrt(sq);
}

void Optimizer::step(double lr, double norm) {
  // Clipping scales the gradients inside the update (no pass of its own).
  const double clip = cfg_.grad_clip > 0 && norm > cfg_.grad_clip ? cfg_.grad_clip / (norm + 1e-6)
                                                                   : 1.0;
  ++t_;
  const kern::AdamWStep st{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, t_, clip};
  auto& ps = params_.all();
  std::vector<kern::AdamWTensors> all;
  // Sharded: flat views of the owned elements (kept alive through the call).
  std::vector<Tensor> views;
  views.reserve(3 * ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    model::Param& p = ps[i];
    if (muon_[i]) continue;  // below
    Tensor* w = &p.weights();
    const Tensor* g = &p.grad;
    // A bf16 value is the rounded copy of an fp32 master (the parameter's,
    // or with ZeRO-1 in master_ the owned slice of it).
    Tensor* lowp = low_precision(p) ? &p.value : nullptr;
    if (shard_) {
      if (shard_->owned()[i].size() == 0) continue;
      const bool held = !master_.empty();  // the fp32 master slice is ours
      w = held ? &master_[i] : &views.emplace_back(shard_->owned_view(i, p.weights()));
      g = &views.emplace_back(shard_->owned_view(i, p.grad));
      if (lowp) lowp = &views.emplace_back(shard_->owned_view(i, p.value));
    }
    // Mixed precision: update the fp32 master and write the bf16 copy in one pass.
    all.push_back({w, g, &m_[i], &v_[i], p.decay, lowp});
  }
  kern::adamw_update_each(all, st);
  // Muon, one matrix at a time (each Newton-Schulz sees its whole gradient;
  // ZeRO-1: the matrices this replica owns, whose summed gradients it has).
  const kern::MuonStep ms{lr, cfg_.momentum, cfg_.weight_decay, clip};
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!muon_[i]) continue;
    model::Param& p = ps[i];
    if (shard_ && shard_->owned()[i].size() == 0) continue;
    const Shape shape = p.value.shape();
    Tensor w = master_.empty() ? p.weights() : master_[i].reshape(shape);
    Tensor m = m_[i].reshape(shape);  // flat when sharded
    kern::muon_update(w, p.grad, m, ms, low_precision(p) ? &p.value : nullptr);
  }
}

std::vector<NamedTensor> Optimizer::state_tensors() const {
  std::vector<NamedTensor> out;
  const auto& ps = params_.all();
  for (size_t i = 0; i < ps.size(); ++i)
    out.push_back({muon_[i] ? momentum_name(ps[i].name) : first_moment_name(ps[i].name), m_[i]});
  for (size_t i = 0; i < ps.size(); ++i)
    out.push_back({muon_[i] ? std::string() : second_moment_name(ps[i].name), v_[i]});
  return out;
}

void Optimizer::load_state_tensors(const std::vector<NamedTensor>& tensors, const std::string& source) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t.tensor;
  const auto& ps = params_.all();
  auto load = [&](size_t i, const model::Param& param, const std::string& name, Tensor& dst) {
    auto it = by_name.find(name);
    if (it == by_name.end()) fail(source, ": optimizer state lacks tensor '", name, "'");
    if (it->second->shape() != param.value.shape())
      fail(source, ": optimizer tensor '", name, "' has shape ", shape_str(it->second->shape()),
           ", the model needs ", shape_str(param.value.shape()));
    const Tensor whole =
        it->second->dtype() == dst.dtype() ? *it->second : it->second->to(dst.dtype());
    dst.copy_from(shard_ ? shard_->owned_view(i, whole) : whole);
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    if (muon_[i]) {
      load(i, ps[i], momentum_name(ps[i].name), m_[i]);
      continue;
    }
    load(i, ps[i], first_moment_name(ps[i].name), m_[i]);
    load(i, ps[i], second_moment_name(ps[i].name), v_[i]);
  }
}

}  // namespace attnres::train
