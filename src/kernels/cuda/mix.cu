// CUDA AttnRes depth Mix (see kernels/mix.h, MODEL.md section 2, and the CPU
// reference kernels/cpu/mix.cpp).
//
// The op is memory-bound: per token row it streams k source rows of d
// elements and does O(k d) FLOPs. Design:
//
// - Row groups. A group of threads owns one token row at a time: one warp
//   when d <= 1024 (several rows per block; reductions are warp shuffles, no
//   block barrier), else a whole block of ceil(d / 1024) warps, at most 8
//   (so d <= 8192; reductions through shared memory). Thread t of a group of G owns VPT "slots" of 8
//   consecutive elements, slot i covering [(i G + t) 8, +8): one 16-byte load
//   per slot for bf16 (two for fp32), coalesced across the group. VPT (1..4)
//   is a template parameter so the row lives in registers.
// - Forward, one pass over the sources: for each source j in order, load its
//   row (the next source's row is prefetched meanwhile), dot it with w,
//   logit_j = dot * rstd_j, then update an online softmax (math::OnlineSoftmax)
//   and the running weighted sum acc = acc * rescale + weight * v_j. So every
//   source row is read exactly once: (k + 1) N d elements of traffic, the
//   floor. With k == 1 the weight is exactly 1 and acc is the source itself,
//   so the output equals the source bit for bit.
// - Backward, two passes per row: pass 1 loads each source row once, computes
//   w . v_j and dout . v_j (one paired reduction) and parks the raw row in
//   shared memory (the first kc sources that fit in the budget); pass 2 forms
//   dlogit_j and updates dsources[j] (read, add, write), re-reading v_j from
//   shared memory (or from global/L2 for sources beyond kc). Traffic is about
//   (3k + 1) N d elements (dout, sources, dsources read + written) plus k - kc
//   re-read rows. Each thread updates only its own elements, source by source
//   in order, so dsources that alias each other receive both contributions.
// - dw (sum over rows) is deterministic: each group accumulates its rows in
//   registers over a fixed grid-stride row assignment, the groups of a block
//   are summed in order into one partial per block, and a second kernel sums
//   the block partials column by column in a fixed order (in double).
// - mix_source_rstd: one warp per row, sum of squares, math::rstd_from_sum_sq.
//
// Source pointers travel in a by-value kernel parameter of fixed capacity
// (kMaxSources), so no device-side pointer array has to be uploaded per call.
#include "kernels/cuda/mix.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

constexpr int kMaxSources = 64;  // by-value parameter capacity (1.5 KiB of pointers)
constexpr int kMaxVpt = 4;       // slots of 8 elements per thread: 32 values in registers
constexpr int kWarpRowThreads = 128;  // warp mode: 4 rows per block
// Block mode: up to 8 warps per row, so d <= 8192. (The bound also lets the
// compiler give each thread up to 255 registers: the row slots live there.)
constexpr int kMaxThreads = 256;
// Shared memory a backward block may use for its source cache (the default
// limit, no opt-in needed; leaves room for 4 blocks per SM).
// Below 48 KiB by the kernels' static shared memory, so no launch needs the opt-in
// attribute for more than 48 KiB.
constexpr size_t kSmemBudget = (48 << 10) - 1024;

template <typename T>
struct Sources {
  const T* v[kMaxSources];
  const float* rstd[kMaxSources];
};
template <typename T>
struct DSources {
  T* dv[kMaxSources];
};

// ---- 8-element packs ----------------------------------------------------------
// The raw bits of 8 consecutive elements: 16 bytes of bf16 or 32 of float.
template <typename T> struct Pack;
template <> struct Pack<bf16> { uint4 u; };
template <> struct Pack<float> { float4 a, b; };

