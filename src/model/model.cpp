#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/common.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/grouped_matmul.h"
#include "kernels/matmul.h"
#include "kernels/mix.h"
#include "kernels/moe.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace attnres::model {

namespace kern = attnres::kernels;

Model::Model(const ModelConfig& cfg, DType dtype, const ModelParts& parts, Device device)
    : cfg_(cfg),
      dtype_(dtype),
      device_(device),
      params_(make_params(cfg, dtype, parts, device)),
      state_(make_state(cfg, dtype, parts, device)),
      w_(resolve_params(params_, state_, cfg_, parts)) {
  cfg_.validate();
}

Tensor Model::new_act(int64_t rows, int64_t cols) const {
  return Tensor::empty({rows, cols}, dtype_, device_);
}
Tensor Model::zero_act(int64_t rows, int64_t cols) const {
  return Tensor::zeros({rows, cols}, dtype_, device_);
}
Tensor Model::new_stat(const Shape& shape) const {
  return Tensor::empty(shape, kern::stat_dtype(dtype_), device_);
}
Tensor Model::on_device(const Tensor& t) const {
  return t.device() == device_ ? t : t.to(device_);
}

const LayerParams& Model::layer(int64_t l) const {
  const int64_t i = l - w_.layer_begin;
  ATTNRES_CHECK(i >= 0 && i < static_cast<int64_t>(w_.layers.size()), "layer ", l,
                " is not in this model part");
  return w_.layers[static_cast<size_t>(i)];
}

namespace {
// A sublayer's recent sources (or their gradients): those past the first
// `first` of the state's, then the partial sum when it exists.
template <typename State>
std::vector<Tensor> recent_of(const State& st, int64_t first) {
  std::vector<Tensor> r(st.sources.begin() + first, st.sources.end());
  if (st.partial.defined()) r.push_back(st.partial);
  return r;
}
}  // namespace

// Sublayer s is layer s/2's attention (even s) or MLP (odd s).
Param& Model::out_proj_of(int64_t s) const { return s % 2 == 0 ? *layer(s / 2).o : *layer(s / 2).down; }
Param& Model::norm_gain(int64_t s) const {
  return s % 2 == 0 ? *layer(s / 2).attn_norm : *layer(s / 2).mlp_norm;
}
Param& Model::mix_query(int64_t s) const {
  return s % 2 == 0 ? *layer(s / 2).attn_query : *layer(s / 2).mlp_query;
}

// ---------------------------------------------------------------------------
// Embedding
// ---------------------------------------------------------------------------

void Model::embed_forward(const Tensor& tokens, int64_t B, int64_t T, DepthState& st,
                          Activations& acts) const {
  ATTNRES_CHECK(tokens.numel() == B * T, "embed_forward: ", tokens.numel(), " tokens for B*T = ",
                B * T);
  acts.B = B;
  acts.T = T;
  acts.tokens = on_device(tokens);
  Tensor e = new_act(B * T, cfg_.d_model);
  kern::embedding_forward(e, w_.embedding->value, acts.tokens);
  st = DepthState{};
  if (cfg_.attnres()) {
    // b_0 = e: the embedding is always a source of its own.
    Tensor rstd = new_stat({B * T});
    kern::mix_source_rstd(rstd, e, static_cast<float>(cfg_.norm_eps));
    st.sources.push_back(e);
    st.source_rstd.push_back(rstd);
  } else {
    st.hidden = e;
  }
}

void Model::embed_backward(const Activations& acts, DepthGrad& g) {
  const Tensor& de = cfg_.attnres() ? g.sources.at(0) : g.hidden;
  if (cfg_.attnres())
    ATTNRES_CHECK(g.sources.size() == 1 && !g.partial.defined(),
                  "embed_backward: depth gradient should hold only b_0, has ", g.sources.size());
  kern::embedding_backward(w_.embedding->grad, de, acts.tokens);
}

// ---------------------------------------------------------------------------
// Sublayer functions f_s
// ---------------------------------------------------------------------------

void Model::attention_forward(int64_t l, SublayerActs& a, Tensor& y, int64_t B, int64_t T,
                              DecodeCache* cache, const Tensor* residual) const {
  attention_core(l, a, B, T, cache);
  kern::matmul_forward(y, a.att, layer(l).o->value, residual);
}

namespace {
// Parameters (values or gradients) that make_params keeps in one allocation,
// as one matrix, their rows in the order given: [Wq; Wk; Wv], [Wgate; Wup].
Tensor joined(const std::vector<Tensor>& parts, int64_t l, const char* what) {
  Tensor all = Tensor::joined_rows(parts);
  ATTNRES_CHECK(all.defined(), "layer ", l, ": the ", what, " projections are not in one "
                "allocation (ParamTable::join_rows)");
  return all;
}
Tensor qkv_of(const Tensor& q, const Tensor& k, const Tensor& v, int64_t l) {
  return joined({q, k, v}, l, "q, k and v");
}
Tensor gate_up_of(const Tensor& gate, const Tensor& up, int64_t l) {
  return joined({gate, up}, l, "gate and up");
}
}  // namespace

