// CUDA SwiGLU (see kernels/swiglu.h): elementwise, fp32 arithmetic through
// math::silu / math::silu_grad (the CPU's functions), 16-byte packs when every
// pointer allows them, element by element otherwise (launch_elementwise).
#include "kernels/cuda/swiglu.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

template <typename T>
struct ForwardOp {  // h = silu(gate) * up
  T* h;
  const T* gate;
  const T* up;
  template <int N>
  __device__ void apply(int64_t i) const {
    const Vec<T, N> g = load<N>(gate + i), u = load<N>(up + i);
    Vec<T, N> out;
#pragma unroll
    for (int j = 0; j < N; ++j)
      out.v[j] = from_f32<T>(math::silu<float>(to_f32(g.v[j])) * to_f32(u.v[j]));
    store<N>(h + i, out);
  }
};

// kAcc: dgate/dup += (read, add in fp32, round once); else = (never read).
template <typename T, bool kAcc>
struct BackwardOp {
  T* dgate;
  T* dup;
  const T* dh;
  const T* gate;
  const T* up;
  template <int N>
  __device__ void apply(int64_t i) const {
    const Vec<T, N> g = load<N>(gate + i), u = load<N>(up + i), d = load<N>(dh + i);
    Vec<T, N> dg, du;
    if constexpr (kAcc) dg = load<N>(dgate + i), du = load<N>(dup + i);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float gj = to_f32(g.v[j]), dj = to_f32(d.v[j]);
      float vg = dj * to_f32(u.v[j]) * math::silu_grad<float>(gj);
      float vu = dj * math::silu<float>(gj);
      if constexpr (kAcc) vg += to_f32(dg.v[j]), vu += to_f32(du.v[j]);
      dg.v[j] = from_f32<T>(vg);
      du.v[j] = from_f32<T>(vu);
    }
    store<N>(dgate + i, dg);
    store<N>(dup + i, du);
  }
};

}  // namespace

void swiglu_forward(Tensor& h, const Tensor& gate, const Tensor& up) {
  if (gate.numel() == 0) return;
  dispatch_float(gate, "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    const ForwardOp<T> op{dptr<T>(h), dptr<T>(gate), dptr<T>(up)};
    const bool vec = aligned(op.h, 16) && aligned(op.gate, 16) && aligned(op.up, 16);
    launch_elementwise<pack_of<T>()>(gate.numel(), vec, op);
  });
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dh, const Tensor& gate,
                     const Tensor& up, Store store) {
  if (gate.numel() == 0) return;
  dispatch_float(gate, "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    T* pdg = dptr<T>(dgate);
    T* pdu = dptr<T>(dup);
    const T* pdh = dptr<T>(dh);
    const T* pg = dptr<T>(gate);
    const T* pu = dptr<T>(up);
    const bool vec = aligned(pdg, 16) && aligned(pdu, 16) && aligned(pdh, 16) && aligned(pg, 16) &&
                     aligned(pu, 16);
    constexpr int W = pack_of<T>();
    if (store == Store::Add)
      launch_elementwise<W>(gate.numel(), vec, BackwardOp<T, true>{pdg, pdu, pdh, pg, pu});
    else
      launch_elementwise<W>(gate.numel(), vec, BackwardOp<T, false>{pdg, pdu, pdh, pg, pu});
  });
}

}  // namespace attnres::kernels::cuda
