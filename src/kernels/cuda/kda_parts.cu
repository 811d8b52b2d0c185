// CUDA parts of a KDA layer around its core (see kernels/kda.h, "the layer's
// per-token parts"; the CPU's are kernels/cpu/kda_parts.cpp, whose formulas,
// in the same order, these kernels follow in fp32, each output rounded once).
//
// - Elementwise (the decay's and beta's forward, beta's backward): one thread
//   per element through launch_elementwise, 16-byte packs when every pointer
//   allows them. The convolution's forward and dx are elementwise too, one
//   thread per (row, channel), scalar (a pack would save nothing: each
//   element reads its W taps from W rows anyway). dx recomputes the W
//   pre-activations it needs (W^2 products per element, W = 4 in the layer)
//   instead of keeping dp in an [N, Ch] fp32 buffer, which at training sizes
//   would be larger than x.
// - Per head (the L2 norm, the output gate): one warp per (row, head) of K
//   channels, the warp's sums a shuffle (no block barrier), 8 warps a block.
//
// Parameter gradients (the conv's dw, the decay's da_log and ddt_bias, the
// gate's dw; fp32, grad_dtype) are deterministic without atomics: rows are cut
// into fixed blocks, a thread (or a lane) owns the same columns in every row
// of its block and sums them in row order into the block's partial row, and a
// second kernel adds the partial rows in block order (in double, a fixed tree)
// into the gradient. Every order depends on the shapes only.
//
// The input gradients (dx, df, db, d_o and dz) are added into (Store::Add:
// read, add in fp32, round once) or written (Store::Set: never read). None may
// alias an input: the conv's dx reads dy from W rows.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kda.h"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

// The conv's and the decay's partial blocks: rows per block, and the columns
// (threads) per CUDA block, one thread per column walking the block's rows.
constexpr int64_t kRowBlock = 64;
constexpr int kColThreads = 128;
// The conv's dw: taps summed per pass in registers; W > 8 takes more passes
// (each recomputing its rows' dp), which keeps the register array fixed.
constexpr int kTapsPerPass = 8;
// The per-head kernels: warps per block; the output gate's backward gives
// each warp 32 (row, head) items, so a partial row of dw stands for 256 of
// them and the partial rows stay few.
constexpr int kHeadWarps = 8;
constexpr int64_t kItemsPerWarp = 32;
// Shared memory used without an opt-in.
constexpr int64_t kSmemLimit = 48 * 1024;
// Grid limit of gridDim.y (the conv's and the decay's column tiles).
constexpr int64_t kMaxGridY = 65535;

// ---- parameter-gradient reductions ------------------------------------------

// dst[j] += the sum over the partial rows (in row order, in double) of
// partial[., j], as rmsnorm.cu's dgain: a block takes 32 columns, its 8 warps
// every 8th partial row (a 32-column piece is one coalesced read), then the 8
// slice sums are added in slice order: a fixed tree, the same bits every run.
constexpr int kReduceSlices = 8;
__global__ void __launch_bounds__(32 * kReduceSlices)
    reduce_partials_kernel(float* dst, const float* partial, int64_t n_rows, int64_t n) {
  __shared__ double slice_sum[kReduceSlices][32];
  const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const int64_t j = int64_t(blockIdx.x) * 32 + lane;
  double s = 0;
  if (j < n)
    for (int64_t b = slice; b < n_rows; b += kReduceSlices) s += static_cast<double>(partial[b * n + j]);
  slice_sum[slice][lane] = s;
  __syncthreads();
  if (slice != 0 || j >= n) return;
  for (int k = 1; k < kReduceSlices; ++k) s += slice_sum[k][lane];
  dst[j] += static_cast<float>(s);
}

