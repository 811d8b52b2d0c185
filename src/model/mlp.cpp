// The MLP sublayer: the dense SwiGLU (docs/model.md section 2), and the
// switch to a MoE layer's (model/moe.cpp) where model.moe makes layer l one.
#include "model/model.h"

#include "kernels/matmul.h"
#include "model/sublayer_common.h"

namespace attnres::model {

namespace kern = attnres::kernels;

using sublayer::gate_up_of;
using sublayer::swiglu_backward_from_h;
using sublayer::swiglu_core;

void Model::mlp_forward(int64_t l, SublayerActs& a, Tensor& y, const Tensor* residual) const {
  mlp_core(l, a);
  if (cfg_.moe_layer(l)) moe_output(l, a, y, residual);
  else kern::matmul_forward(y, a.h, layer(l).down->value, residual);
}

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

}  // namespace attnres::model
