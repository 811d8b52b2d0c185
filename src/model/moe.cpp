// The mixture-of-experts MLP (model.moe; kernels/moe.h): routing, the
// shared and routed experts (grouped GEMMs), the expert exchange of expert
// parallelism, the combine, their backward, and the routers' balancing bias.
#include "model/model.h"

#include <algorithm>

#include "kernels/common.h"
#include "kernels/grouped_matmul.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/reduce.h"
#include "kernels/swiglu.h"
#include "model/sublayer_common.h"

namespace attnres::model {

namespace kern = attnres::kernels;

using sublayer::gate_up_of;
using sublayer::swiglu_backward_from_h;
using sublayer::swiglu_core;

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

}  // namespace attnres::model