void reduce_partials(float* dst, const float* partial, int64_t n_rows, int64_t n) {
  if (n == 0 || n_rows == 0) return;
  reduce_partials_kernel<<<static_cast<unsigned>(ceil_div(n, 32)), 32 * kReduceSlices, 0,
                           stream()>>>(dst, partial, n_rows, n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

// da_log[h] += the sum of partial[., h K .. h K + K) over all partial rows: one
// block per head, thread t taking the columns t, t + 128, ... of every row in
// row order (in double), then a block reduction (a fixed tree).
constexpr int kHeadReduceThreads = 128;
__global__ void __launch_bounds__(kHeadReduceThreads)
    reduce_heads_kernel(float* dst, const float* partial, int64_t n_rows, int64_t K, int64_t HK) {
  __shared__ double scratch[32];
  const int64_t h = blockIdx.x;
  double s = 0;
  for (int64_t b = 0; b < n_rows; ++b)
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
      s += static_cast<double>(partial[b * HK + h * K + k]);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) dst[h] += static_cast<float>(s);
}

// ---- the convolution ----------------------------------------------------------

// The pre-activation at row r (token t of its sequence), channel c: the CPU's
// conv_pre, taps before the sequence's start skipped (they read zeros).
template <typename T>
__device__ __forceinline__ float conv_pre(const T* x, const T* w, int64_t r, int64_t t, int64_t c,
                                          int64_t Ch, int64_t W) {
  float p = 0.f;
  for (int64_t j = 0; j < W; ++j) {
    const int64_t back = W - 1 - j;  // x[t - back]
    if (back <= t) p += to_f32(w[c * W + j]) * to_f32(x[(r - back) * Ch + c]);
  }
  return p;
}

template <typename T>
struct ConvForwardOp {  // y = silu(pre)
  T* y;
  const T* x;
  const T* w;
  int64_t Tn, Ch, W;
  template <int N>
  __device__ void apply(int64_t i) const {
    static_assert(N == 1, "the convolution runs element by element");
    const int64_t r = i / Ch, c = i - r * Ch;
    y[i] = from_f32<T>(math::silu<float>(conv_pre(x, w, r, r % Tn, c, Ch, W)));
  }
};

// dx[t', c] (+)= sum_j w[c, j] dp[t' + W - 1 - j, c] within the sequence, with
// dp = dy silu'(pre) recomputed at each of those rows.
template <typename T, bool kAcc>
struct ConvBackwardDxOp {
  T* dx;
  const T* dy;
  const T* x;
  const T* w;
  int64_t Tn, Ch, W;
  template <int N>
  __device__ void apply(int64_t i) const {
    static_assert(N == 1, "the convolution runs element by element");
    const int64_t r = i / Ch, c = i - r * Ch, t = r % Tn;
    float s = 0.f;
    for (int64_t j = 0; j < W; ++j) {
      const int64_t ahead = W - 1 - j;  // dp[t + ahead]
      if (t + ahead < Tn) {
        const int64_t ra = r + ahead;
        const float dp = to_f32(dy[ra * Ch + c]) *
                         math::silu_grad<float>(conv_pre(x, w, ra, t + ahead, c, Ch, W));
        s += to_f32(w[c * W + j]) * dp;
      }
    }
    if constexpr (kAcc) s = to_f32(dx[i]) + s;
    dx[i] = from_f32<T>(s);
  }
};

// dw's partial rows: partial[blk, c W + j] = sum over the block's rows r of
// dp[r, c] x[r - (W - 1 - j), c] (same sequence), in row order. Block
// (blockIdx.x, blockIdx.y) = (row block, 128-column tile); a thread owns one
// channel, so a warp's reads of a row are consecutive.
template <typename T>
__global__ void conv_dw_partial_kernel(float* partial, const T* dy, const T* x, const T* w,
                                       int64_t N, int64_t Tn, int64_t Ch, int64_t W) {
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= Ch) return;
  const int64_t blk = blockIdx.x, r0 = blk * kRowBlock, r1 = min(N, r0 + kRowBlock);
  float* out = partial + (blk * Ch + c) * W;
  for (int64_t j0 = 0; j0 < W; j0 += kTapsPerPass) {
    float acc[kTapsPerPass];
#pragma unroll
    for (int jj = 0; jj < kTapsPerPass; ++jj) acc[jj] = 0.f;
    int64_t t = r0 % Tn;  // advanced with r (no division per row)
    for (int64_t r = r0; r < r1; ++r) {
      const float dp =
          to_f32(dy[r * Ch + c]) * math::silu_grad<float>(conv_pre(x, w, r, t, c, Ch, W));
#pragma unroll
      for (int jj = 0; jj < kTapsPerPass; ++jj) {
        const int64_t j = j0 + jj, ahead = W - 1 - j;  // x[t - ahead]
        if (j < W && ahead <= t) acc[jj] += dp * to_f32(x[(r - ahead) * Ch + c]);
      }
      if (++t == Tn) t = 0;
    }
#pragma unroll
    for (int jj = 0; jj < kTapsPerPass; ++jj)
      if (j0 + jj < W) out[j0 + jj] = acc[jj];
  }
}

