// CUDA SwiGLU (see kernels/swiglu.h): elementwise, fp32 arithmetic through
// math::silu / math::silu_grad (the CPU's functions), 16-byte packs when every
// pointer allows them, element by element otherwise.
#include "kernels/cuda/swiglu.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T, int N>
__device__ __forceinline__ void forward_at(int64_t i, T* h, const T* gate, const T* up) {
  const Vec<T, N> g = load<N>(gate + i), u = load<N>(up + i);
  Vec<T, N> out;
#pragma unroll
  for (int j = 0; j < N; ++j)
    out.v[j] = from_f32<T>(math::silu<float>(to_f32(g.v[j])) * to_f32(u.v[j]));
  store<N>(h + i, out);
}

// kAcc: dgate/dup += (read, add in fp32, round once); else = (never read).
template <typename T, int N, bool kAcc>
__device__ __forceinline__ void backward_at(int64_t i, T* dgate, T* dup, const T* dh,
                                            const T* gate, const T* up) {
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

// kVec: packs of 16 bytes, then the tail element by element.
template <typename T, bool kVec>
__global__ void swiglu_forward_kernel(T* h, const T* gate, const T* up, int64_t n) {
  constexpr int W = 16 / sizeof(T);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (kVec) {
    const int64_t nv = n / W;
    for (int64_t k = tid; k < nv; k += stride) forward_at<T, W>(k * W, h, gate, up);
    tail = nv * W;
  }
  for (int64_t i = tail + tid; i < n; i += stride) forward_at<T, 1>(i, h, gate, up);
}

template <typename T, bool kVec, bool kAcc>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dh, const T* gate, const T* up,
                                       int64_t n) {
  constexpr int W = 16 / sizeof(T);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (kVec) {
    const int64_t nv = n / W;
    for (int64_t k = tid; k < nv; k += stride)
      backward_at<T, W, kAcc>(k * W, dgate, dup, dh, gate, up);
    tail = nv * W;
  }
  for (int64_t i = tail + tid; i < n; i += stride)
    backward_at<T, 1, kAcc>(i, dgate, dup, dh, gate, up);
}

template <typename T, bool kAcc>
void launch_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t n) {
  constexpr int W = 16 / sizeof(T);
  if (aligned(dgate, 16) && aligned(dup, 16) && aligned(dh, 16) && aligned(gate, 16) &&
      aligned(up, 16))
    swiglu_backward_kernel<T, true, kAcc>
        <<<grid_for(ceil_div(n, W), kThreads), kThreads, 0, stream()>>>(dgate, dup, dh, gate, up, n);
  else
    swiglu_backward_kernel<T, false, kAcc>
        <<<grid_for(n, kThreads), kThreads, 0, stream()>>>(dgate, dup, dh, gate, up, n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swiglu_forward(Tensor& h, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  dispatch_float(gate, "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = 16 / sizeof(T);
    T* ph = dptr<T>(h);
    const T* pg = dptr<T>(gate);
    const T* pu = dptr<T>(up);
    if (aligned(ph, 16) && aligned(pg, 16) && aligned(pu, 16))
      swiglu_forward_kernel<T, true><<<grid_for(ceil_div(n, W), kThreads), kThreads, 0, stream()>>>(ph, pg, pu, n);
    else
      swiglu_forward_kernel<T, false><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ph, pg, pu, n);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dh, const Tensor& gate,
                     const Tensor& up, Store store) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  dispatch_float(gate, "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const auto launch = store == Store::Add ? launch_backward<T, true> : launch_backward<T, false>;
    launch(dptr<T>(dgate), dptr<T>(dup), dptr<T>(dh), dptr<T>(gate), dptr<T>(up), n);
  });
}

}  // namespace attnres::kernels::cuda
