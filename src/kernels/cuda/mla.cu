// CUDA MLA expansion (see kernels/mla.h): a thread per output element, each a
// copy or (on the dr dims, with RoPE) one rotation of its pair, as the CPU
// (kernels/cpu/mla.cpp). RoPE is ours (kernels/cuda/rope.cu): rotate-half over
// the dr dims, angle (pos0 + t) theta^(-2i/dr) in double and cos / sin rounded
// once to float, the rotation in round-to-nearest fp32 without contraction.
// The backward's k_r sums the H heads' gradients in head order, then rotates
// back once (the rotation is linear and the same for every head).
#include "kernels/cuda/mla.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace attnres::kernels::cuda {

namespace {

constexpr int kThreads = 256;

struct Dims {
  int64_t B, T, H, dn, dr, dv, dqk, W;
  double theta;  // 0: no rotation
  int64_t pos0;
  double sign;   // +1 forward, -1 the inverse rotation
};

// Element i (< dr) of a rotated dr-vector x at token t: x1' = x1 c - x2 s for
// i < dr/2, x2' = x2 c + x1 s above (x1 = x[i mod half], x2 = x[i mod half + half]).
__device__ float rotated(const Dims& d, int64_t t, int64_t i, float x1, float x2) {
  const int64_t half = d.dr / 2, f = i % half;
  const double inv_freq = pow(d.theta, -2.0 * double(f) / double(d.dr));
  double s, c;
  sincos(double(d.pos0 + t) * inv_freq, &s, &c);
  const float cf = float(c), sf = float(d.sign * s);
  return i < half ? __fsub_rn(__fmul_rn(x1, cf), __fmul_rn(x2, sf))
                  : __fadd_rn(__fmul_rn(x2, cf), __fmul_rn(x1, sf));
}

// dr-vector element i of `x` (its dr dims at x), rotated when the shape asks.
template <typename T>
__device__ float rope_dim(const Dims& d, int64_t t, int64_t i, const T* x) {
  if (d.theta <= 0) return to_f32(x[i]);
  const int64_t half = d.dr / 2, f = i % half;
  return rotated(d, t, i, to_f32(x[f]), to_f32(x[f + half]));
}

template <typename T>
__global__ void forward_kernel(Dims d, T* __restrict__ qkv, const T* __restrict__ q,
                               const T* __restrict__ kv, const T* __restrict__ kr) {
  const int64_t n = d.B * d.T * d.W, HQ = d.H * d.dqk, KV = d.dn + d.dv;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / d.W, x = idx % d.W, t = r % d.T;
    float v;
    if (x < HQ) {  // a query head: [q_n | q_r]
      const int64_t h = x / d.dqk, c = x % d.dqk;
      const T* qh = q + r * HQ + h * d.dqk;
      v = c < d.dn ? to_f32(qh[c]) : rope_dim(d, t, c - d.dn, qh + d.dn);
    } else if (x < 2 * HQ) {  // a key head: [k_n,h | k_r]
      const int64_t h = (x - HQ) / d.dqk, c = (x - HQ) % d.dqk;
      v = c < d.dn ? to_f32(kv[r * d.H * KV + h * KV + c]) : rope_dim(d, t, c - d.dn, kr + r * d.dr);
    } else {  // a value head
      const int64_t h = (x - 2 * HQ) / d.dv, e = (x - 2 * HQ) % d.dv;
      v = to_f32(kv[r * d.H * KV + h * KV + d.dn + e]);
    }
    qkv[idx] = from_f32<T>(v);
  }
}

template <typename T>
__global__ void backward_kernel(Dims d, T* __restrict__ dq, T* __restrict__ dkv,
                                T* __restrict__ dkr, const T* __restrict__ dqkv) {
  const int64_t HQ = d.H * d.dqk, KV = d.dn + d.dv, per_row = HQ + d.H * KV + d.dr;
  const int64_t n = d.B * d.T * per_row;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row, x = idx % per_row, t = r % d.T;
    const T* row = dqkv + r * d.W;
    if (x < HQ) {  // dq: the queries' gradient, q_r's rotated back
      const int64_t h = x / d.dqk, c = x % d.dqk;
      const T* gh = row + h * d.dqk;
      dq[r * HQ + x] = from_f32<T>(c < d.dn ? to_f32(gh[c]) : rope_dim(d, t, c - d.dn, gh + d.dn));
    } else if (x < HQ + d.H * KV) {  // dkv: k_n,h's and v_h's gradients
      const int64_t y = x - HQ, h = y / KV, c = y % KV;
      const float g = c < d.dn ? to_f32(row[HQ + h * d.dqk + c])
                               : to_f32(row[2 * HQ + h * d.dv + (c - d.dn)]);
      dkv[r * d.H * KV + y] = from_f32<T>(g);
    } else {  // dkr: the heads' k_r gradients summed in head order, rotated back once
      const int64_t i = x - HQ - d.H * KV;
      auto sum = [&](int64_t j) {
        float s = 0.f;
        for (int64_t h = 0; h < d.H; ++h) s += to_f32(row[HQ + h * d.dqk + d.dn + j]);
        return s;
      };
      float g;
      if (d.theta <= 0) {
        g = sum(i);
      } else {
        const int64_t half = d.dr / 2, f = i % half;
        g = rotated(d, t, i, sum(f), sum(f + half));
      }
      dkr[r * d.dr + i] = from_f32<T>(g);
    }
  }
}

Dims dims_of(const MlaShape& s, double theta, int64_t pos0, bool inverse) {
  const int64_t dqk = s.dn + s.dr;
  return {s.B, s.T, s.H, s.dn, s.dr, s.dv, dqk, 2 * s.H * dqk + s.H * s.dv,
          s.dr > 0 ? theta : 0.0, pos0, inverse ? -1.0 : 1.0};
}

}  // namespace

void mla_expand_forward(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& kr,
                        const MlaShape& s, double rope_theta, int64_t pos0) {
  const Dims d = dims_of(s, rope_theta, pos0, false);
  const int64_t n = d.B * d.T * d.W;
  if (n == 0) return;
  dispatch_float(qkv, "mla_expand_forward", [&](auto tag) {
    using T = decltype(tag);
    forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        d, dptr<T>(qkv), dptr<T>(q), dptr<T>(kv), dptr<T>(kr));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void mla_expand_backward(Tensor& dq, Tensor& dkv, Tensor& dkr, const Tensor& dqkv,
                         const MlaShape& s, double rope_theta, int64_t pos0) {
  const Dims d = dims_of(s, rope_theta, pos0, true);
  const int64_t n = d.B * d.T * (d.H * d.dqk + d.H * (d.dn + d.dv) + d.dr);
  if (n == 0) return;
  dispatch_float(dqkv, "mla_expand_backward", [&](auto tag) {
    using T = decltype(tag);
    backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        d, dptr<T>(dq), dptr<T>(dkv), dptr<T>(dkr), dptr<T>(dqkv));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attnres::kernels::cuda