// q, k and v in one GEMM: qkv = u [Wq; Wk; Wv]^T is [N, (H + 2 Hkv) hd], each
// row q | k | v (kernels/attention.h), read in place by RoPE and attention.
// The GEMMs name W's three blocks: the CPU runs one GEMM per projection (the
// bits it computed before they were joined, kernels/matmul.h).
void Model::attention_core(int64_t l, SublayerActs& a, int64_t B, int64_t T,
                           DecodeCache* cache) const {
  const int64_t N = B * T, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, hd = cfg_.head_dim();
  const float theta = static_cast<float>(cfg_.rope_theta);
  const LayerParams& L = layer(l);
  const kern::AttnShape shape{B, T, H, Hkv, hd};
  a.qkv = new_act(N, kern::qkv_width(shape));
  kern::matmul_forward(a.qkv, a.u, qkv_of(L.q->value, L.k->value, L.v->value, l), nullptr,
                       kern::qkv_row_blocks(shape));
  // q's and k's heads are adjacent in each row and take the same rotation.
  const int64_t pos0 = cache ? cache->pos : 0;
  kern::rope_forward(a.qkv, B, T, H + Hkv, hd, theta, pos0);
  a.att = new_act(N, H * hd);
  if (cache) {  // one new token: append its k/v, attend over the cache
    ATTNRES_CHECK(B == 1 && T == 1, "decoding feeds one token at a time");
    ATTNRES_CHECK(cache->pos < cache->max_len, "decode cache full (", cache->max_len, " tokens)");
    // The token's one row, seen as its H + 2 Hkv heads: q's, k's, v's.
    const Tensor heads = a.qkv.reshape({H + 2 * Hkv, hd});
    cache->k[l].reshape({cache->max_len, Hkv * hd}).rows(cache->pos, 1)
        .copy_from(heads.rows(H, Hkv));
    cache->v[l].reshape({cache->max_len, Hkv * hd}).rows(cache->pos, 1)
        .copy_from(heads.rows(H + Hkv, Hkv));
    kern::attention_decode(a.att, heads.rows(0, H).reshape({1, H * hd}), cache->k[l],
                           cache->v[l], cache->pos + 1, {1, 1, H, Hkv, hd});
  } else {
    a.lse = new_stat({B, H, T});
    kern::attention_forward(a.att, a.lse, a.qkv, shape, attention_kernel_);
  }
}

Tensor Model::attention_backward(int64_t l, SublayerActs& a, const Tensor& dy, int64_t B,
                                 int64_t T) {
  const int64_t N = B * T, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, hd = cfg_.head_dim();
  const float theta = static_cast<float>(cfg_.rope_theta);
  const LayerParams& L = layer(l);
  Param& wo = *L.o;
  const kern::AttnShape shape{B, T, H, Hkv, hd};
  // Activation gradients are written (Store::Set), not zeroed and
  // accumulated into: each has one producer.
  Tensor datt = new_act(N, H * hd);
  kern::matmul_backward(&datt, &wo.grad, dy, a.att, wo.value, kern::Store::Set);
  Tensor dqkv = new_act(N, kern::qkv_width(shape));
  kern::attention_backward(dqkv, datt, a.qkv, a.att, a.lse, shape, kern::Store::Set,
                           attention_kernel_);
  kern::rope_backward(dqkv, B, T, H + Hkv, hd, theta);
  // du = dq Wq + dk Wk + dv Wv = dqkv [Wq; Wk; Wv] and the three weight
  // gradients dqkv^T u, each one GEMM.
  Tensor du = new_act(N, cfg_.d_model);
  Tensor dw = qkv_of(L.q->grad, L.k->grad, L.v->grad, l);
  kern::matmul_backward(&du, &dw, dqkv, a.u, qkv_of(L.q->value, L.k->value, L.v->value, l),
                        kern::Store::Set, kern::qkv_row_blocks(shape));
  return du;
}

void Model::mlp_forward(int64_t l, SublayerActs& a, Tensor& y, const Tensor* residual) const {
  mlp_core(l, a);
  if (cfg_.moe_layer(l)) moe_output(l, a, y, residual);
  else kern::matmul_forward(y, a.h, layer(l).down->value, residual);
}

namespace {
// A SwiGLU up to its last projection over the rows of u: gate and up in one
// GEMM, gu = u [W_gate; W_up]^T [N, 2F] (gate | up), then h = SwiGLU(gu).
// gu is kept where it is defined already (recompute = mix keeps it).
void swiglu_core(Tensor& gu, Tensor& h, const Tensor& u, const Tensor& w_gate_up, DType dtype,
                 Device device) {
  const int64_t N = u.dim(0), F = w_gate_up.dim(0) / 2;
  if (!gu.defined()) {
    gu = Tensor::empty({N, 2 * F}, dtype, device);
    kern::matmul_forward(gu, u, w_gate_up);
  }
  h = Tensor::empty({N, F}, dtype, device);
  kern::swiglu_forward(h, gu);
}
// Its backward from dL/dh (dh = dy W_down, given): the gate and up weights'
// gradients added into dw_gate_up, du written (Store::Set).
void swiglu_backward_from_h(Tensor& du, Tensor& dw_gate_up, const Tensor& dh, const Tensor& gu,
                            const Tensor& u, const Tensor& w_gate_up) {
  Tensor dgu = Tensor::empty(gu.shape(), gu.dtype(), gu.device());
  kern::swiglu_backward(dgu, dh, gu, kern::Store::Set);
  kern::matmul_backward(&du, &dw_gate_up, dgu, u, w_gate_up, kern::Store::Set);
}
}  // namespace

void Model::mlp_core(int64_t l, SublayerActs& a) const {
  if (cfg_.moe_layer(l)) {
    moe_core(l, a);
    return;
  }
  const LayerParams& L = layer(l);
  swiglu_core(a.gu, a.h, a.u, gate_up_of(L.gate->value, L.up->value, l), dtype_, device_);
}

Tensor Model::mlp_backward(int64_t l, SublayerActs& a, const Tensor& dy, double loss_scale) {
  if (cfg_.moe_layer(l)) return moe_backward(l, a, dy, loss_scale);
  const int64_t N = a.u.dim(0), F = cfg_.d_ff;
  const LayerParams& L = layer(l);
  Param& wd = *L.down;
  Tensor dh = new_act(N, F);
  kern::matmul_backward(&dh, &wd.grad, dy, a.h, wd.value, kern::Store::Set);
  Tensor du = new_act(N, cfg_.d_model);
  Tensor dw = gate_up_of(L.gate->grad, L.up->grad, l);
  swiglu_backward_from_h(du, dw, dh, a.gu, a.u, gate_up_of(L.gate->value, L.up->value, l));
  return du;
}

// ---------------------------------------------------------------------------
// Mixture of experts (model.moe; kernels/moe.h)
// ---------------------------------------------------------------------------