// ---- the decay -------------------------------------------------------------------

template <typename T>
struct DecayForwardOp {  // g = -exp(a_log[h]) softplus(f + dt_bias)
  T* g;
  const T* f;
  const T* a_log;
  const T* dt_bias;
  int64_t HK, K;
  template <int N>
  __device__ void apply(int64_t i) const {
    const Vec<T, N> vf = load<N>(f + i);
    Vec<T, N> out;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const int64_t c = (i + e) % HK;  // a pack may cross into the next row
      out.v[e] = from_f32<T>(-expf(to_f32(a_log[c / K])) *
                             math::softplus<float>(to_f32(vf.v[e]) + to_f32(dt_bias[c])));
    }
    store<N>(g + i, out);
  }
};

// g = -e^a softplus(u), u = f + dt_bias: dg/du = -e^a sigmoid(u), dg/da = g.
// A thread owns column c of one row block: it writes df there and sums du
// (ddt_bias's partial) and dg g (da_log's, per column: reduce_heads_kernel
// adds a head's K columns) over the block's rows in row order.
template <typename T, bool kAcc>
__global__ void decay_backward_kernel(T* df, float* pdt, float* pa, const T* dg, const T* f,
                                      const T* a_log, const T* dt_bias, int64_t N, int64_t HK,
                                      int64_t K) {
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= HK) return;
  const int64_t blk = blockIdx.x, r0 = blk * kRowBlock, r1 = min(N, r0 + kRowBlock);
  const float ea = expf(to_f32(a_log[c / K])), bias = to_f32(dt_bias[c]);
  float sdt = 0.f, sa = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r * HK + c;
    const float u = to_f32(f[i]) + bias, d = to_f32(dg[i]);
    const float du = -d * ea * math::sigmoid<float>(u);
    float v = du;
    if constexpr (kAcc) v = to_f32(df[i]) + du;
    df[i] = from_f32<T>(v);
    sdt += du;
    sa += d * (-ea * math::softplus<float>(u));
  }
  pdt[blk * HK + c] = sdt;
  pa[blk * HK + c] = sa;
}

// ---- the write strength -------------------------------------------------------

template <typename T>
struct BetaForwardOp {  // beta = sigmoid(b)
  T* beta;
  const T* b;
  template <int N>
  __device__ void apply(int64_t i) const {
    const Vec<T, N> vb = load<N>(b + i);
    Vec<T, N> out;
#pragma unroll
    for (int e = 0; e < N; ++e) out.v[e] = from_f32<T>(math::sigmoid<float>(to_f32(vb.v[e])));
    store<N>(beta + i, out);
  }
};

template <typename T, bool kAcc>
struct BetaBackwardOp {  // db (+)= dbeta beta (1 - beta)
  T* db;
  const T* dbeta;
  const T* beta;
  template <int N>
  __device__ void apply(int64_t i) const {
    const Vec<T, N> vd = load<N>(dbeta + i), vb = load<N>(beta + i);
    Vec<T, N> out;
    if constexpr (kAcc) out = load<N>(db + i);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float bt = to_f32(vb.v[e]);
      float v = to_f32(vd.v[e]) * bt * (1.f - bt);
      if constexpr (kAcc) v = to_f32(out.v[e]) + v;
      out.v[e] = from_f32<T>(v);
    }
    store<N>(db + i, out);
  }
};

