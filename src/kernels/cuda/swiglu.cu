// CUDA SwiGLU (see kernels/swiglu.h): elementwise over h's N x F values, fp32
// arithmetic through math::silu / math::silu_grad (the CPU's functions).
// Element i of h (row i / F, column i % F) reads gate at row * 2F + column and
// up F further on. 16-byte packs when F is a multiple of the pack (a pack then
// never straddles two rows, and gate's and up's packs are aligned like gu's
// start) and every pointer allows them; element by element otherwise
// (launch_elementwise).
#include "kernels/cuda/swiglu.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

// Index of the gate value of h's element i in gu (up is F further on).
__device__ __forceinline__ int64_t gate_index(int64_t i, int64_t F) { return i + (i / F) * F; }

template <typename T>
struct ForwardOp {  // h = silu(gate) * up
  T* h;
  const T* gu;
  int64_t F;
  template <int N>
  __device__ void apply(int64_t i) const {
    const int64_t g = gate_index(i, F);
    const Vec<T, N> gv = load<N>(gu + g), uv = load<N>(gu + g + F);
    Vec<T, N> out;
#pragma unroll
    for (int j = 0; j < N; ++j)
      out.v[j] = from_f32<T>(math::silu<float>(to_f32(gv.v[j])) * to_f32(uv.v[j]));
    store<N>(h + i, out);
  }
};

// kAcc: dgu += (read, add in fp32, round once); else = (never read).
template <typename T, bool kAcc>
struct BackwardOp {
  T* dgu;
  const T* dh;
  const T* gu;
  int64_t F;
  template <int N>
  __device__ void apply(int64_t i) const {
    const int64_t g = gate_index(i, F);
    const Vec<T, N> gv = load<N>(gu + g), uv = load<N>(gu + g + F), d = load<N>(dh + i);
    Vec<T, N> dg, du;
    if constexpr (kAcc) dg = load<N>(dgu + g), du = load<N>(dgu + g + F);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float gj = to_f32(gv.v[j]), dj = to_f32(d.v[j]);
      float vg = dj * to_f32(uv.v[j]) * math::silu_grad<float>(gj);
      float vu = dj * math::silu<float>(gj);
      if constexpr (kAcc) vg += to_f32(dg.v[j]), vu += to_f32(du.v[j]);
      dg.v[j] = from_f32<T>(vg);
      du.v[j] = from_f32<T>(vu);
    }
    store<N>(dgu + g, dg);
    store<N>(dgu + g + F, du);
  }
};

}  // namespace

void swiglu_forward(Tensor& h, const Tensor& gu) {
  if (h.numel() == 0) return;
  const int64_t F = h.dim(1);
  dispatch_float(gu, "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();
    const ForwardOp<T> op{dptr<T>(h), dptr<T>(gu), F};
    const bool vec = F % W == 0 && aligned(op.h, 16) && aligned(op.gu, 16);
    launch_elementwise<W>(h.numel(), vec, op);
  });
}

void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, Store store) {
  if (dh.numel() == 0) return;
  const int64_t F = dh.dim(1);
  dispatch_float(gu, "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();
    T* pdgu = dptr<T>(dgu);
    const T* pdh = dptr<T>(dh);
    const T* pgu = dptr<T>(gu);
    const bool vec = F % W == 0 && aligned(pdgu, 16) && aligned(pdh, 16) && aligned(pgu, 16);
    if (store == Store::Add)
      launch_elementwise<W>(dh.numel(), vec, BackwardOp<T, true>{pdgu, pdh, pgu, F});
    else
      launch_elementwise<W>(dh.numel(), vec, BackwardOp<T, false>{pdgu, pdh, pgu, F});
  });
}

}  // namespace attnres::kernels::cuda