void Model::update_router_bias(const MoeStats& step, double rate, std::vector<double>& lo,
                               std::vector<double>& hi) {
  const int64_t E = cfg_.moe.experts;
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    Param* bias = w_.layers[i].router_bias;
    if (!bias) continue;
    const int64_t l = w_.layer_begin + static_cast<int64_t>(i);
    const double* load = step.load.data() + l * E;
    double mean = 0;
    for (int64_t e = 0; e < E; ++e) mean += load[e];
    mean /= static_cast<double>(E);
    // E values: nudged on the host, in the bias's own precision.
    Tensor b = bias->value.to(Device::CPU);
    auto nudge = [&](auto* v) {
      using T = std::remove_pointer_t<decltype(v)>;
      for (int64_t e = 0; e < E; ++e) {
        const int sign = (load[e] < mean) - (load[e] > mean);  // towards the mean; 0 at it
        v[e] = static_cast<T>(v[e] + static_cast<T>(rate * sign));
      }
      lo[l] = static_cast<double>(*std::min_element(v, v + E));
      hi[l] = static_cast<double>(*std::max_element(v, v + E));
    };
    if (b.dtype() == DType::F64) nudge(b.data<double>());
    else nudge(b.data<float>());
    bias->value.copy_from(b);
  }
}

Tensor Model::stat_copy(const Tensor& t) const {
  // The router runs in the statistics' precision (as DeepSeek-V3 computes
  // its gate in fp32): in a bf16 run on its input converted and its weights,
  // which are fp32 values in every run (ParamShape::full_precision: no bf16
  // copy, no master that ZeRO-1 could slice away).
  if (t.dtype() == kern::stat_dtype(dtype_)) return t;
  Tensor out = new_stat(t.shape());
  kern::convert(out, t);
  return out;
}

kern::MoeRouteOptions Model::moe_route_options(int64_t N) const {
  kern::MoeRouteOptions o;
  o.router = cfg_.moe.router;
  o.top_k = cfg_.moe.top_k;
  o.scale = cfg_.moe.routed_scale;
  o.capacity = cfg_.moe_capacity(N);
  return o;
}

namespace {
// The routed experts' joint gate | up matrices and down matrices held here
// (of the values, or of the gradients: `of` = &Param::grad), by local index:
// the grouped GEMMs' weights (kernels/grouped_matmul.h).
struct ExpertMatrices {
  std::vector<Tensor> gate_up, down;
};
ExpertMatrices expert_matrices(const LayerParams& L, int64_t l, Tensor Param::*of) {
  ExpertMatrices m;
  for (size_t j = 0; j < L.expert_gate.size(); ++j) {
    m.gate_up.push_back(gate_up_of(L.expert_gate[j]->*of, L.expert_up[j]->*of, l));
    m.down.push_back(L.expert_down[j]->*of);
  }
  return m;
}

// Expert parallelism: the rows one member received, member-major (member p's
// rows for local experts j = 0..El-1 in turn), and the same rows
// expert-major (expert j's from members p = 0..EP-1 in turn); counts[p * El
// + j] rows each. Copies `in` into `out` in the direction asked.
void regroup(Tensor& out, const Tensor& in, const std::vector<int64_t>& counts, int64_t EP,
             bool to_expert_major) {
  const size_t El = counts.size() / static_cast<size_t>(EP);
  std::vector<int64_t> expert_major(counts.size());
  int64_t at = 0;
  for (size_t j = 0; j < El; ++j)
    for (size_t p = 0; p < static_cast<size_t>(EP); ++p)
      expert_major[p * El + j] = at, at += counts[p * El + j];
  at = 0;
  for (size_t i = 0; i < counts.size(); at += counts[i], ++i) {
    if (counts[i] == 0) continue;
    if (to_expert_major) out.rows(expert_major[i], counts[i]).copy_from(in.rows(at, counts[i]));
    else out.rows(at, counts[i]).copy_from(in.rows(expert_major[i], counts[i]));
  }
}

// Rows this member sends to each member q (the routing's rows for q's
// experts) and receives from each member p (its counts for our experts).
void member_rows(const SublayerActs& a, int64_t EP, std::vector<int64_t>& send,
                 std::vector<int64_t>& recv) {
  const std::vector<int64_t>& off = a.moe_route.offsets;
  const size_t El = a.moe_offsets.size() - 1;
  send.assign(static_cast<size_t>(EP), 0);
  recv.assign(static_cast<size_t>(EP), 0);
  for (size_t q = 0; q < static_cast<size_t>(EP); ++q) {
    send[q] = off[(q + 1) * El] - off[q * El];
    for (size_t j = 0; j < El; ++j) recv[q] += a.moe_counts[q * El + j];
  }
}
}  // namespace

Tensor Model::to_experts(const SublayerActs& a, const Tensor& rows) const {
  if (!exchange_) return rows;
  const int64_t EP = exchange_->members();
  std::vector<int64_t> send, recv;
  member_rows(a, EP, send, recv);
  Tensor got = new_act(a.moe_offsets.back(), rows.dim(1));
  exchange_->rows(rows, send, got, recv);
  Tensor out = new_act(a.moe_offsets.back(), rows.dim(1));
  regroup(out, got, a.moe_counts, EP, /*to_expert_major=*/true);
  return out;
}

Tensor Model::from_experts(const SublayerActs& a, const Tensor& rows) const {
  if (!exchange_) return rows;
  const int64_t EP = exchange_->members();
  std::vector<int64_t> send, recv;
  member_rows(a, EP, send, recv);
  Tensor back = new_act(a.moe_offsets.back(), rows.dim(1));
  regroup(back, rows, a.moe_counts, EP, /*to_expert_major=*/false);
  Tensor out = new_act(a.moe_route.rows(), rows.dim(1));
  exchange_->rows(back, recv, out, send);
  return out;
}