// ---- the per-head norms ------------------------------------------------------

// The warp's (row, head) item for the one-item-per-warp kernels; whole warps
// run past the end together, so their shuffles keep every lane.
__device__ __forceinline__ int64_t warp_item() {
  return int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

// y = x / sqrt(|x|^2 + eps) over each item's K channels.
template <typename T>
__global__ void l2norm_forward_kernel(T* y, const T* x, int64_t items, int64_t K, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t item = warp_item();
  if (item >= items) return;
  const T* xr = x + item * K;
  T* yr = y + item * K;
  float ss = 0.f;
  for (int64_t k = lane; k < K; k += 32) {
    const float a = to_f32(xr[k]);
    ss += a * a;
  }
  ss = warp_sum(ss);
  const float inv = 1.f / sqrtf(ss + eps);
  for (int64_t k = lane; k < K; k += 32) yr[k] = from_f32<T>(to_f32(xr[k]) * inv);
}

// dx (+)= r (dy - y (y . dy)), y = x r, r = (|x|^2 + eps)^(-1/2). One pass
// takes |x|^2 and x . dy together (y . dy = r (x . dy)), a second writes dx.
template <typename T, bool kAcc>
__global__ void l2norm_backward_kernel(T* dx, const T* dy, const T* x, int64_t items, int64_t K,
                                       float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t item = warp_item();
  if (item >= items) return;
  const int64_t base = item * K;
  float ss = 0.f, xd = 0.f;
  for (int64_t k = lane; k < K; k += 32) {
    const float a = to_f32(x[base + k]);
    ss += a * a;
    xd += a * to_f32(dy[base + k]);
  }
  ss = warp_sum(ss);
  xd = warp_sum(xd);
  const float inv = 1.f / sqrtf(ss + eps), yd = inv * xd;
  for (int64_t k = lane; k < K; k += 32) {
    float v = inv * (to_f32(dy[base + k]) - to_f32(x[base + k]) * inv * yd);
    if constexpr (kAcc) v = to_f32(dx[base + k]) + v;
    dx[base + k] = from_f32<T>(v);
  }
}

// y = o rs w sigmoid(z), rs = rstd over the item's K channels, w [K] shared
// by the heads.
template <typename T>
__global__ void out_gate_forward_kernel(T* y, const T* o, const T* w, const T* z, int64_t items,
                                        int64_t K, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t item = warp_item();
  if (item >= items) return;
  const int64_t base = item * K;
  float ss = 0.f;
  for (int64_t k = lane; k < K; k += 32) {
    const float a = to_f32(o[base + k]);
    ss += a * a;
  }
  ss = warp_sum(ss);
  const float rs = math::rstd_from_sum_sq<float>(ss, K, eps);
  for (int64_t k = lane; k < K; k += 32)
    y[base + k] = from_f32<T>(to_f32(o[base + k]) * rs * to_f32(w[k]) *
                              math::sigmoid<float>(to_f32(z[base + k])));
}

// n = o rs, s = sigmoid(z), y = n w s: dn = dy w s, dw += dy n s,
// dz = dy n w s (1 - s), do = rs (dn - n (n . dn) / K).
// A block of `warps` warps takes warps * kItemsPerWarp consecutive items,
// warp w the items w, w + warps, ... of them. The first pass takes |o|^2 and
// o . dn together (n . dn = rs (o . dn)), the second writes dz and d_o and
// adds dy n s into the warp's dw row: lane-owned columns (k = lane + 32 m, the
// same in every item), so no race. The warps' rows (in dynamic shared memory
// when they fit, else this block's slice of a global scratch buffer) are then
// summed in warp order into the block's partial row of dw.
template <typename T, bool kAcc>
__global__ void out_gate_backward_kernel(T* d_o, T* dz, float* partial, float* acc_global,
                                         const T* dy, const T* o, const T* w, const T* z,
                                         int64_t items, int64_t K, float eps) {
  extern __shared__ float acc_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float* acc_block = acc_global ? acc_global + int64_t(blockIdx.x) * warps * K : acc_smem;
  float* acc = acc_block + int64_t(warp) * K;
  for (int64_t k = lane; k < K; k += 32) acc[k] = 0.f;  // the lane's own columns

  const int64_t i0 = int64_t(blockIdx.x) * warps * kItemsPerWarp;
  const int64_t i1 = min(items, i0 + int64_t(warps) * kItemsPerWarp);
  for (int64_t item = i0 + warp; item < i1; item += warps) {
    const int64_t base = item * K;
    float ss = 0.f, odn = 0.f;
    for (int64_t k = lane; k < K; k += 32) {
      const float a = to_f32(o[base + k]), s = math::sigmoid<float>(to_f32(z[base + k]));
      ss += a * a;
      odn += a * (to_f32(dy[base + k]) * to_f32(w[k]) * s);
    }
    ss = warp_sum(ss);
    odn = warp_sum(odn);
    const float rs = math::rstd_from_sum_sq<float>(ss, K, eps), ndn = rs * odn;
    for (int64_t k = lane; k < K; k += 32) {
      const float a = to_f32(o[base + k]), n = a * rs, wk = to_f32(w[k]);
      const float s = math::sigmoid<float>(to_f32(z[base + k])), d = to_f32(dy[base + k]);
      const float dn = d * wk * s;
      acc[k] += d * n * s;
      float vz = d * n * wk * s * (1.f - s);
      float vo = rs * (dn - a * rs * ndn / static_cast<float>(K));
      if constexpr (kAcc) {
        vz = to_f32(dz[base + k]) + vz;
        vo = to_f32(d_o[base + k]) + vo;
      }
      dz[base + k] = from_f32<T>(vz);
      d_o[base + k] = from_f32<T>(vo);
    }
  }

  __syncthreads();  // every warp's row complete
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    float s = 0.f;
    for (int ww = 0; ww < warps; ++ww) s += acc_block[int64_t(ww) * K + j];
    partial[int64_t(blockIdx.x) * K + j] = s;
  }
}