// Elements [base, base + 8) of p; those at or beyond d read as 0. ALIGNED: d
// is a multiple of 8 and p 16-byte aligned, so a slot is all in or all out
// and is one (bf16) or two (fp32) vector loads.
template <typename T, bool ALIGNED>
__device__ __forceinline__ Pack<T> load_pack(const T* p, int64_t base, int64_t d) {
  Pack<T> r;
  if constexpr (ALIGNED) {
    if (base < d) {
      if constexpr (std::is_same_v<T, bf16>) {
        r.u = *reinterpret_cast<const uint4*>(p + base);
      } else {
        r.a = *reinterpret_cast<const float4*>(p + base);
        r.b = *reinterpret_cast<const float4*>(p + base + 4);
      }
    } else {
      memset(&r, 0, sizeof r);
    }
  } else {
    T tmp[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) tmp[e] = base + e < d ? p[base + e] : from_f32<T>(0.0f);
    memcpy(&r, tmp, sizeof r);
  }
  return r;
}

template <typename T>
__device__ __forceinline__ void unpack(const Pack<T>& r, float* x) {
  T tmp[8];
  memcpy(tmp, &r, sizeof r);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = to_f32(tmp[e]);
}

// Stores the in-range elements of x[0..8) at p[base..base+8).
template <typename T, bool ALIGNED>
__device__ __forceinline__ void store8(T* p, int64_t base, int64_t d, const float* x) {
  T tmp[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) tmp[e] = from_f32<T>(x[e]);
  if constexpr (ALIGNED) {
    if (base < d) {
      Pack<T> r;
      memcpy(&r, tmp, sizeof r);
      if constexpr (std::is_same_v<T, bf16>) {
        *reinterpret_cast<uint4*>(p + base) = r.u;
      } else {
        *reinterpret_cast<float4*>(p + base) = r.a;
        *reinterpret_cast<float4*>(p + base + 4) = r.b;
      }
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (base + e < d) p[base + e] = tmp[e];
  }
}

// ---- row groups ----------------------------------------------------------------
// A warp (warp mode) or the whole block (block mode) working on one row.
struct Group {
  bool block_mode;
  int size;           // threads in the group (G)
  int tid;            // this thread's index in the group
  int index;          // the group's index within the block
  int per_block;      // groups per block

  __device__ static Group make(bool block_mode) {
    Group g;
    g.block_mode = block_mode;
    g.size = block_mode ? blockDim.x : 32;
    g.tid = block_mode ? threadIdx.x : (threadIdx.x & 31);
    g.index = block_mode ? 0 : (threadIdx.x >> 5);
    g.per_block = block_mode ? 1 : (blockDim.x >> 5);
    return g;
  }
  __device__ int64_t slot_base(int i) const { return (int64_t(i) * size + tid) * 8; }
  // Barrier among the group's threads, with shared-memory ordering.
  __device__ void sync() const {
    if (block_mode) __syncthreads();
    else __syncwarp();
  }
  // Sum over the group; every thread gets the same bits (xor butterflies add
  // the same pairs in every lane; the block stage reads one shared array).
  __device__ float sum(float v, float* scratch) const {
    return block_mode ? block_sum(v, scratch) : warp_sum(v);
  }
  __device__ float2 sum2(float2 v, float2* scratch) const {
    v.x = warp_sum(v.x);
    v.y = warp_sum(v.y);
    if (!block_mode) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float2 t = lane < int(blockDim.x >> 5) ? scratch[lane] : make_float2(0.0f, 0.0f);
    t.x = warp_sum(t.x);
    t.y = warp_sum(t.y);
    return t;
  }
};

// How a row of d elements is split: VPT slots per thread, and warps per row
// (1 = warp mode).
struct RowLayout {
  int vpt;
  int warps_per_row;
  bool block_mode() const { return warps_per_row > 1; }
  int group_size() const { return 32 * warps_per_row; }
};

RowLayout row_layout(const char* op, int64_t d) {
  const int64_t slots = std::max<int64_t>(1, ceil_div(d, 8));
  if (slots <= 32 * kMaxVpt) return {static_cast<int>(ceil_div(slots, 32)), 1};
  const int64_t wpr = ceil_div(slots, 32 * kMaxVpt);
  if (wpr * 32 > kMaxThreads)
    fail(op, ": d = ", d, " exceeds the CUDA kernel's limit of ", kMaxThreads * kMaxVpt * 8);
  return {static_cast<int>(ceil_div(slots, 32 * wpr)), static_cast<int>(wpr)};
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Runs fn(integral_constant<int, VPT>, bool_constant<ALIGNED>) for the runtime
// choice, instantiating every kernel variant once.
template <typename Fn>
void with_variant(int vpt, bool aligned, Fn&& fn) {
  auto go = [&](auto v) {
    if (aligned) fn(v, std::true_type{});
    else fn(v, std::false_type{});
  };
  switch (vpt) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    case 3: go(std::integral_constant<int, 3>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    default: fail("mix: internal error, VPT = ", vpt);
  }
}

void check_capacity(const char* op, size_t k) {
  if (k > static_cast<size_t>(kMaxSources))
    fail(op, ": ", k, " sources exceed the CUDA kernel's capacity of ", kMaxSources);
}

// ---- rstd ------------------------------------------------------------------------

// One warp per row; slots of 8 elements strided over the row.
template <typename T, bool ALIGNED>
__global__ void __launch_bounds__(256)
    rstd_kernel(float* rstd, const T* v, int64_t N, int64_t d, float eps) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* vr = v + row * d;
  float ss = 0.0f;
  for (int64_t base = int64_t(lane) * 8; base < d; base += 32 * 8) {
    float x[8];
    unpack(load_pack<T, ALIGNED>(vr, base, d), x);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss = fmaf(x[e], x[e], ss);
  }
  ss = warp_sum(ss);
  if (lane == 0) rstd[row] = math::rstd_from_sum_sq(ss, static_cast<long long>(d), eps);
}

// ---- forward -------------------------------------------------------------------

template <typename T, int VPT, bool ALIGNED>
__global__ void __launch_bounds__(kMaxThreads)
    mix_forward_kernel(T* out, float* probs, const T* w, Sources<T> src, int k, int64_t N,
                       int64_t d, bool block_mode) {
  __shared__ float scratch[32];
  const Group g = Group::make(block_mode);
  const int64_t row = int64_t(blockIdx.x) * g.per_block + g.index;
  if (row >= N) return;  // warp mode only (block mode launches N blocks): no barrier skipped
  const int64_t off = row * d;

  float wf[VPT][8], acc[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i) unpack(load_pack<T, ALIGNED>(w, g.slot_base(i), d), wf[i]);

  math::OnlineSoftmax<float> sm;
  // This thread keeps the logits j == tid and j == tid + G (k <= 64 <= 2 G),
  // to write their probabilities at the end.
  float logit_a = 0.0f, logit_b = 0.0f;
  Pack<T> cur[VPT], nxt[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) cur[i] = load_pack<T, ALIGNED>(src.v[0] + off, g.slot_base(i), d);
  for (int j = 0; j < k; ++j) {
    if (j + 1 < k) {  // prefetch the next source's row
#pragma unroll
      for (int i = 0; i < VPT; ++i)
        nxt[i] = load_pack<T, ALIGNED>(src.v[j + 1] + off, g.slot_base(i), d);
    }
    float v[VPT][8];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      unpack(cur[i], v[i]);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(wf[i][e], v[i][e], dot);
    }
    const float logit = g.sum(dot, scratch) * src.rstd[j][row];
    if (j == g.tid) logit_a = logit;
    else if (j == g.tid + g.size) logit_b = logit;
    float weight;
    const float rescale = sm.push(logit, weight);
    if (j == 0) {
      // weight == 1 exactly: take the row as is (k == 1 stays bit-exact).
#pragma unroll
      for (int i = 0; i < VPT; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] = v[i][e];
    } else {
#pragma unroll
      for (int i = 0; i < VPT; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(weight, v[i][e], acc[i][e] * rescale);
    }
#pragma unroll
    for (int i = 0; i < VPT; ++i) cur[i] = nxt[i];
  }

  const float inv = 1.0f / sm.l;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = acc[i][e] * inv;
    store8<T, ALIGNED>(out + off, g.slot_base(i), d, o);
  }
  if (g.tid < k) probs[row * k + g.tid] = expf(logit_a - sm.m) * inv;
  if (g.tid + g.size < k) probs[row * k + g.tid + g.size] = expf(logit_b - sm.m) * inv;
}