void Model::moe_core(int64_t l, SublayerActs& a) const {
  const MoeConfig& moe = cfg_.moe;
  const int64_t N = a.u.dim(0), d = cfg_.d_model, E = moe.experts;
  const LayerParams& L = layer(l);
  const size_t El = L.expert_gate.size();  // the routed experts held here
  kern::MoeRouting& r = a.moe_route;
  if (!a.moe_logits.defined()) {  // route (once per forward: the routing is kept)
    a.moe_logits = new_stat({N, E});
    kern::matmul_forward(a.moe_logits, stat_copy(a.u), L.router->value);
    kern::moe_route(r, a.moe_logits, L.router_bias ? &L.router_bias->value : nullptr,
                    moe_route_options(N));
    if (moe_stats_) {
      MoeStats& st = *moe_stats_;
      for (int64_t e = 0; e < E; ++e) st.load.at(static_cast<size_t>(l * E + e)) += r.load[e];
      st.dropped.at(l) += static_cast<double>(r.dropped);
      st.tokens.at(l) += static_cast<double>(N);
      if (moe.balance == MoeBalance::AuxLoss) {
        st.aux_sum.at(l) += moe.aux_loss_coef * E * kern::moe_balance(a.moe_logits, r, moe.router);
        st.aux_count.at(l) += 1;
      }
    }
    // The rows of the experts held here (see SublayerActs).
    if (!exchange_) {
      a.moe_offsets = r.offsets;
    } else {
      std::vector<int64_t> kept(static_cast<size_t>(E));
      for (size_t e = 0; e < kept.size(); ++e) kept[e] = r.offsets[e + 1] - r.offsets[e];
      a.moe_counts = exchange_->counts(kept);
      a.moe_offsets.assign(El + 1, 0);
      for (size_t j = 0; j < El; ++j) {
        a.moe_offsets[j + 1] = a.moe_offsets[j];
        for (size_t p = 0; p * El < a.moe_counts.size(); ++p)
          a.moe_offsets[j + 1] += a.moe_counts[p * El + j];
      }
    }
  }
  if (L.shared_gate)
    swiglu_core(a.gu, a.h, a.u, gate_up_of(L.shared_gate->value, L.shared_up->value, l), dtype_,
                device_);
  // The routed experts, each a SwiGLU over its consecutive rows (the token
  // rows in the routing's order, sent to their experts' member; gathered
  // again where needed).
  const std::vector<int64_t>& off = a.moe_offsets;
  const int64_t Mx = off.back(), Fe = moe.expert_d_ff;
  const ExpertMatrices w = expert_matrices(L, l, &Param::value);
  if (!a.moe_gu.defined()) {
    Tensor x = new_act(r.rows(), d);
    kern::moe_permute(x, a.u, r);
    x = to_experts(a, x);
    if (exchange_) a.moe_x = x;  // without the exchange, backward permutes u again
    a.moe_gu = new_act(Mx, 2 * Fe);
    kern::grouped_matmul_forward(a.moe_gu, x, w.gate_up, off);
  }
  a.moe_h = new_act(Mx, Fe);
  kern::swiglu_forward(a.moe_h, a.moe_gu);  // row by row: as per expert
  if (!a.moe_y.defined()) {
    Tensor y = new_act(Mx, d);
    kern::grouped_matmul_forward(y, a.moe_h, w.down, off);
    a.moe_y = from_experts(a, y);
  }
}

void Model::moe_output(int64_t l, SublayerActs& a, Tensor& y, const Tensor* residual) const {
  const LayerParams& L = layer(l);
  const Tensor* base = residual;
  if (L.shared_gate) {
    kern::matmul_forward(y, a.h, L.shared_down->value, residual);
    base = &y;
  }
  kern::moe_combine(y, a.moe_y, a.moe_route, base);
}

Tensor Model::moe_backward(int64_t l, SublayerActs& a, const Tensor& dy, double loss_scale) {
  const MoeConfig& moe = cfg_.moe;
  const LayerParams& L = layer(l);
  const kern::MoeRouting& r = a.moe_route;
  const int64_t N = a.u.dim(0), d = cfg_.d_model, Fe = moe.expert_d_ff;
  const std::vector<int64_t>& off = a.moe_offsets;
  const int64_t Mx = off.back();
  // du: the shared experts' (written), then the router's and the routed
  // experts' added, in that order.
  Tensor du = new_act(N, d);
  if (L.shared_gate) {
    Tensor dh = new_act(N, a.h.dim(1));
    kern::matmul_backward(&dh, &L.shared_down->grad, dy, a.h, L.shared_down->value,
                          kern::Store::Set);
    Tensor dw = gate_up_of(L.shared_gate->grad, L.shared_up->grad, l);
    swiglu_backward_from_h(du, dw, dh, a.gu, a.u,
                           gate_up_of(L.shared_gate->value, L.shared_up->value, l));
  } else {
    du.zero_();
  }
  // The combine: each kept row's dL/dy (g dy of its token) and each slot's
  // dL/dg; the rows' gradients go to their experts.
  Tensor dyr = new_act(r.rows(), d), dgate = new_stat({N, r.K});
  kern::moe_combine_backward(dyr, dgate, dy, a.moe_y, r);
  dyr = to_experts(a, dyr);
  // The routed experts, each over its rows.
  Tensor x = a.moe_x;
  if (!x.defined()) {
    x = new_act(Mx, d);
    kern::moe_permute(x, a.u, r);
  }
  Tensor dx = new_act(Mx, d), dh = new_act(Mx, Fe), dgu = new_act(Mx, 2 * Fe);
  const ExpertMatrices w = expert_matrices(L, l, &Param::value);
  ExpertMatrices dw = expert_matrices(L, l, &Param::grad);
  kern::grouped_matmul_backward(&dh, dw.down, dyr, a.moe_h, w.down, off, kern::Store::Set);
  kern::swiglu_backward(dgu, dh, a.moe_gu, kern::Store::Set);
  kern::grouped_matmul_backward(&dx, dw.gate_up, dgu, x, w.gate_up, off, kern::Store::Set);
  dx = from_experts(a, dx);
  // The router: through the gate weights, and the auxiliary loss's balance
  // term (its weight in the step's loss: loss_scale N per microbatch mean).
  Tensor dlogits = new_stat({N, moe.experts});
  kern::moe_route_backward(dlogits, dgate, a.moe_logits, r, moe_route_options(N));
  if (moe.balance == MoeBalance::AuxLoss)
    kern::moe_balance_backward(dlogits, a.moe_logits, r, moe.router,
                               loss_scale * static_cast<double>(N) * moe.aux_loss_coef *
                                   static_cast<double>(moe.experts));
  const Tensor u = stat_copy(a.u);
  if (u.dtype() == du.dtype()) {
    kern::matmul_backward(&du, &L.router->grad, dlogits, u, L.router->value, kern::Store::Add);
  } else {  // a bf16 run: the router's du in fp32, rounded once into du
    Tensor du_stat = new_stat({N, d}), du_router = new_act(N, d);
    kern::matmul_backward(&du_stat, &L.router->grad, dlogits, u, L.router->value,
                          kern::Store::Set);
    kern::convert(du_router, du_stat);
    kern::add_(du, du_router);
  }
  kern::moe_unpermute_add(du, dx, r);
  return du;
}

