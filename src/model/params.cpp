#include "model/params.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "kernels/common.h"
#include "kernels/reduce.h"

namespace attnres::model {

void Param::sync_value() {
  if (master.defined()) kernels::convert(value, master);
}

Param& ParamTable::add(const std::string& name, const Shape& shape, DType dtype, Device device,
                       double init_std, double init_value, bool trainable) {
  ATTNRES_CHECK(!contains(name), "duplicate parameter ", name);
  // Model state is kept in the statistics' precision (fp32 in a bf16 run),
  // one copy, no gradient.
  const DType dt = trainable ? dtype : kernels::stat_dtype(dtype);
  Param p{name,
          Tensor::zeros(shape, dt, device),
          trainable && dt == DType::BF16 ? Tensor::zeros(shape, DType::F32, device) : Tensor(),
          trainable ? Tensor::zeros(shape, kernels::grad_dtype(dt), device) : Tensor(),
          trainable && shape.size() >= 2,
          init_std,
          init_value,
          trainable};
  index_[name] = params_.size();
  params_.push_back(std::move(p));
  return params_.back();
}

void ParamTable::join_rows(const std::vector<std::string>& names) {
  ATTNRES_CHECK(!names.empty(), "join_rows: no parameters named");
  std::vector<Param*> ps;
  for (const auto& n : names) ps.push_back(&get(n));
  auto join = [&](Tensor Param::*member, const char* what) {
    const Tensor& x = ps[0]->*member;
    Shape shape = x.defined() ? x.shape() : Shape{};
    for (size_t i = 0; i < ps.size(); ++i) {
      const Tensor& y = ps[i]->*member;
      if (!x.defined() && !y.defined()) continue;
      ATTNRES_CHECK(x.defined() && y.defined() && x.dtype() == y.dtype() &&
                        x.device() == y.device() && x.ndim() == y.ndim() && x.ndim() >= 1 &&
                        std::equal(x.shape().begin() + 1, x.shape().end(), y.shape().begin() + 1),
                    "cannot join the ", what, " of ", names[0], " (",
                    x.defined() ? x.describe() : "undefined", ") and ", names[i], " (",
                    y.defined() ? y.describe() : "undefined", ")");
      if (i > 0) shape[0] += y.dim(0);
    }
    if (!x.defined()) return;
    const Tensor all = Tensor::empty(shape, x.dtype(), x.device());
    int64_t row = 0;
    for (Param* p : ps) {
      Tensor& y = p->*member;
      Tensor part = all.rows(row, y.dim(0));
      part.copy_from(y);
      row += y.dim(0);
      y = part;
    }
  };
  join(&Param::value, "values");
  join(&Param::master, "master weights");
  join(&Param::grad, "gradients");
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
  for (const auto& p : params_)
    if (p.trainable) n += p.value.numel();
  return n;
}

void ParamTable::zero_grads() {
  for (auto& p : params_)
    if (p.trainable) p.grad.zero_();
}

void ParamTable::init(uint64_t seed) {
  for (auto& p : params_) {
    const uint64_t stream = fnv1a64(p.name);
    Tensor& w = p.weights();
    // Generated on the host in the weights' precision, then copied where they
    // live. Element i is a pure function of (seed, stream, i), so the host's
    // threads split the elements without changing a bit (~27 ns a value on
    // one thread: a 1.3B model took ~1.5 minutes before its first step).
    Tensor host = Tensor::empty(w.shape(), w.dtype());
    const int64_t n = host.numel();
    auto value = [&](int64_t i) -> double {
      switch (p.init) {
        case ParamInit::LogUniform1to16:
          return std::log(1.0 + 15.0 * random_uniform(seed, stream, static_cast<uint64_t>(i)));
        case ParamInit::InverseSoftplusDt: {
          const double lo = std::log(1e-3), hi = std::log(1e-1);
          const double dt = std::max(1e-4, std::exp(lo + (hi - lo) * random_uniform(seed, stream, static_cast<uint64_t>(i))));
          return dt + std::log(-std::expm1(-dt));  // softplus of it is dt
        }
        case ParamInit::LastOne: return i == n - 1 ? 1.0 : 0.0;
        case ParamInit::Default: break;
      }
      return p.init_std == 0 ? p.init_value : p.init_std * random_normal(seed, stream, i);
    };
    auto fill = [&](auto* x) {
      using T = std::remove_pointer_t<decltype(x)>;
#pragma omp parallel for schedule(static) if (n >= 65536)
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(value(i));
    };
    if (host.dtype() == DType::F32) fill(host.data<float>());
    else fill(host.data<double>());
    w.copy_from(host);
    p.sync_value();
  }
}

int64_t ParamShape::numel() const {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  return n;
}

std::vector<ParamShape> param_shapes(const ModelConfig& cfg, const ModelParts& parts) {
  const int64_t d = cfg.d_model, hd = cfg.head_dim(), F = cfg.d_ff, V = cfg.vocab_size;
  const double std = 0.02, out_std = 0.02 / std::sqrt(2.0 * cfg.n_layers);
  const int64_t end = parts.layer_end < 0 ? cfg.n_layers : parts.layer_end;
  std::vector<ParamShape> out;
  auto add = [&](std::string name, Shape shape, double init_std, double init_value, Slot slot,
                 int64_t layer) {
    out.push_back({std::move(name), std::move(shape), init_std, init_value, slot, layer});
  };
  if (parts.embedding || (parts.head && cfg.tie_embeddings))
    add("model.embed_tokens.weight", {V, d}, std, 0, Slot::Embedding, -1);
  const MoeConfig& moe = cfg.moe;
  const int64_t E = moe.experts, Fe = moe.expert_d_ff, Fs = moe.shared_experts * Fe;
  const int64_t e_end = parts.expert_end < 0 ? E : parts.expert_end;
  // A SwiGLU's three projections (gate and up [width, d], down [d, width]):
  // the dense MLP's, the shared experts', routed expert e's.
  struct SwiGluSlots {
    Slot gate, up, down;
  };
  auto swiglu = [&](const std::string& pre, int64_t width, SwiGluSlots slot, int64_t l,
                    int64_t e) {
    add(pre + "gate_proj.weight", {width, d}, std, 0, slot.gate, l);
    add(pre + "up_proj.weight", {width, d}, std, 0, slot.up, l);
    add(pre + "down_proj.weight", {d, width}, out_std, 0, slot.down, l);
    for (size_t k = out.size() - 3; k < out.size(); ++k) out[k].expert = e;
  };
  // A KDA layer's attention (docs/model.md "KDA layer" and section 3): the
  // projections N(0, 0.02) as every other, o_proj as the out projections;
  // the convolutions N(0, 1 / sqrt(3 W)), the standard deviation of
  // PyTorch's default Conv1d init for a depthwise filter; A_log, dt_bias as
  // FLA's KDA layer (ParamInit), never decayed; o_norm 1.
  const int64_t KH = cfg.kda.heads, KK = cfg.kda.head_dim, HK = KH * KK, W = cfg.kda.conv_size;
  auto kda = [&](const std::string& pre, int64_t l) {
    const std::string a = pre + "self_attn.";
    const double conv_std = 1.0 / std::sqrt(3.0 * static_cast<double>(W));
    add(a + "q_proj.weight", {HK, d}, std, 0, Slot::KdaQ, l);
    add(a + "k_proj.weight", {HK, d}, std, 0, Slot::KdaK, l);
    add(a + "v_proj.weight", {HK, d}, std, 0, Slot::KdaV, l);
    add(a + "q_conv1d.weight", {HK, 1, W}, conv_std, 0, Slot::KdaQConv, l);
    add(a + "k_conv1d.weight", {HK, 1, W}, conv_std, 0, Slot::KdaKConv, l);
    add(a + "v_conv1d.weight", {HK, 1, W}, conv_std, 0, Slot::KdaVConv, l);
    add(a + "A_log", {1, 1, KH, 1}, 0, 0, Slot::KdaALog, l);
    out.back().init = ParamInit::LogUniform1to16;
    out.back().no_decay = true;
    add(a + "dt_bias", {HK}, 0, 0, Slot::KdaDtBias, l);
    out.back().init = ParamInit::InverseSoftplusDt;
    out.back().no_decay = true;
    add(a + "f_a_proj.weight", {KK, d}, std, 0, Slot::KdaFA, l);
    add(a + "f_b_proj.weight", {HK, KK}, std, 0, Slot::KdaFB, l);
    add(a + "b_proj.weight", {KH, d}, std, 0, Slot::KdaB, l);
    add(a + "g_a_proj.weight", {KK, d}, std, 0, Slot::KdaGA, l);
    add(a + "g_b_proj.weight", {HK, KK}, std, 0, Slot::KdaGB, l);
    add(a + "o_norm.weight", {KK}, 0, 1.0, Slot::KdaONorm, l);
    add(a + "o_proj.weight", {d, HK}, out_std, 0, Slot::KdaO, l);
  };
  // An MLA layer's attention (docs/model.md "MLA layer"): the projections
  // N(0, 0.02), o_proj as the out projections, the latent norm's gain 1.
  const MlaConfig& mla = cfg.mla;
  const int64_t MH = cfg.n_heads, dqk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
  auto mla_attn = [&](const std::string& pre, int64_t l) {
    const std::string a = pre + "self_attn.";
    add(a + "q_proj.weight", {MH * dqk, d}, std, 0, Slot::MlaQ, l);
    add(a + "kv_a_proj_with_mqa.weight", {mla.kv_lora_rank + mla.qk_rope_head_dim, d}, std, 0,
        Slot::MlaKvA, l);
    add(a + "kv_a_layernorm.weight", {mla.kv_lora_rank}, 0, 1.0, Slot::MlaKvNorm, l);
    add(a + "kv_b_proj.weight", {MH * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank},
        std, 0, Slot::MlaKvB, l);
    add(a + "o_proj.weight", {d, MH * mla.v_head_dim}, out_std, 0, Slot::MlaO, l);
  };
  // The depth Mix's parameter before sublayer s (s = 2L: the final Mix), all
  // zero so that every Mix starts uniform (docs/model.md section 3): the
  // query w_l [d]; an input query's W_l [d, d] (model.residual.query =
  // input); or the scalar logits s_l [sources] (weights = scalars). Depth
  // parameters are never decayed (W_l either: at 0 it is the uniform Mix).
  auto mix_param = [&](const std::string& pre, int64_t s, Slot slot, int64_t l) {
    if (cfg.variant.weights == MixWeights::Scalars) {
      add(pre + "logits", {cfg.mix_sources(s)}, 0, 0.0, slot, l);
    } else if (cfg.variant.query == MixQuery::Input) {
      add(pre + "query_proj.weight", {d, d}, 0, 0.0, slot, l);
      out.back().no_decay = true;
    } else {
      add(pre + "query", {d}, 0, 0.0, slot, l);
    }
  };
  // DenseFormer's depth-weighted average before layer i (i = L: the head's),
  // over X_0 .. X_i (the embedding and layers 0 .. i-1's outputs): i + 1
  // weights, a_{i,i} = 1 and the rest 0 (the PreNorm stream at the start).
  auto dwa = [&](const std::string& name, int64_t i, Slot slot, int64_t l) {
    add(name, {i + 1}, 0, 0.0, slot, l);
    out.back().init = ParamInit::LastOne;
  };
  for (int64_t l = parts.layer_begin; l < end; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    add(pre + "input_layernorm.weight", {d}, 0, 1.0, Slot::AttnNorm, l);
    if (cfg.kda_layer(l)) {
      kda(pre, l);
    } else if (cfg.mla_layer(l)) {
      mla_attn(pre, l);
    } else {
      add(pre + "self_attn.q_proj.weight", {cfg.n_heads * hd, d}, std, 0, Slot::Q, l);
      add(pre + "self_attn.k_proj.weight", {cfg.n_kv_heads * hd, d}, std, 0, Slot::K, l);
      add(pre + "self_attn.v_proj.weight", {cfg.n_kv_heads * hd, d}, std, 0, Slot::V, l);
      add(pre + "self_attn.o_proj.weight", {d, cfg.n_heads * hd}, out_std, 0, Slot::O, l);
    }
    add(pre + "post_attention_layernorm.weight", {d}, 0, 1.0, Slot::MlpNorm, l);
    if (!cfg.moe_layer(l)) {
      swiglu(pre + "mlp.", F, {Slot::Gate, Slot::Up, Slot::Down}, l, -1);
    } else {
      add(pre + "mlp.gate.weight", {E, d}, std, 0, Slot::Router, l);
      out.back().full_precision = true;
      if (moe.balance == MoeBalance::AuxFree) {
        add(pre + "mlp.gate.e_score_correction_bias", {E}, 0, 0.0, Slot::RouterBias, l);
        out.back().trainable = false;
      }
      if (Fs > 0)
        swiglu(pre + "mlp.shared_experts.", Fs, {Slot::SharedGate, Slot::SharedUp, Slot::SharedDown},
               l, -1);
      for (int64_t e = parts.expert_begin; e < e_end; ++e)
        swiglu(pre + "mlp.experts." + std::to_string(e) + ".", Fe,
               {Slot::ExpertGate, Slot::ExpertUp, Slot::ExpertDown}, l, e);
    }
    if (cfg.attnres()) {
      mix_param(pre + "attn_res.", 2 * l, Slot::AttnQuery, l);
      mix_param(pre + "mlp_res.", 2 * l + 1, Slot::MlpQuery, l);
    }
    if (cfg.denseformer() && l > 0) dwa(pre + "attn_res.dwa", l, Slot::AttnQuery, l);
  }
  if (parts.head) {
    if (cfg.attnres()) mix_param("model.final_res.", cfg.n_sublayers(), Slot::FinalQuery, -1);
    if (cfg.denseformer()) dwa("model.final_res.dwa", cfg.n_layers, Slot::FinalQuery, -1);
    add("model.norm.weight", {d}, 0, 1.0, Slot::FinalNorm, -1);
    if (!cfg.tie_embeddings) add("lm_head.weight", {V, d}, std, 0, Slot::LmHead, -1);
  }
  return out;
}

int64_t total_params(const ModelConfig& cfg) {
  int64_t n = 0;
  for (const auto& s : param_shapes(cfg))
    if (s.trainable) n += s.numel();
  return n;
}

int64_t non_embedding_params(const ModelConfig& cfg) {
  int64_t n = 0;
  for (const auto& s : param_shapes(cfg))
    if (s.trainable && s.slot != Slot::Embedding && s.slot != Slot::LmHead) n += s.numel();
  return n;
}

int64_t activated_non_embedding_params(const ModelConfig& cfg) {
  // A token meets top_k of the E routed experts of a MoE layer: the experts'
  // count scaled by top_k / E (each expert is the same size).
  int64_t n = 0, experts = 0;
  for (const auto& s : param_shapes(cfg)) {
    if (!s.trainable || s.slot == Slot::Embedding || s.slot == Slot::LmHead) continue;
    if (s.expert >= 0) experts += s.numel();
    else n += s.numel();
  }
  return cfg.has_moe() ? n + experts / cfg.moe.experts * cfg.moe.top_k : n;
}

ParamTable make_params(const ModelConfig& cfg, DType dtype, const ModelParts& parts,
                       Device device) {
  if (device == Device::CPU && dtype != DType::F32 && dtype != DType::F64)
    fail("parameters on the cpu are F32 or F64, not ", dtype_name(dtype));
  if (device == Device::CUDA && dtype != DType::F32 && dtype != DType::BF16)
    fail("parameters on cuda are F32 or BF16, not ", dtype_name(dtype));
  ParamTable t;
  std::vector<ParamShape> shapes;
  for (const auto& s : param_shapes(cfg, parts))
    if (s.trainable) shapes.push_back(s);
  for (const auto& s : shapes) {
    Param& p = t.add(s.name, s.shape, s.full_precision ? kernels::stat_dtype(dtype) : dtype, device,
                     s.init_std, s.init_value);
    p.expert = s.expert;
    p.init = s.init;
    if (s.no_decay) p.decay = false;
  }
  // Each layer's q, k and v projections, and each SwiGLU's gate and up
  // projections (each declared one after the other), share an allocation, so
  // attention computes q, k and v with one GEMM (Model::attention_core) and
  // a SwiGLU gate and up (Model::mlp_core, an expert's or the shared ones).
  for (size_t i = 0; i + 1 < shapes.size(); ++i) {
    if (shapes[i].slot == Slot::Q && i + 2 < shapes.size() && shapes[i + 1].slot == Slot::K &&
        shapes[i + 2].slot == Slot::V)
      t.join_rows({shapes[i].name, shapes[i + 1].name, shapes[i + 2].name});
    const Slot a = shapes[i].slot, b = shapes[i + 1].slot;
    if ((a == Slot::Gate && b == Slot::Up) || (a == Slot::SharedGate && b == Slot::SharedUp) ||
        (a == Slot::ExpertGate && b == Slot::ExpertUp))
      t.join_rows({shapes[i].name, shapes[i + 1].name});
  }
  return t;
}

ParamTable make_state(const ModelConfig& cfg, DType dtype, const ModelParts& parts,
                      Device device) {
  ParamTable t;
  for (const auto& s : param_shapes(cfg, parts))
    if (!s.trainable)
      t.add(s.name, s.shape, dtype, device, s.init_std, s.init_value, /*trainable=*/false);
  return t;
}

ModelParams resolve_params(ParamTable& params, ParamTable& state, const ModelConfig& cfg,
                           const ModelParts& parts) {
  const auto shapes = param_shapes(cfg, parts);
  ATTNRES_CHECK(params.all().size() + state.all().size() == shapes.size(), "tables of ",
                params.all().size(), " parameters and ", state.all().size(),
                " state tensors for a model part of ", shapes.size());
  ModelParams w;
  w.layer_begin = parts.layer_begin;
  const int64_t end = parts.layer_end < 0 ? cfg.n_layers : parts.layer_end;
  w.layers.resize(static_cast<size_t>(std::max<int64_t>(0, end - parts.layer_begin)));
  size_t next[2] = {0, 0};  // the next of the state table, of the parameter table
  for (const ParamShape& s : shapes) {
    Param* p = &(s.trainable ? params : state).all().at(next[s.trainable]++);
    ATTNRES_CHECK(p->name == s.name, "tensor ", p->name, " where ", s.name, " was expected");
    LayerParams* L = s.layer >= 0 ? &w.layers[static_cast<size_t>(s.layer - w.layer_begin)] : nullptr;
    switch (s.slot) {
      case Slot::Embedding: w.embedding = p; break;
      case Slot::AttnNorm: L->attn_norm = p; break;
      case Slot::Q: L->q = p; break;
      case Slot::K: L->k = p; break;
      case Slot::V: L->v = p; break;
      case Slot::O: L->o = p; break;
      case Slot::MlpNorm: L->mlp_norm = p; break;
      case Slot::Gate: L->gate = p; break;
      case Slot::Up: L->up = p; break;
      case Slot::Down: L->down = p; break;
      case Slot::AttnQuery: L->attn_query = p; break;
      case Slot::MlpQuery: L->mlp_query = p; break;
      case Slot::FinalQuery: w.final_query = p; break;
      case Slot::FinalNorm: w.final_norm = p; break;
      case Slot::LmHead: w.lm_head = p; break;
      case Slot::Router: L->router = p; break;
      case Slot::RouterBias: L->router_bias = p; break;
      case Slot::SharedGate: L->shared_gate = p; break;
      case Slot::SharedUp: L->shared_up = p; break;
      case Slot::SharedDown: L->shared_down = p; break;
      case Slot::ExpertGate: L->expert_gate.push_back(p); break;
      case Slot::ExpertUp: L->expert_up.push_back(p); break;
      case Slot::ExpertDown: L->expert_down.push_back(p); break;
      case Slot::KdaQ: L->kda.q = p; break;
      case Slot::KdaK: L->kda.k = p; break;
      case Slot::KdaV: L->kda.v = p; break;
      case Slot::KdaQConv: L->kda.q_conv = p; break;
      case Slot::KdaKConv: L->kda.k_conv = p; break;
      case Slot::KdaVConv: L->kda.v_conv = p; break;
      case Slot::KdaALog: L->kda.a_log = p; break;
      case Slot::KdaDtBias: L->kda.dt_bias = p; break;
      case Slot::KdaFA: L->kda.f_a = p; break;
      case Slot::KdaFB: L->kda.f_b = p; break;
      case Slot::KdaB: L->kda.b = p; break;
      case Slot::KdaGA: L->kda.g_a = p; break;
      case Slot::KdaGB: L->kda.g_b = p; break;
      case Slot::KdaONorm: L->kda.o_norm = p; break;
      case Slot::KdaO: L->kda.o = p; break;
      case Slot::MlaQ: L->mla.q = p; break;
      case Slot::MlaKvA: L->mla.kv_a = p; break;
      case Slot::MlaKvNorm: L->mla.kv_norm = p; break;
      case Slot::MlaKvB: L->mla.kv_b = p; break;
      case Slot::MlaO: L->mla.o = p; break;
    }
  }
  if (parts.head && cfg.tie_embeddings) w.lm_head = w.embedding;
  return w;
}

}  // namespace attnres::model