// ---- backward ------------------------------------------------------------------

// Per row (x_j = v_j r_j, logit_j = w . x_j, a = softmax(logit)), as the CPU:
//   dlogit_j = a_j (dout . v_j - sum_i a_i dout . v_i)
//   dv_j    += a_j dout + (dlogit_j r_j) w - (dlogit_j r_j^3 (w . v_j) / d) v_j
//   dw      += dlogit_j r_j v_j
// Shared memory per group: the raw rows of the first kc sources, then k float4
// {w . v_j, dout . v_j, a_j, r_j}. Block partial of dw: dw_partial[blockIdx].
template <typename T, int VPT, bool ALIGNED>
__global__ void __launch_bounds__(kMaxThreads)
    mix_backward_kernel(DSources<T> dsrc, float* dw_partial, const T* dout, const T* w,
                        Sources<T> src, const float* probs, int k, int kc, int64_t N, int64_t d,
                        bool block_mode) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float2 scratch[32];
  const Group g = Group::make(block_mode);
  const size_t group_bytes =
      size_t(kc) * VPT * g.size * sizeof(Pack<T>) + size_t(k) * sizeof(float4);
  Pack<T>* cache = reinterpret_cast<Pack<T>*>(smem + g.index * group_bytes);
  float4* dots = reinterpret_cast<float4*>(smem + g.index * group_bytes +
                                           size_t(kc) * VPT * g.size * sizeof(Pack<T>));
  // Slot i of source j of this thread: cache[(j VPT + i) G + tid] (consecutive
  // threads, consecutive 16/32-byte entries: conflict-free).
  auto cached = [&](int j, int i) -> Pack<T>& { return cache[(j * VPT + i) * g.size + g.tid]; };
  const float fd = static_cast<float>(d);

  float wf[VPT][8], dwacc[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    unpack(load_pack<T, ALIGNED>(w, g.slot_base(i), d), wf[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) dwacc[i][e] = 0.0f;
  }

  const int64_t groups = int64_t(gridDim.x) * g.per_block;
  for (int64_t row = int64_t(blockIdx.x) * g.per_block + g.index; row < N; row += groups) {
    const int64_t off = row * d;
    float dy[VPT][8];
#pragma unroll
    for (int i = 0; i < VPT; ++i) unpack(load_pack<T, ALIGNED>(dout + off, g.slot_base(i), d), dy[i]);

    // Pass 1: dots, one read of every source row.
    float s = 0.0f;  // sum_i a_i (dout . v_i), the same in every thread
    Pack<T> cur[VPT], nxt[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) cur[i] = load_pack<T, ALIGNED>(src.v[0] + off, g.slot_base(i), d);
    for (int j = 0; j < k; ++j) {
      if (j + 1 < k) {
#pragma unroll
        for (int i = 0; i < VPT; ++i)
          nxt[i] = load_pack<T, ALIGNED>(src.v[j + 1] + off, g.slot_base(i), d);
      }
      float2 xy = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (j < kc) cached(j, i) = cur[i];
        float v[8];
        unpack(cur[i], v);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          xy.x = fmaf(wf[i][e], v[e], xy.x);
          xy.y = fmaf(dy[i][e], v[e], xy.y);
        }
      }
      xy = g.sum2(xy, scratch);
      const float a = probs[row * k + j];
      s = fmaf(a, xy.y, s);
      if (g.tid == 0) dots[j] = make_float4(xy.x, xy.y, a, src.rstd[j][row]);
#pragma unroll
      for (int i = 0; i < VPT; ++i) cur[i] = nxt[i];
    }
    g.sync();  // dots visible to the whole group

    // Pass 2: dsources and dw, source by source in order (dsources may alias:
    // each thread finishes its read-add-write of source j before source j + 1).
    for (int j = 0; j < k; ++j) {
      const float4 q = dots[j];
      const float a = q.z, r = q.w;
      const float dl = a * (q.y - s);                 // dlogit_j
      const float cw = dl * r;                        // coefficient of w
      const float cv = -dl * r * r * r * q.x / fd;     // coefficient of v_j
      T* dvr = dsrc.dv[j] + off;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t base = g.slot_base(i);
        float v[8], dv[8];
        unpack(j < kc ? cached(j, i) : load_pack<T, ALIGNED>(src.v[j] + off, base, d), v);
        unpack(load_pack<T, ALIGNED>(dvr, base, d), dv);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          dv[e] += fmaf(cv, v[e], fmaf(cw, wf[i][e], a * dy[i][e]));
          dwacc[i][e] = fmaf(cw, v[e], dwacc[i][e]);
        }
        store8<T, ALIGNED>(dvr, base, d, dv);
      }
    }
    g.sync();  // all reads of dots done before the next row rewrites them
  }

  // dw partial of this block: its groups' accumulators summed in group order.
  // Block mode: one group, each element owned by one thread, written directly.
  float* part = dw_partial + int64_t(blockIdx.x) * d;
  if (block_mode) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) store8<float, false>(part, g.slot_base(i), d, dwacc[i]);
    return;
  }
  __syncthreads();  // every warp is done with its cache: reuse it as [groups][d] floats
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    store8<float, false>(red + int64_t(g.index) * d, g.slot_base(i), d, dwacc[i]);
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float t = 0.0f;
    for (int q = 0; q < g.per_block; ++q) t += red[int64_t(q) * d + c];
    part[c] = t;
  }
}