// ---------------------------------------------------------------------------
// One sublayer with its residual bookkeeping
// ---------------------------------------------------------------------------
//
// AttnRes (block size S; full = S 1). Sublayer s is position i = s mod S of
// its block. Its sources are the completed blocks, plus the partial sum p of
// the block's earlier outputs when i > 0. After f_s: p = y (i == 0) or
// p + y; when i == S-1 the block is complete and p becomes a new source.
//
// The Mix runs in two phases (kernels/mix.h) over groups of consecutive
// sublayers (ModelConfig::mix_group_size: the block, or for Full AttnRes
// groups of about sqrt(2L) sublayers). Before a group's first sublayer in a
// chunk (its leader), phase 1 mixes the sources that existed when the group
// started, for every query of the group in one pass; each sublayer with
// recent sources (added since its group started: the partial sum, or a Full
// group's earlier outputs) then merges them in. The split of a sublayer's
// sources depends only on the config, and phase 1's results per query do not
// depend on how many queries share the pass, so the results do not depend on
// where chunks are cut (see mix_forward).

void Model::mix_phase1_forward(int64_t s, Span<SublayerActs> g, const DepthState& st) const {
  std::vector<Tensor> ws;
  std::vector<bool> merging;
  for (size_t q = 0; q < g.size(); ++q) {
    ws.push_back(mix_query(s + static_cast<int64_t>(q)).value);
    merging.push_back(cfg_.recent_sources(s + static_cast<int64_t>(q)) > 0);  // all but maybe the leader
  }
  const int64_t k = cfg_.phase1_sources(s);
  ATTNRES_CHECK(static_cast<int64_t>(st.sources.size()) >= k, "sublayer ", s, ": ",
                st.sources.size(), " sources, phase 1 needs ", k);
  phase1_forward(g, ws, k, merging, st);
}

void Model::phase1_forward(Span<SublayerActs> g, Span<const Tensor> ws, int64_t k,
                           const std::vector<bool>& merging, const DepthState& st) const {
  const int64_t Q = static_cast<int64_t>(g.size());
  const int64_t N = st.sources.at(0).dim(0), d = cfg_.d_model;
  SublayerActs& leader = g[0];
  leader.group_size = Q;
  leader.mix_sources.assign(st.sources.begin(), st.sources.begin() + k);
  leader.mix_rstd.assign(st.source_rstd.begin(), st.source_rstd.begin() + k);
  leader.mix_probs = new_stat({Q, N, k});
  // Queries that merge read their lse, and their backward writes their row
  // of dlse (phase1_backward zeroes the others' rows).
  const bool merges = std::find(merging.begin(), merging.end(), true) != merging.end();
  Tensor lse;
  if (merges) {
    lse = new_stat({Q, N});
    leader.mix_dlse = new_stat({Q, N});
  }
  std::vector<Tensor> outs;
  for (int64_t q = 0; q < Q; ++q) {
    g[q].mix_o = new_act(N, d);
    outs.push_back(g[q].mix_o);
    if (merging[q]) {
      g[q].mix_lse = lse.rows(q, 1).reshape({N});
      g[q].mix_dlse_row = leader.mix_dlse.rows(q, 1).reshape({N});
    }
  }
  kern::mix_forward(outs, leader.mix_probs, merges ? &lse : nullptr, ws, leader.mix_sources,
                 leader.mix_rstd);
}

void Model::sublayers_forward(int64_t s0, int64_t s1, DepthState& st,
                              std::vector<SublayerActs>& subs, int64_t B, int64_t T,
                              DecodeCache* cache) const {
  const int64_t G = cfg_.mix_group_size();
  for (int64_t s = s0; s < s1;) {
    // The group: up to the end of s's Mix group or of the chunk.
    const int64_t end = cfg_.attnres() ? std::min((s / G + 1) * G, s1) : s + 1;
    if (cfg_.attnres())
      mix_phase1_forward(s, Span<SublayerActs>(subs.data() + (s - s0), size_t(end - s)), st);
    for (; s < end; ++s) {
      sublayer_forward(s, st, subs[s - s0], B, T, cache);
      if (!cache) drop_recomputable(subs[s - s0]);
    }
  }
}

