// Helpers shared by the sublayer kinds' files (attention.cpp, mlp.cpp,
// moe.cpp): the joint weight matrices make_params keeps in one allocation,
// and the SwiGLU block the dense MLP and the MoE layer's experts both run.
// Internal to src/model/.
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/matmul.h"
#include "kernels/store.h"
#include "kernels/swiglu.h"

namespace attnres::model::sublayer {

namespace kern = attnres::kernels;

// Parameters (values or gradients) that make_params keeps in one allocation,
// as one matrix, their rows in the order given: [Wq; Wk; Wv], [Wgate; Wup].
inline Tensor joined(const std::vector<Tensor>& parts, int64_t l, const char* what) {
  Tensor all = Tensor::joined_rows(parts);
  ATTNRES_CHECK(all.defined(), "layer ", l, ": the ", what, " projections are not in one "
                "allocation (ParamTable::join_rows)");
  return all;
}
inline Tensor qkv_of(const Tensor& q, const Tensor& k, const Tensor& v, int64_t l) {
  return joined({q, k, v}, l, "q, k and v");
}
inline Tensor gate_up_of(const Tensor& gate, const Tensor& up, int64_t l) {
  return joined({gate, up}, l, "gate and up");
}

// A SwiGLU up to its last projection over the rows of u: gate and up in one
// GEMM, gu = u [W_gate; W_up]^T [N, 2F] (gate | up), then h = SwiGLU(gu).
// gu is kept where it is defined already (recompute = mix keeps it).
inline void swiglu_core(Tensor& gu, Tensor& h, const Tensor& u, const Tensor& w_gate_up, DType dtype,
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
inline void swiglu_backward_from_h(Tensor& du, Tensor& dw_gate_up, const Tensor& dh, const Tensor& gu,
                            const Tensor& u, const Tensor& w_gate_up) {
  Tensor dgu = Tensor::empty(gu.shape(), gu.dtype(), gu.device());
  kern::swiglu_backward(dgu, dh, gu, kern::Store::Set);
  kern::matmul_backward(&du, &dw_gate_up, dgu, u, w_gate_up, kern::Store::Set);
}

}  // namespace attnres::model::sublayer
