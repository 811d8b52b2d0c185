#include "model/params.h"

#include <cmath>

#include "core/rng.h"
#include "kernels/common.h"
#include "kernels/reduce.h"

namespace attnres::model {

void Param::sync_value() {
  if (master.defined()) kernels::convert(value, master);
}

Param& ParamTable::add(const std::string& name, const Shape& shape, DType dtype, Device device,
                       double init_std, double init_value) {
  ATTNRES_CHECK(!contains(name), "duplicate parameter ", name);
  Param p{name,
          Tensor::zeros(shape, dtype, device),
          dtype == DType::BF16 ? Tensor::zeros(shape, DType::F32, device) : Tensor(),
          Tensor::zeros(shape, kernels::grad_dtype(dtype), device),
          shape.size() >= 2,
          init_std,
          init_value};
  index_[name] = params_.size();
  params_.push_back(std::move(p));
  return params_.back();
}

Param& ParamTable::get(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) fail("no parameter named '", name, "'");
  return params_[it->second];
}

const Param& ParamTable::get(const std::string& name) const {
  return const_cast<ParamTable*>(this)->get(name);
}

int64_t ParamTable::numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel();
  return n;
}

void ParamTable::zero_grads() {
  for (auto& p : params_) p.grad.zero_();
}

void ParamTable::init(uint64_t seed) {
  for (auto& p : params_) {
    const uint64_t stream = fnv1a64(p.name);
    Tensor& w = p.weights();
    // Generated on the host in the weights' precision, then copied where they live.
    Tensor host = Tensor::empty(w.shape(), w.dtype());
    const int64_t n = host.numel();
    auto fill = [&](auto* x) {
      using T = std::remove_pointer_t<decltype(x)>;
      for (int64_t i = 0; i < n; ++i)
        x[i] = p.init_std == 0 ? static_cast<T>(p.init_value)
                               : static_cast<T>(p.init_std * random_normal(seed, stream, i));
    };
    if (host.dtype() == DType::F32) fill(host.data<float>());
    else fill(host.data<double>());
    w.copy_from(host);
    p.sync_value();
  }
}

std::string layer_param(int64_t layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

ParamTable make_params(const ModelConfig& cfg, DType dtype, const ModelParts& parts,
                       Device device) {
  if (device == Device::CPU && dtype != DType::F32 && dtype != DType::F64)
    fail("parameters on the cpu are F32 or F64, not ", dtype_name(dtype));
  if (device == Device::CUDA && dtype != DType::F32 && dtype != DType::BF16)
    fail("parameters on cuda are F32 or BF16, not ", dtype_name(dtype));
  const int64_t d = cfg.d_model, hd = cfg.head_dim(), F = cfg.d_ff, V = cfg.vocab_size;
  const double std = 0.02, out_std = 0.02 / std::sqrt(2.0 * cfg.n_layers);
  const int64_t end = parts.layer_end < 0 ? cfg.n_layers : parts.layer_end;
  ParamTable t;
  if (parts.embedding || (parts.head && cfg.tie_embeddings))
    t.add("model.embed_tokens.weight", {V, d}, dtype, device, std);
  for (int64_t l = parts.layer_begin; l < end; ++l) {
    t.add(layer_param(l, "input_layernorm.weight"), {d}, dtype, device, 0, 1.0);
    t.add(layer_param(l, "self_attn.q_proj.weight"), {cfg.n_heads * hd, d}, dtype, device, std);
    t.add(layer_param(l, "self_attn.k_proj.weight"), {cfg.n_kv_heads * hd, d}, dtype, device, std);
    t.add(layer_param(l, "self_attn.v_proj.weight"), {cfg.n_kv_heads * hd, d}, dtype, device, std);
    t.add(layer_param(l, "self_attn.o_proj.weight"), {d, cfg.n_heads * hd}, dtype, device, out_std);
    t.add(layer_param(l, "post_attention_layernorm.weight"), {d}, dtype, device, 0, 1.0);
    t.add(layer_param(l, "mlp.gate_proj.weight"), {F, d}, dtype, device, std);
    t.add(layer_param(l, "mlp.up_proj.weight"), {F, d}, dtype, device, std);
    t.add(layer_param(l, "mlp.down_proj.weight"), {d, F}, dtype, device, out_std);
    if (cfg.attnres()) {
      t.add(layer_param(l, "attn_res.query"), {d}, dtype, device, 0, 0.0);
      t.add(layer_param(l, "mlp_res.query"), {d}, dtype, device, 0, 0.0);
    }
  }
  if (parts.head) {
    if (cfg.attnres()) t.add("model.final_res.query", {d}, dtype, device, 0, 0.0);
    t.add("model.norm.weight", {d}, dtype, device, 0, 1.0);
    if (!cfg.tie_embeddings) t.add("lm_head.weight", {V, d}, dtype, device, std);
  }
  return t;
}

}  // namespace attnres::model