void Model::sublayer_forward(int64_t s, DepthState& st, SublayerActs& a, int64_t B, int64_t T,
                             DecodeCache* cache) const {
  const int64_t l = s / 2, N = B * T, d = cfg_.d_model;
  const bool is_attn = (s % 2 == 0);
  const float eps = static_cast<float>(cfg_.norm_eps);
  const int64_t S = cfg_.resolved_block_size();
  const int64_t i = cfg_.attnres() ? s % S : 0;

  // The sublayer's input x and u = RMSNorm(x; g): the stream (baseline), the
  // phase-1 output (AttnRes, no recent sources: phase 1 saw them all), or its
  // merge with the recent sources.
  const int64_t m = cfg_.attnres() ? cfg_.recent_sources(s) : 0;
  if (m > 0) {
    a.mix_recent = recent_of(st, cfg_.phase1_sources(s));
    ATTNRES_CHECK(static_cast<int64_t>(a.mix_recent.size()) == m, "sublayer ", s, ": ",
                  a.mix_recent.size(), " recent sources, expected ", m);
  } else {
    a.x = cfg_.attnres() ? a.mix_o : st.hidden;
  }
  norm_forward(a, cfg_.attnres() ? &mix_query(s).value : nullptr, norm_gain(s).value);

  // f_s. Where y_s only ever enters a running sum (the baseline's stream
  // x_{s+1} = x_s + y_s, a block's partial p + y_s), f_s's last projection
  // adds it there itself (on the GPU in the GEMM's epilogue: no pass of its
  // own); the old sum stays saved (the stream as a.x, p as a Mix source).
  const Tensor* sum_into = !cfg_.attnres() ? &st.hidden : (i > 0 ? &st.partial : nullptr);
  Tensor out = new_act(N, d);
  if (is_attn) attention_forward(l, a, out, B, T, cache, sum_into);
  else mlp_forward(l, a, out, sum_into);
  if (depth_stats_) {
    // y_s itself; where it went straight into a sum, computed again on the
    // side (observing must not change what is computed)
    Tensor y = out;
    if (sum_into) {
      y = new_act(N, d);
      if (!is_attn && cfg_.moe_layer(l)) moe_output(l, a, y, nullptr);
      else kern::matmul_forward(y, is_attn ? a.att : a.h, out_proj_of(s).value);
    }
    depth_stats_->output_sumsq.at(s) += kern::sum_squares(y);
    depth_stats_->output_count.at(s) += static_cast<double>(y.numel());
  }

  if (!cfg_.attnres()) {
    st.hidden = out;
    return;
  }
  st.partial = out;
  if (i == S - 1) {  // block complete: it becomes a source
    Tensor rstd = new_stat({N});
    kern::mix_source_rstd(rstd, st.partial, eps);
    st.sources.push_back(st.partial);
    st.source_rstd.push_back(rstd);
    st.partial = Tensor();
  }
}

void Model::sublayer_backward(int64_t s, SublayerActs& a, DepthGrad& g, const Activations& acts) {
  const int64_t l = s / 2, B = acts.B, T = acts.T;
  const bool is_attn = (s % 2 == 0);
  const int64_t S = cfg_.resolved_block_size();
  const int64_t i = cfg_.attnres() ? s % S : 0;

  Tensor dy;  // gradient of this sublayer's output y_s
  if (!cfg_.attnres()) {
    // x_{s+1} = x_s + y_s: dy = dx_{s+1}, and dx_s = dx_{s+1} + f_s'(dy).
    dy = g.hidden;
  } else {
    if (i == S - 1) {  // undo the push: the block's gradient is the partial's
      ATTNRES_CHECK(!g.partial.defined() && !g.sources.empty(), "sublayer ", s,
                    ": depth gradient out of step");
      g.partial = g.sources.back();
      g.sources.pop_back();
    }
    // p_after = p_before + y (or = y at i == 0): both receive dp_after.
    dy = g.partial;
    if (i == 0) g.partial = Tensor();
  }

  if (depth_stats_) {  // dL/dy_s, complete: every later sublayer is done
    depth_stats_->grad_sumsq.at(s) += kern::sum_squares(dy);
    depth_stats_->grad_count.at(s) += static_cast<double>(dy.numel());
  }

  // f_s backward: dy -> du (dy is fully consumed here, before the norm and
  // Mix backward below add into the same buffer: the stream's gradient, or
  // the partial's as d p_before).
  const Tensor du =
      is_attn ? attention_backward(l, a, dy, B, T) : mlp_backward(l, a, dy, acts.loss_scale);
  if (!cfg_.attnres()) {  // dx_s = dx_{s+1} + RMSNorm'(du), in place
    norm_backward(a, du, nullptr, norm_gain(s), {}, &g.hidden);
    return;
  }
  // The recent sources' gradients, as in the forward: sources past phase 1's,
  // then d p_before (the partial's, defined exactly when it merged).
  std::vector<Tensor> drecent;
  if (a.mix_stats.defined()) drecent = recent_of(g, cfg_.phase1_sources(s));
  norm_backward(a, du, &mix_query(s), norm_gain(s), drecent, nullptr);
}

void Model::norm_forward(SublayerActs& a, const Tensor* w, const Tensor& gain) const {
  const float eps = static_cast<float>(cfg_.norm_eps);
  const bool merge = !a.mix_recent.empty();
  const int64_t N = (merge ? a.mix_o : a.x).dim(0), d = cfg_.d_model;
  a.u = new_act(N, d);
  if (merge) {  // one op: x is never stored
    const int64_t m = static_cast<int64_t>(a.mix_recent.size());
    a.mix_stats = new_stat({N, 2 * m + 2});
    kern::mix_merge_norm_forward(a.u, a.mix_stats, *w, a.mix_o, a.mix_lse, a.mix_recent, gain, eps);
    a.mix_lse = Tensor();  // read only here
  } else {
    a.norm_rstd = new_stat({N});
    kern::rmsnorm_forward(a.u, a.norm_rstd, a.x, &gain, eps);
  }
}

void Model::norm_backward(SublayerActs& a, const Tensor& du, Param* query, Param& gain,
                          Span<Tensor> drecent, Tensor* stream, kern::Store drecent_store) {
  if (stream) {
    kern::rmsnorm_backward(*stream, &gain.grad, du, a.x, a.norm_rstd, &gain.value);
    return;
  }
  a.d_o = new_act(du.dim(0), du.dim(1));
  if (!a.mix_stats.defined()) {  // x was the phase-1 output (or the head's stream) itself
    kern::rmsnorm_backward(a.d_o, &gain.grad, du, a.x, a.norm_rstd, &gain.value, kern::Store::Set);
    return;
  }
  // merge + norm backward: d o and dlse for the group's phase 1, recent sources +=
  ATTNRES_CHECK(drecent.size() == a.mix_recent.size(), drecent.size(),
                " recent source gradients for ", a.mix_recent.size(), " recent sources");
  kern::mix_merge_norm_backward(a.d_o, a.mix_dlse_row, drecent, query->grad, gain.grad, du,
                                query->value, a.mix_o, a.mix_recent, gain.value, a.mix_stats,
                                drecent_store);
}