// Blocks of the one-warp-per-item kernels.
unsigned item_blocks(int64_t items) {
  return static_cast<unsigned>(ceil_div(items, kHeadWarps));
}

// The (row blocks, column tiles) grid of the conv's and the decay's partial
// kernels.
dim3 partial_grid(const char* op, int64_t rows, int64_t cols) {
  const int64_t tiles = ceil_div(cols, kColThreads);
  if (tiles > kMaxGridY) fail(op, ": ", cols, " columns are more than the kernel's grid takes");
  return dim3(static_cast<unsigned>(ceil_div(rows, kRowBlock)), static_cast<unsigned>(tiles));
}

float* f32_ptr(Tensor& t) { return static_cast<float*>(t.raw()); }

}  // namespace

void kda_conv_forward(Tensor& y, const Tensor& x, const Tensor& w, int64_t B, int64_t T) {
  const int64_t N = B * T, Ch = x.dim(1), W = w.dim(1);
  if (N * Ch == 0) return;
  dispatch_float(x, "kda_conv_forward", [&](auto tag) {
    using E = decltype(tag);
    launch_elementwise<1>(N * Ch, false,
                          ConvForwardOp<E>{dptr<E>(y), dptr<E>(x), dptr<E>(w), T, Ch, W});
  });
}

