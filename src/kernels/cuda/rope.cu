// CUDA RoPE (see kernels/rope.h), in place on the first n_heads heads of each
// row of x [B*T, W], W >= n_heads*head_dim (row stride W: the model rotates
// q's and k's heads of the joint qkv in one call, n_heads = H + Hkv, and the
// rest of the row, v's columns, is left alone).
//
// Like the CPU, a cos/sin table [T, half] is built first, in DOUBLE precision
// (inv_freq = theta^(-2i/hd), angle = (pos0 + t) * inv_freq, then cos/sin) and
// rounded once to float: an fp32 angle would be off by ~1e-4 rad at t ~ 2000.
// The inverse rotation folds its sign into the sin table, as the CPU does.
// The rotation itself uses round-to-nearest intrinsics (no FMA contraction),
// i.e. exactly the CPU's fp32 operations:
//   x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin.
#include "kernels/cuda/rope.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace attnres::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void rope_table_kernel(float* cos_t, float* sin_t, int64_t T, int64_t half,
                                  int64_t head_dim, double theta, int64_t pos0, double sign) {
  const int64_t n = T * half;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const int64_t t = idx / half, i = idx % half;
    const double inv_freq =
        pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double angle = static_cast<double>(pos0 + t) * inv_freq;
    double s, c;
    sincos(angle, &s, &c);
    cos_t[idx] = static_cast<float>(c);
    sin_t[idx] = static_cast<float>(sign * s);
  }
}

// One item = N consecutive i of one (row, head): x1[i..i+N), x2[i..i+N).
// Rows are ld elements apart; only their first n_heads * head_dim are touched.
template <typename T, int N>
__global__ void rope_rotate_kernel(T* x, const float* cos_t, const float* sin_t, int64_t rows,
                                   int64_t T_, int64_t n_heads, int64_t head_dim, int64_t ld) {
  const int64_t half = head_dim / 2;
  const int64_t packs = half / N;  // N divides half
  const int64_t n = rows * n_heads * packs;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const int64_t i = (idx % packs) * N;
    const int64_t rh = idx / packs;  // row * n_heads + head
    const int64_t row = rh / n_heads, head = rh - row * n_heads;
    const int64_t t = row % T_;
    T* x1 = x + row * ld + head * head_dim + i;
    T* x2 = x1 + half;
    const Vec<T, N> a = load<N>(x1), b = load<N>(x2);
    const Vec<float, N> c = load<N>(cos_t + t * half + i), s = load<N>(sin_t + t * half + i);
    Vec<T, N> o1, o2;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float av = to_f32(a.v[e]), bv = to_f32(b.v[e]);
      o1.v[e] = from_f32<T>(__fsub_rn(__fmul_rn(av, c.v[e]), __fmul_rn(bv, s.v[e])));
      o2.v[e] = from_f32<T>(__fadd_rn(__fmul_rn(bv, c.v[e]), __fmul_rn(av, s.v[e])));
    }
    store<N>(x1, o1);
    store<N>(x2, o2);
  }
}

}  // namespace

void rope_rotate(Tensor& x, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                 int64_t pos0, bool inverse) {
  const int64_t half = head_dim / 2;
  if (B == 0 || T == 0 || n_heads == 0 || half == 0) return;

  Tensor table = Tensor::empty({2, T * half}, DType::F32, Device::CUDA);
  float* cos_t = static_cast<float*>(table.raw());
  float* sin_t = cos_t + T * half;
  rope_table_kernel<<<grid_for(T * half, kThreads), kThreads, 0, stream()>>>(
      cos_t, sin_t, T, half, head_dim, static_cast<double>(theta), pos0, inverse ? -1.0 : 1.0);
  ATTNRES_CUDA_CHECK_LAUNCH();

  const int64_t rows = B * T;
  const int64_t ld = x.dim(1);  // row stride: the whole row, of which n_heads heads rotate
  dispatch_float(x, "rope_rotate", [&](auto tag) {
    using U = decltype(tag);
    constexpr int W = 16 / sizeof(U);
    U* px = dptr<U>(x);
    // Packs need W | half (then every x1/x2 offset within a row is a multiple
    // of W), W | ld (then so is every row start: ld need not be n_heads *
    // head_dim, e.g. the joint qkv row) and an aligned base; the table's
    // offsets t*half + i are multiples of W too, and its base comes from the
    // allocator (256-byte aligned).
    const bool vec = half % W == 0 && ld % W == 0 && aligned(px, 16) &&
                     aligned(cos_t, sizeof(float) * W) && aligned(sin_t, sizeof(float) * W);
    if (vec)
      rope_rotate_kernel<U, W><<<grid_for(rows * n_heads * (half / W), kThreads), kThreads, 0, stream()>>>(
          px, cos_t, sin_t, rows, T, n_heads, head_dim, ld);
    else
      rope_rotate_kernel<U, 1><<<grid_for(rows * n_heads * half, kThreads), kThreads, 0, stream()>>>(
          px, cos_t, sin_t, rows, T, n_heads, head_dim, ld);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attnres::kernels::cuda