void Model::mix_phase1_backward(int64_t s, Span<SublayerActs> g, DepthGrad& grad) {
  const int64_t S = cfg_.resolved_block_size();
  // The gradients of the sources before s (those of s's own block are back in
  // the partial's); phase 1 read the first mix_sources.size() of them.
  ATTNRES_CHECK(static_cast<int64_t>(grad.sources.size()) == 1 + s / S, "sublayer ", s, ": ",
                grad.sources.size(), " source gradients, expected ", 1 + s / S);
  std::vector<Param*> queries;
  for (size_t q = 0; q < g.size(); ++q) queries.push_back(&mix_query(s + static_cast<int64_t>(q)));
  phase1_backward(g, queries, grad);
}

void Model::phase1_backward(Span<SublayerActs> g, Span<Param* const> queries, DepthGrad& grad,
                            kern::Store sources_store) {
  SublayerActs& leader = g[0];
  std::vector<Tensor> dws, douts, ws;
  for (size_t q = 0; q < g.size(); ++q) {
    dws.push_back(queries[q]->grad);
    ws.push_back(queries[q]->value);
    douts.push_back(g[q].d_o);
    // A query that did not merge has no dlse (its backward wrote no row).
    if (leader.mix_dlse.defined() && !g[q].mix_dlse_row.defined())
      leader.mix_dlse.rows(static_cast<int64_t>(q), 1).zero_();
  }
  kern::mix_backward(Span<Tensor>(grad.sources.data(), leader.mix_sources.size()), dws, douts,
                  leader.mix_dlse.defined() ? &leader.mix_dlse : nullptr, ws, leader.mix_sources,
                  leader.mix_rstd, leader.mix_probs, sources_store);
}

// ---------------------------------------------------------------------------
// Recomputation (training.recompute)
// ---------------------------------------------------------------------------

void Model::drop_recomputable(SublayerActs& a) const {
  if (recompute_ == Recompute::None) return;
  // Kept in every mode: the sublayer's inputs (mix_recent, the baseline's
  // stream x), the group leader's phase-1 sources, weights and dlse buffer,
  // and this sublayer's row of it. The phase-1 output (x in AttnRes modes
  // without a merge) is recomputed.
  a.mix_o = Tensor();
  a.mix_lse = Tensor();
  if (cfg_.attnres()) a.x = Tensor();
  a.mix_stats = a.norm_rstd = a.u = Tensor();
  a.h = a.moe_h = Tensor();
  if (recompute_ == Recompute::Layer)
    a.qkv = a.att = a.lse = a.gu = a.moe_x = a.moe_gu = a.moe_y = Tensor();
}

void Model::recompute_sublayer(int64_t s, SublayerActs& a, const SublayerActs& leader, int64_t B,
                               int64_t T) const {
  const int64_t N = B * T;
  if (cfg_.attnres()) {
    // This query's phase 1 alone: its results are the same bits as in the
    // group's pass (kernels/mix.h); the group's weights were kept.
    const int64_t k = static_cast<int64_t>(leader.mix_sources.size());
    ATTNRES_CHECK(leader.group_size > 0 && k > 0, "sublayer ", s,
                  ": no phase-1 record to recompute from");
    Tensor probs = new_stat({1, N, k});
    Tensor lse;
    const bool merge = !a.mix_recent.empty();
    if (merge) lse = new_stat({1, N});
    a.mix_o = new_act(N, cfg_.d_model);
    kern::mix_forward(Span<Tensor>(&a.mix_o, 1), probs, merge ? &lse : nullptr,
                      Span<const Tensor>(&mix_query(s).value, 1), leader.mix_sources,
                      leader.mix_rstd);
    if (merge) a.mix_lse = lse.reshape({N});
    else a.x = a.mix_o;
  }
  norm_forward(a, cfg_.attnres() ? &mix_query(s).value : nullptr, norm_gain(s).value);
  if (s % 2 == 1) mlp_core(s / 2, a);
  else if (!a.att.defined()) attention_core(s / 2, a, B, T, nullptr);
}

// ---------------------------------------------------------------------------
// Chunks of layers
// ---------------------------------------------------------------------------

void Model::layers_forward(int64_t l0, int64_t l1, DepthState& st, Activations& acts) const {
  acts.first_sublayer = 2 * l0;
  acts.sub.assign(static_cast<size_t>(2 * (l1 - l0)), SublayerActs{});
  sublayers_forward(2 * l0, 2 * l1, st, acts.sub, acts.B, acts.T);
}

void Model::layers_backward(int64_t l0, int64_t l1, Activations& acts, DepthGrad& g) {
  ATTNRES_CHECK(acts.first_sublayer == 2 * l0 && acts.sub.size() == size_t(2 * (l1 - l0)),
                "layers_backward: activations are for another layer range");
  const int64_t G = cfg_.mix_group_size();
  for (int64_t s = 2 * l1 - 1; s >= 2 * l0; --s) {
    SublayerActs& a = acts.sub[s - 2 * l0];
    if (recompute_ != Recompute::None) {
      // The leader of s's Mix group in this chunk (s itself for the baseline).
      const int64_t lead = cfg_.attnres() ? std::max(s / G * G, 2 * l0) : s;
      recompute_sublayer(s, a, acts.sub[lead - 2 * l0], acts.B, acts.T);
    }
    sublayer_backward(s, a, g, acts);
    // Free as we go: the group's phase-1 backward (at its leader) needs only
    // the leader's record and every member's d_o and dlse row.
    SublayerActs rest;
    rest.group_size = a.group_size;
    rest.mix_sources = std::move(a.mix_sources);
    rest.mix_rstd = std::move(a.mix_rstd);
    rest.mix_probs = a.mix_probs;
    rest.mix_dlse = a.mix_dlse;
    rest.mix_dlse_row = a.mix_dlse_row;
    rest.d_o = a.d_o;
    a = std::move(rest);
    if (a.group_size > 0) {  // a group leader: its group is done
      Span<SublayerActs> group(&a, static_cast<size_t>(a.group_size));
      mix_phase1_backward(s, group, g);
      for (SublayerActs& m : group) m = SublayerActs{};
    }
  }
}