void kda_conv_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       int64_t B, int64_t T, Store dx_store) {
  const char* op = "kda_conv_backward";
  const int64_t N = B * T, Ch = x.dim(1), W = w.dim(1);
  if (N * Ch == 0) return;
  float* pdw = dptr<float>(dw);
  const dim3 grid = partial_grid(op, N, Ch);
  Tensor partial;
  if (W > 0) partial = Tensor::empty({int64_t(grid.x), Ch * W}, DType::F32, Device::CUDA);
  dispatch_float(x, op, [&](auto tag) {
    using E = decltype(tag);
    E* pdx = dptr<E>(dx);
    const E* pdy = dptr<E>(dy);
    const E* px = dptr<E>(x);
    const E* pw = dptr<E>(w);
    if (dx_store == Store::Add)
      launch_elementwise<1>(N * Ch, false, ConvBackwardDxOp<E, true>{pdx, pdy, px, pw, T, Ch, W});
    else
      launch_elementwise<1>(N * Ch, false, ConvBackwardDxOp<E, false>{pdx, pdy, px, pw, T, Ch, W});
    if (W == 0) return;
    conv_dw_partial_kernel<E><<<grid, kColThreads, 0, stream()>>>(f32_ptr(partial), pdy, px, pw, N,
                                                                 T, Ch, W);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
  if (W > 0) reduce_partials(pdw, f32_ptr(partial), grid.x, Ch * W);
}

void kda_l2norm_forward(Tensor& y, const Tensor& x, int64_t K, double eps) {
  const int64_t items = x.numel() / K;
  if (items == 0) return;
  dispatch_float(x, "kda_l2norm_forward", [&](auto tag) {
    using E = decltype(tag);
    l2norm_forward_kernel<E><<<item_blocks(items), kHeadWarps * 32, 0, stream()>>>(
        dptr<E>(y), dptr<E>(x), items, K, static_cast<float>(eps));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void kda_l2norm_backward(Tensor& dx, const Tensor& dy, const Tensor& x, int64_t K, double eps,
                         Store dx_store) {
  const int64_t items = x.numel() / K;
  if (items == 0) return;
  dispatch_float(x, "kda_l2norm_backward", [&](auto tag) {
    using E = decltype(tag);
    const auto kernel =
        dx_store == Store::Add ? l2norm_backward_kernel<E, true> : l2norm_backward_kernel<E, false>;
    kernel<<<item_blocks(items), kHeadWarps * 32, 0, stream()>>>(
        dptr<E>(dx), dptr<E>(dy), dptr<E>(x), items, K, static_cast<float>(eps));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void kda_decay_forward(Tensor& g, const Tensor& f, const Tensor& a_log, const Tensor& dt_bias,
                       int64_t K) {
  const int64_t HK = f.dim(1);
  if (f.numel() == 0) return;
  dispatch_float(f, "kda_decay_forward", [&](auto tag) {
    using E = decltype(tag);
    constexpr int P = pack_of<E>();
    const DecayForwardOp<E> op{dptr<E>(g), dptr<E>(f), dptr<E>(a_log), dptr<E>(dt_bias), HK, K};
    launch_elementwise<P>(f.numel(), aligned(op.g, 16) && aligned(op.f, 16), op);
  });
}

void kda_decay_backward(Tensor& df, Tensor& da_log, Tensor& ddt_bias, const Tensor& dg,
                        const Tensor& f, const Tensor& a_log, const Tensor& dt_bias, int64_t K,
                        Store df_store) {
  const char* op = "kda_decay_backward";
  const int64_t N = f.dim(0), HK = f.dim(1), H = HK / K;
  if (f.numel() == 0) return;
  float* pda = dptr<float>(da_log);
  float* pddt = dptr<float>(ddt_bias);
  const dim3 grid = partial_grid(op, N, HK);
  // ddt_bias's partial rows, then da_log's (per column), in one buffer.
  Tensor partial = Tensor::empty({2 * int64_t(grid.x), HK}, DType::F32, Device::CUDA);
  float* pdt = f32_ptr(partial);
  float* pa = pdt + int64_t(grid.x) * HK;
  dispatch_float(f, op, [&](auto tag) {
    using E = decltype(tag);
    const auto kernel =
        df_store == Store::Add ? decay_backward_kernel<E, true> : decay_backward_kernel<E, false>;
    kernel<<<grid, kColThreads, 0, stream()>>>(dptr<E>(df), pdt, pa, dptr<E>(dg), dptr<E>(f),
                                               dptr<E>(a_log), dptr<E>(dt_bias), N, HK, K);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
  reduce_partials(pddt, pdt, grid.x, HK);
  reduce_heads_kernel<<<static_cast<unsigned>(H), kHeadReduceThreads, 0, stream()>>>(
      pda, pa, grid.x, K, HK);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void kda_beta_forward(Tensor& beta, const Tensor& b) {
  if (b.numel() == 0) return;
  dispatch_float(b, "kda_beta_forward", [&](auto tag) {
    using E = decltype(tag);
    constexpr int P = pack_of<E>();
    const BetaForwardOp<E> op{dptr<E>(beta), dptr<E>(b)};
    launch_elementwise<P>(b.numel(), aligned(op.beta, 16) && aligned(op.b, 16), op);
  });
}

void kda_beta_backward(Tensor& db, const Tensor& dbeta, const Tensor& beta, Store db_store) {
  if (beta.numel() == 0) return;
  dispatch_float(beta, "kda_beta_backward", [&](auto tag) {
    using E = decltype(tag);
    constexpr int P = pack_of<E>();
    E* pdb = dptr<E>(db);
    const E* pd = dptr<E>(dbeta);
    const E* pb = dptr<E>(beta);
    const bool vec = aligned(pdb, 16) && aligned(pd, 16) && aligned(pb, 16);
    if (db_store == Store::Add)
      launch_elementwise<P>(beta.numel(), vec, BetaBackwardOp<E, true>{pdb, pd, pb});
    else
      launch_elementwise<P>(beta.numel(), vec, BetaBackwardOp<E, false>{pdb, pd, pb});
  });
}

void kda_out_gate_forward(Tensor& y, const Tensor& o, const Tensor& w, const Tensor& z, int64_t K,
                          double eps) {
  const int64_t items = o.numel() / K;
  if (items == 0) return;
  dispatch_float(o, "kda_out_gate_forward", [&](auto tag) {
    using E = decltype(tag);
    out_gate_forward_kernel<E><<<item_blocks(items), kHeadWarps * 32, 0, stream()>>>(
        dptr<E>(y), dptr<E>(o), dptr<E>(w), dptr<E>(z), items, K, static_cast<float>(eps));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void kda_out_gate_backward(Tensor& d_o, Tensor& dw, Tensor& dz, const Tensor& dy, const Tensor& o,
                           const Tensor& w, const Tensor& z, int64_t K, double eps, Store store) {
  const char* op = "kda_out_gate_backward";
  const int64_t items = o.numel() / K;
  if (items == 0) return;
  float* pdw = dptr<float>(dw);
  // Warps per block: as many (up to 8) as have a dw row in shared memory;
  // past K = 12288 not even one fits, and the rows go to global memory.
  const int64_t row_bytes = K * int64_t(sizeof(float));
  const bool acc_in_smem = row_bytes <= kSmemLimit;
  const int warps = acc_in_smem
                        ? static_cast<int>(std::min<int64_t>(kHeadWarps, kSmemLimit / row_bytes))
                        : kHeadWarps;
  const int64_t blocks = ceil_div(items, warps * kItemsPerWarp);
  const size_t smem = acc_in_smem ? static_cast<size_t>(warps * row_bytes) : 0;
  Tensor partial = Tensor::empty({blocks, K}, DType::F32, Device::CUDA), scratch;
  if (!acc_in_smem) scratch = Tensor::empty({blocks * warps, K}, DType::F32, Device::CUDA);
  float* pscratch = acc_in_smem ? nullptr : f32_ptr(scratch);
  dispatch_float(o, op, [&](auto tag) {
    using E = decltype(tag);
    const auto kernel = store == Store::Add ? out_gate_backward_kernel<E, true>
                                            : out_gate_backward_kernel<E, false>;
    kernel<<<static_cast<unsigned>(blocks), warps * 32, smem, stream()>>>(
        dptr<E>(d_o), dptr<E>(dz), f32_ptr(partial), pscratch, dptr<E>(dy), dptr<E>(o),
        dptr<E>(w), dptr<E>(z), items, K, static_cast<float>(eps));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
  reduce_partials(pdw, f32_ptr(partial), blocks, K);
}

}  // namespace attnres::kernels::cuda