// dw[c] += sum over blocks b (in order) of partial[b][c]. Block = 32 columns x
// 32 row lanes: lane r sums partials b = r, r + 32, ... in order (coalesced
// across columns), then the 32 lane sums are added in order. Fixed shape, so
// fixed bits.
__global__ void __launch_bounds__(1024)
    dw_reduce_kernel(float* dw, const float* partial, int64_t blocks, int64_t d) {
  __shared__ double red[32][33];
  const int cx = threadIdx.x & 31, ry = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * 32 + cx;
  double s = 0.0;
  if (c < d)
    for (int64_t b = ry; b < blocks; b += 32) s += partial[b * d + c];
  red[ry][cx] = s;
  __syncthreads();
  if (ry == 0 && c < d) {
    double t = 0.0;
    for (int r = 0; r < 32; ++r) t += red[r][cx];
    dw[c] += static_cast<float>(t);
  }
}

}  // namespace

void mix_source_rstd(Tensor& rstd, const Tensor& v, float eps) {
  const int64_t N = v.dim(0), d = v.dim(1);
  if (N == 0) return;
  dispatch_float(v, "mix_source_rstd", [&](auto tag) {
    using T = decltype(tag);
    const T* vp = dptr<T>(v);
    const bool aligned = d % 8 == 0 && aligned16(vp);
    constexpr int kThreads = 256;  // 8 rows per block
    const unsigned blocks = static_cast<unsigned>(ceil_div(N, kThreads / 32));
    if (aligned)
      rstd_kernel<T, true><<<blocks, kThreads, 0, stream()>>>(dptr<float>(rstd), vp, N, d, eps);
    else
      rstd_kernel<T, false><<<blocks, kThreads, 0, stream()>>>(dptr<float>(rstd), vp, N, d, eps);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void mix_forward(Tensor& out, Tensor& probs, const Tensor& w, Span<const Tensor> sources,
                 Span<const Tensor> rstds) {
  const char* op = "mix_forward";
  check_capacity(op, sources.size());
  const int64_t N = sources[0].dim(0), d = w.dim(0);
  const int k = static_cast<int>(sources.size());
  if (N == 0) return;
  const RowLayout lay = row_layout(op, d);
  dispatch_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    Sources<T> src{};
    bool aligned = d % 8 == 0 && aligned16(out.raw()) && aligned16(w.raw());
    for (int j = 0; j < k; ++j) {
      src.v[j] = dptr<T>(sources[j]);
      src.rstd[j] = dptr<float>(rstds[j]);
      aligned = aligned && aligned16(src.v[j]);
    }
    T* outp = dptr<T>(out);
    const T* wp = dptr<T>(w);
    float* pp = dptr<float>(probs);
    with_variant(lay.vpt, aligned, [&](auto vpt, auto al) {
      constexpr int VPT = decltype(vpt)::value;
      constexpr bool AL = decltype(al)::value;
      if (lay.block_mode()) {
        mix_forward_kernel<T, VPT, AL><<<static_cast<unsigned>(N), lay.group_size(), 0, stream()>>>(
            outp, pp, wp, src, k, N, d, true);
      } else {
        const unsigned blocks = static_cast<unsigned>(ceil_div(N, kWarpRowThreads / 32));
        mix_forward_kernel<T, VPT, AL><<<blocks, kWarpRowThreads, 0, stream()>>>(
            outp, pp, wp, src, k, N, d, false);
      }
      ATTNRES_CUDA_CHECK_LAUNCH();
    });
  });
}

void mix_backward(Span<Tensor> dsources, Tensor& dw, const Tensor& dout, const Tensor& w,
                  Span<const Tensor> sources, Span<const Tensor> rstds, const Tensor& probs) {
  const char* op = "mix_backward";
  check_capacity(op, sources.size());
  const int64_t N = sources[0].dim(0), d = w.dim(0);
  const int k = static_cast<int>(sources.size());
  if (N == 0 || d == 0) return;  // nothing to add anywhere
  const RowLayout lay = row_layout(op, d);
  dispatch_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    Sources<T> src{};
    DSources<T> dsrc{};
    bool aligned = d % 8 == 0 && aligned16(dout.raw()) && aligned16(w.raw());
    for (int j = 0; j < k; ++j) {
      src.v[j] = dptr<T>(sources[j]);
      src.rstd[j] = dptr<float>(rstds[j]);
      dsrc.dv[j] = dptr<T>(dsources[j]);
      aligned = aligned && aligned16(src.v[j]) && aligned16(dsrc.dv[j]);
    }

    // Shared memory: per group, kc cached source rows + k dot records; in
    // warp mode at least groups * d floats for the dw reduction at the end.
    const int groups_per_block = lay.block_mode() ? 1 : kWarpRowThreads / 32;
    const int threads = lay.block_mode() ? lay.group_size() : kWarpRowThreads;
    const size_t row_bytes = size_t(lay.vpt) * lay.group_size() * sizeof(Pack<T>);
    const size_t dots_bytes = size_t(k) * sizeof(float4);
    const size_t per_group = kSmemBudget / groups_per_block;
    const int kc = per_group > dots_bytes
                       ? static_cast<int>(std::min<size_t>(k, (per_group - dots_bytes) / row_bytes))
                       : 0;
    size_t smem = groups_per_block * (kc * row_bytes + dots_bytes);
    if (!lay.block_mode()) smem = std::max(smem, size_t(groups_per_block) * d * sizeof(float));

    with_variant(lay.vpt, aligned, [&](auto vpt, auto al) {
      constexpr int VPT = decltype(vpt)::value;
      constexpr bool AL = decltype(al)::value;
      auto kernel = mix_backward_kernel<T, VPT, AL>;
      if (smem > (48u << 10))
        ATTNRES_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(smem)));
      // A fixed grid (one wave of resident blocks) over which rows are
      // strided: its size depends only on the device and the shapes, so the
      // dw partials, and their sum, are the same every run.
      int per_sm = 0;
      ATTNRES_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
      ATTNRES_CHECK(per_sm > 0, op, ": no block of ", threads, " threads with ", smem,
                    " bytes of shared memory fits on an SM");
      const int64_t sms = ::attnres::cuda::device_properties().multiProcessorCount;
      const int64_t grid = std::min<int64_t>(ceil_div(N, groups_per_block), sms * per_sm);
      Tensor partial = Tensor::empty({grid, d}, DType::F32, Device::CUDA);
      kernel<<<static_cast<unsigned>(grid), threads, smem, stream()>>>(
          dsrc, partial.data<float>(), dptr<T>(dout), dptr<T>(w), src, dptr<float>(probs), k, kc,
          N, d, lay.block_mode());
      ATTNRES_CUDA_CHECK_LAUNCH();
      dw_reduce_kernel<<<static_cast<unsigned>(ceil_div(d, 32)), 1024, 0, stream()>>>(
          dptr<float>(dw), partial.data<float>(), grid, d);
      ATTNRES_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace attnres::kernels::cuda