// ---------------------------------------------------------------------------
// Head: final Mix, norm, LM head, loss
// ---------------------------------------------------------------------------

Tensor Model::final_norm(const DepthState& st, Activations& acts) const {
  // The head's input is a Mix group of one query over all the completed
  // sources, merged with the unfinished block's partial sum when 2L % S != 0
  // (AttnRes), or the stream (baseline); then the final norm.
  SublayerActs& a = acts.head = SublayerActs{};
  const Tensor* w = nullptr;
  if (cfg_.attnres()) {
    w = &w_.final_query->value;
    const bool merge = st.partial.defined();
    phase1_forward(Span<SublayerActs>(&a, 1), Span<const Tensor>(w, 1),
                   static_cast<int64_t>(st.sources.size()), {merge}, st);
    if (merge) a.mix_recent = {st.partial};
    else a.x = a.mix_o;
  } else {
    a.x = st.hidden;
  }
  norm_forward(a, w, w_.final_norm->value);
  return a.u;
}

void Model::set_logits(DType logits) {
  if (logits == DType::BF16 && dtype_ != DType::BF16)
    fail("bf16 logits need a bf16 model (training.precision = bf16); this one computes in ",
         dtype_name(dtype_));
  ATTNRES_CHECK(logits == DType::F32 || logits == DType::BF16, "logits must be F32 or BF16, got ",
                dtype_name(logits));
  logits_ = logits;
}

double Model::head_loss(const DepthState& st, const Tensor& targets, Activations& acts) {
  const Tensor h = final_norm(st, acts);
  return kern::lm_head_cross_entropy(h, w_.lm_head->value, on_device(targets), nullptr, nullptr, 0.0,
                                     kern::Store::Add, logits_);
}

double Model::head_forward_backward(const DepthState& st, const Tensor& targets, Activations& acts,
                                    DepthGrad& grad, double grad_scale) {
  const int64_t N = acts.B * acts.T, d = cfg_.d_model;
  const Tensor h = final_norm(st, acts);
  Param& w_out = *w_.lm_head;
  const Tensor tgt = on_device(targets);
  Tensor dh = new_act(N, d);
  double loss = kern::lm_head_cross_entropy(h, w_out.value, tgt, &dh, &w_out.grad, grad_scale,
                                            kern::Store::Set, logits_);
  grad = DepthGrad{};
  SublayerActs& a = acts.head;
  Param& g_final = *w_.final_norm;
  if (!cfg_.attnres()) {
    norm_backward(a, dh, nullptr, g_final, {}, nullptr);
    grad.hidden = a.d_o;
    return loss;
  }
  // The head is the first backward to reach the sources: its ops write their
  // gradients (Store::Set), so no buffer is zero-filled first. The final Mix
  // reads every source (a source it did not read would be zeroed here).
  const size_t k = a.mix_sources.size();
  for (size_t j = 0; j < st.sources.size(); ++j)
    grad.sources.push_back(j < k ? new_act(N, d) : zero_act(N, d));
  if (a.mix_stats.defined()) grad.partial = new_act(N, d);
  Param* q = w_.final_query;
  norm_backward(a, dh, q, g_final, a.mix_stats.defined() ? Span<Tensor>(&grad.partial, 1)
                                                         : Span<Tensor>(),
                nullptr, kern::Store::Set);
  phase1_backward(Span<SublayerActs>(&a, 1), Span<Param* const>(&q, 1), grad, kern::Store::Set);
  return loss;
}

// ---------------------------------------------------------------------------
// Whole model
// ---------------------------------------------------------------------------

double Model::forward_backward(const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T,
                               double grad_scale) {
  DepthState st;
  Activations acts;
  embed_forward(tokens, B, T, st, acts);
  layers_forward(0, cfg_.n_layers, st, acts);
  DepthGrad g;
  double loss = head_forward_backward(st, targets, acts, g, grad_scale);
  acts.loss_scale = grad_scale;
  st = DepthState{};  // the activations keep what backward needs
  layers_backward(0, cfg_.n_layers, acts, g);
  embed_backward(acts, g);
  return loss;
}

double Model::forward_loss(const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T) {
  DepthState st;
  Activations acts;
  embed_forward(tokens, B, T, st, acts);
  layers_forward(0, cfg_.n_layers, st, acts);
  acts.sub.clear();
  return head_loss(st, targets, acts);
}

DecodeCache Model::new_decode_cache(int64_t max_len) const {
  DecodeCache c;
  c.max_len = max_len;
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    c.k.push_back(Tensor::zeros({1, max_len, cfg_.n_kv_heads * cfg_.head_dim()}, dtype_, device_));
    c.v.push_back(Tensor::zeros({1, max_len, cfg_.n_kv_heads * cfg_.head_dim()}, dtype_, device_));
  }
  return c;
}

std::vector<float> Model::decode_step(int32_t token, DecodeCache& cache) const {
  DepthState st;
  Activations acts;
  Tensor tok = Tensor::from_vector(std::vector<int32_t>{token}, {1});
  embed_forward(tok, 1, 1, st, acts);
  std::vector<SublayerActs> subs(static_cast<size_t>(cfg_.n_sublayers()));
  sublayers_forward(0, cfg_.n_sublayers(), st, subs, 1, 1, &cache);
  ++cache.pos;
  // Head without the loss: final Mix (or stream), norm, logits.
  const Tensor h = final_norm(st, acts);
  Tensor logits = new_act(1, cfg_.vocab_size);
  kern::matmul_forward(logits, h, w_.lm_head->value);
  Tensor l32 = logits.to(Device::CPU).to(DType::F32);
  return std::vector<float>(l32.data<float>(), l32.data<float>() + cfg_.vocab_size);
}

}  // namespace attnres::model
