// CUDA AttnRes depth Mix (see kernels/mix.h, docs/model.md section 2, and the CPU
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
// - Phase 1 forward (the Q queries of a Mix group over the sources that
//   existed when the group started), one pass over the sources per query: for each source j in
//   order, load its row (the next source's row is prefetched meanwhile), dot
//   it with w, logit_j = dot * rstd_j, then update an online softmax
//   (math::OnlineSoftmax) and the running weighted sum acc = acc * rescale +
//   weight * v_j. The Q queries of the same rows are adjacent blocks, so a
//   source row comes from DRAM once per Mix group and from L2 for
//   the other queries: about (k + Q) N d elements of DRAM traffic. With k == 1
//   the weight is exactly 1 and acc is the source itself, so the output
//   equals the source bit for bit.
// - Phase 1 backward, two passes per row: pass 1 loads each source row once,
//   computes w_q . v_j and dout_q . v_j for every query (paired reductions)
//   and parks the raw row in shared memory (the first kc sources that fit in
//   the budget); pass 2 updates dsources[j] once for all the queries (read,
//   add the queries' terms in fp32, write), re-reading v_j from shared memory
//   (or from global/L2 for sources beyond kc) and w_q, dout_q from L1 (from
//   registers when there is one query, as for the final Mix). DRAM
//   traffic is about (3k + Q) N d elements, against Q (3k + 1) N d for one
//   sublayer at a time. Each thread updates only its own elements, source by
//   source in order, so dsources that alias each other receive both
//   contributions.
// - dw of the queries (sums over rows) is deterministic: the row kernels
//   store each row's coefficient (dlogit r), mix_dw_kernel sums coef * v over
//   fixed chunks of rows in order, and dw_reduce_kernel sums the chunks
//   column by column in a fixed order (in double).
// - Phase 2 (merge with the m recent sources) fused with the RMSNorm that
//   reads its result, one row group per row: the forward reads o and the
//   recent rows and writes u = the normalised x (x stays in registers); the
//   backward reads du, o and the recent rows, recomputes x, and writes d_o and
//   the recent rows' gradients (read-add-write). With m = 1 (Block AttnRes):
//   3 and 6 passes against 5 and 9 for a separate merge and RMSNorm. dw goes
//   through the dw kernels (the recent rows as sources), dgain through block
//   partials and the same fixed-order reduction.
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
// Shared memory a backward block gives its source cache (about the default
// 48 KiB less the kernels' static shared memory; leaves room for 4 blocks per
// SM). The dots records come first: with many queries and sources (Q k > ~700
// in warp mode) they alone exceed it, the cache gets no rows, and
// resident_grid opts the launch into more shared memory. A tuning knob to
// measure: Full AttnRes's late groups (Q ~ 7, k ~ 40 at d = 768) cache only
// ~4 source rows per group here, so pass 2 re-reads the others (from L2 at
// best).
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
// Phase 1 takes up to kMaxQueries queries per launch (a block of sublayers;
// more are split over launches).
constexpr int kMaxQueries = 16;
template <typename T>
struct Queries {
  const T* w[kMaxQueries];
  T* out[kMaxQueries];
};
template <typename T>
struct QueryGrads {
  const T* w[kMaxQueries];
  const T* dout[kMaxQueries];
};
struct DwPtrs {
  float* dw[kMaxQueries];
};

// Shared memory of a backward row group after its source cache: Q k float4
// dot records and Q floats, rounded up to 16 bytes so that the next group's
// cache stays 16-byte aligned.
__host__ __device__ inline size_t dots_bytes(int Q, int k) {
  return size_t(Q) * k * 16 + (size_t(Q) * 4 + 15) / 16 * 16;
}

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
  // Two sums with one pair of barriers in block mode. (Written out rather
  // than through block_reduce: that form, and plain sums for the callers that
  // use only .x, each moved the merge kernels' register allocation, with
  // spills at d = 1024, in ptxas; this is the code measured on the H100.)
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

// out[0..d) = the sum of the block's row groups' per-thread slot values acc,
// added in group order (fixed, so fixed bits). One group stores its own;
// several meet in red (shared memory of per_block * d floats). Every thread of
// the block must call it.
template <int VPT>
__device__ void sum_groups_in_order(float* out, float* red, const float (&acc)[VPT][8],
                                    const Group& g, int64_t d) {
  if (g.per_block == 1) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) store8<float, false>(out, g.slot_base(i), d, acc[i]);
    return;
  }
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    store8<float, false>(red + int64_t(g.index) * d, g.slot_base(i), d, acc[i]);
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float t = 0.0f;
    for (int r = 0; r < g.per_block; ++r) t += red[int64_t(r) * d + c];
    out[c] = t;
  }
}

// How a row of d elements is split: VPT slots per thread, and warps per row
// (1 = warp mode).
struct RowLayout {
  int vpt;
  int warps_per_row;
  bool block_mode() const { return warps_per_row > 1; }
  int group_size() const { return 32 * warps_per_row; }
  // Row groups per block and threads per block of a one-group-per-row kernel.
  int groups_per_block() const { return block_mode() ? 1 : kWarpRowThreads / 32; }
  int threads() const { return block_mode() ? group_size() : kWarpRowThreads; }
};

RowLayout row_layout(const char* op, int64_t d) {
  const int64_t slots = std::max<int64_t>(1, ceil_div(d, 8));
  if (slots <= 32 * kMaxVpt) return {static_cast<int>(ceil_div(slots, 32)), 1};
  const int64_t wpr = ceil_div(slots, 32 * kMaxVpt);
  if (wpr * 32 > kMaxThreads)
    fail(op, ": d = ", d, " exceeds the CUDA kernel's limit of ", kMaxThreads * kMaxVpt * 8);
  return {static_cast<int>(ceil_div(slots, 32 * wpr)), static_cast<int>(wpr)};
}

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

// 16-byte alignment (a named helper: the launchers' `aligned` flags would hide
// common.cuh's aligned()).
bool aligned16(const void* p) { return aligned(p, 16); }

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

// ---- forward (phase 1: Q queries over the same sources) ---------------------------

// One block per (row block, query), the query index varying fastest: the Q
// blocks of the same rows run side by side, so each source row comes from
// DRAM once and from L2 for the other queries, and every query's arithmetic is
// the single-query kernel's (its results do not depend on Q).
template <typename T, int VPT, bool ALIGNED>
__global__ void __launch_bounds__(kMaxThreads)
    mix_forward_kernel(Queries<T> qs, int Q, float* probs, float* lse, Sources<T> src, int k,
                       int64_t N, int64_t d, bool block_mode) {
  __shared__ float scratch[32];
  const Group g = Group::make(block_mode);
  const int q = static_cast<int>(blockIdx.x % unsigned(Q));
  const int64_t row = int64_t(blockIdx.x / unsigned(Q)) * g.per_block + g.index;
  if (row >= N) return;  // warp mode only (block mode launches N Q blocks): no barrier skipped
  const int64_t off = row * d;
  const T* w = qs.w[q];
  T* out = qs.out[q];
  float* pr = probs + (int64_t(q) * N + row) * k;

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
  if (g.tid < k) pr[g.tid] = expf(logit_a - sm.m) * inv;
  if (g.tid + g.size < k) pr[g.tid + g.size] = expf(logit_b - sm.m) * inv;
  if (lse && g.tid == 0) lse[int64_t(q) * N + row] = sm.m + logf(sm.l);
}

// ---- backward (phase 1) ----------------------------------------------------------

// Per row and query q (x_j = v_j r_j, logit_qj = w_q . x_j, a_q = softmax(logit_q)),
// as the CPU:
//   dlogit_qj = a_qj (dout_q . v_j - sum_i a_qi dout_q . v_i + dlse_q)
//   dv_j     += a_qj dout_q + (dlogit_qj r_j) w_q - (dlogit_qj r_j^3 (w_q . v_j) / d) v_j
//   dw_q     += dlogit_qj r_j v_j
// Pass 1 reads every source row once (parking the first kc in shared memory)
// and forms the 2 Q dots per source; pass 2 updates each dsources row once,
// adding the queries' terms in descending order in fp32 and rounding once.
// dout_q and w_q rows are re-read per source from L1 (kept in registers when
// there is one query: kOne). dw is not accumulated
// here: the coefficient dlogit_qj r_j goes to coef [Q, N, k] and mix_dw_kernel
// forms dw_q = sum over rows and sources of coef v_j in a fixed order.
// Shared memory per group: the raw rows of the first kc sources, Q k float4
// {w_q . v_j, dout_q . v_j, a_qj, r_j}, then Q floats sum_i a_qi dout_q . v_i.
// kOne: a single query (the final Mix, a group cut to one sublayer by a chunk
// boundary): its dout and w rows stay
// in registers for the whole row instead of being re-read from L1 per source,
// as in the first (measured) version of this kernel. That costs registers
// (182 against 122 at d = 768 bf16: 2 resident blocks per SM instead of 4);
// which way is faster for one query is still to be measured.
template <typename T, int VPT, bool ALIGNED, bool kOne>
__global__ void __launch_bounds__(kMaxThreads)
    mix_backward_kernel(DSources<T> dsrc, float* coef, QueryGrads<T> qg, int Q, const float* dlse,
                        Sources<T> src, const float* probs, int k, int kc, int64_t N, int64_t d,
                        bool block_mode) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float2 scratch[32];
  const Group g = Group::make(block_mode);
  const size_t cache_bytes = size_t(kc) * VPT * g.size * sizeof(Pack<T>);
  const size_t group_bytes = cache_bytes + dots_bytes(Q, k);
  unsigned char* base = smem + g.index * group_bytes;
  Pack<T>* cache = reinterpret_cast<Pack<T>*>(base);
  float4* dots = reinterpret_cast<float4*>(base + cache_bytes);  // [Q][k]
  float* ssum = reinterpret_cast<float*>(base + cache_bytes + size_t(Q) * k * sizeof(float4));
  // Slot i of source j of this thread: cache[(j VPT + i) G + tid] (consecutive
  // threads, consecutive 16/32-byte entries: conflict-free).
  auto cached = [&](int j, int i) -> Pack<T>& { return cache[(j * VPT + i) * g.size + g.tid]; };
  const float fd = static_cast<float>(d);

  const int64_t groups = int64_t(gridDim.x) * g.per_block;
  for (int64_t row = int64_t(blockIdx.x) * g.per_block + g.index; row < N; row += groups) {
    const int64_t off = row * d;
    // Slot i of query q's w and dout rows: from registers (kOne) or L1.
    float w1[kOne ? VPT : 1][8], dy1[kOne ? VPT : 1][8];
    if constexpr (kOne) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        unpack(load_pack<T, ALIGNED>(qg.w[0], g.slot_base(i), d), w1[i]);
        unpack(load_pack<T, ALIGNED>(qg.dout[0] + off, g.slot_base(i), d), dy1[i]);
      }
    }
    auto query_slot = [&](int q, int i, float* wq, float* dy) {
      if constexpr (kOne) {
#pragma unroll
        for (int e = 0; e < 8; ++e) wq[e] = w1[i][e], dy[e] = dy1[i][e];
      } else {
        unpack(load_pack<T, ALIGNED>(qg.w[q], g.slot_base(i), d), wq);
        unpack(load_pack<T, ALIGNED>(qg.dout[q] + off, g.slot_base(i), d), dy);
      }
    };

    // Pass 1: dots, one read of every source row.
    Pack<T> cur[VPT], nxt[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) cur[i] = load_pack<T, ALIGNED>(src.v[0] + off, g.slot_base(i), d);
    for (int j = 0; j < k; ++j) {
      if (j + 1 < k) {
#pragma unroll
        for (int i = 0; i < VPT; ++i)
          nxt[i] = load_pack<T, ALIGNED>(src.v[j + 1] + off, g.slot_base(i), d);
      }
      float v[VPT][8];
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (j < kc) cached(j, i) = cur[i];
        unpack(cur[i], v[i]);
      }
      for (int q = 0; q < Q; ++q) {
        float2 xy = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          float wq[8], dy[8];
          query_slot(q, i, wq, dy);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            xy.x = fmaf(wq[e], v[i][e], xy.x);
            xy.y = fmaf(dy[e], v[i][e], xy.y);
          }
        }
        xy = g.sum2(xy, scratch);
        if (g.tid == 0)
          dots[q * k + j] =
              make_float4(xy.x, xy.y, probs[(int64_t(q) * N + row) * k + j], src.rstd[j][row]);
      }
#pragma unroll
      for (int i = 0; i < VPT; ++i) cur[i] = nxt[i];
    }
    g.sync();  // dots visible to the whole group
    if (g.tid < Q) {  // s_q = sum_j a_qj (dout_q . v_j), in source order
      float s = 0.0f;
      for (int j = 0; j < k; ++j) s = fmaf(dots[g.tid * k + j].z, dots[g.tid * k + j].y, s);
      ssum[g.tid] = s;
    }
    g.sync();

    // Pass 2: dsources source by source in order (dsources may alias: each
    // thread finishes its read-add-write of source j before source j + 1).
    for (int j = 0; j < k; ++j) {
      T* dvr = dsrc.dv[j] + off;
      float v[VPT][8], dv[VPT][8];
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t sb = g.slot_base(i);
        unpack(j < kc ? cached(j, i) : load_pack<T, ALIGNED>(src.v[j] + off, sb, d), v[i]);
        unpack(load_pack<T, ALIGNED>(dvr, sb, d), dv[i]);
      }
      for (int q = Q - 1; q >= 0; --q) {
        const float4 dd = dots[q * k + j];
        const float a = dd.z, r = dd.w;
        const float dl = a * (dd.y - ssum[q] + (dlse ? dlse[int64_t(q) * N + row] : 0.0f));
        const float cw = dl * r;                    // coefficient of w_q (and of v_j in dw_q)
        const float cv = -dl * r * r * r * dd.x / fd;  // coefficient of v_j
        if (g.tid == 0) coef[(int64_t(q) * N + row) * k + j] = cw;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          float wq[8], dy[8];
          query_slot(q, i, wq, dy);
#pragma unroll
          for (int e = 0; e < 8; ++e) dv[i][e] += fmaf(cv, v[i][e], fmaf(cw, wq[e], a * dy[e]));
        }
      }
#pragma unroll
      for (int i = 0; i < VPT; ++i) store8<T, ALIGNED>(dvr, g.slot_base(i), d, dv[i]);
    }
    g.sync();  // all reads of dots done before the next row rewrites them
  }
}

// dw of the depth queries, deterministic, in two kernels. mix_dw_kernel: one
// block per (chunk of kDwRows rows, query), the query varying fastest (so the
// Q blocks of the same rows share their source reads through L2):
//   partial[q, chunk, :] = sum_{rows, j} coef[q, row, j] v_j[row, :].
// The block is R = kDwThreads / G row groups of the row kernels' size G
// (8 warps at d <= 1024). Row group r takes the chunk's rows
// r, r + R, ... and sums coef v_j over them and the sources in order, in
// registers; the R sums then meet in shared memory and are added in r order.
// Fixed shapes, so fixed bits. (The first version gave a chunk of 64 rows to a
// single warp: about 2 warps per SM at N = 16K, latency-bound, and most of
// the measured Mix backward time on the H100.)
constexpr int64_t kDwRows = 32;
constexpr int kDwThreads = 256;

template <typename T, int VPT, bool ALIGNED>
__global__ void __launch_bounds__(kDwThreads)
    mix_dw_kernel(float* partial, const float* coef, Sources<T> src, int Q, int k, int64_t N,
                  int64_t d, int group_size) {
  // R d <= kDwThreads * kMaxVpt * 8 floats: d <= G VPT 8 and R G = kDwThreads.
  __shared__ float red[kDwThreads * kMaxVpt * 8];
  Group g;
  g.block_mode = false;  // (sync() is not used: the block meets at __syncthreads)
  g.size = group_size;
  g.tid = static_cast<int>(threadIdx.x % unsigned(group_size));
  g.index = static_cast<int>(threadIdx.x / unsigned(group_size));
  g.per_block = static_cast<int>(blockDim.x / unsigned(group_size));
  const int q = static_cast<int>(blockIdx.x % unsigned(Q));
  const int64_t chunk = blockIdx.x / unsigned(Q), chunks = ceil_div(N, kDwRows);
  const int64_t row0 = chunk * kDwRows, row1 = row0 + kDwRows < N ? row0 + kDwRows : N;
  float acc[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
  for (int64_t row = row0 + g.index; row < row1; row += g.per_block)
    for (int j = 0; j < k; ++j) {
      const float c = coef[(int64_t(q) * N + row) * k + j];
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        float v[8];
        unpack(load_pack<T, ALIGNED>(src.v[j] + row * d, g.slot_base(i), d), v);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(c, v[e], acc[i][e]);
      }
    }
  sum_groups_in_order<VPT>(partial + (int64_t(q) * chunks + chunk) * d, red, acc, g, d);
}

// dw_q[c] += sum over chunks b (in order) of partial[q, b, c]; blockIdx.y = q.
// Block = 32 columns x 32 row lanes: lane r sums partials b = r, r + 32, ... in
// order (coalesced across columns), then the 32 lane sums are added in order.
// Fixed shape, so fixed bits.
__global__ void __launch_bounds__(1024)
    dw_reduce_kernel(DwPtrs dws, const float* partial, int64_t chunks, int64_t d) {
  __shared__ double red[32][33];
  const int cx = threadIdx.x & 31, ry = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * 32 + cx;
  const float* pq = partial + int64_t(blockIdx.y) * chunks * d;
  double s = 0.0;
  if (c < d)
    for (int64_t b = ry; b < chunks; b += 32) s += pq[b * d + c];
  red[ry][cx] = s;
  __syncthreads();
  if (ry == 0 && c < d) {
    double t = 0.0;
    for (int r = 0; r < 32; ++r) t += red[r][cx];
    dws.dw[blockIdx.y][c] += static_cast<float>(t);
  }
}

// ---- phase 2: merge with the recent sources, fused with RMSNorm ---------------------

// The online softmax of math::OnlineSoftmax started from phase 1's state (max
// lse, sum 1, accumulator o), one recent source e_j at a time (its rstd_j and
// w . e_j from one paired reduction), as the CPU; then x = acc / l and
// u = RMSNorm(x; gain). stats[row] = {a_0..a_m, rstd_1..rstd_m, rstd_x}.
// x lives in registers only; the logits wait in a small per-thread array
// (m <= kMaxSources; local memory, a few words per row).
template <typename T, int VPT, bool ALIGNED>
__global__ void __launch_bounds__(kMaxThreads)
    merge_norm_forward_kernel(T* u, float* stats, const T* w, const T* o, const float* lse,
                              Sources<T> rec, int m, const T* gain, int64_t N, int64_t d,
                              float eps, bool block_mode) {
  __shared__ float2 scratch[32];
  const Group g = Group::make(block_mode);
  const int64_t row = int64_t(blockIdx.x) * g.per_block + g.index;
  if (row >= N) return;  // warp mode only: no barrier skipped
  const int64_t off = row * d;
  const long long dl = static_cast<long long>(d);
  float wf[VPT][8], acc[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    unpack(load_pack<T, ALIGNED>(w, g.slot_base(i), d), wf[i]);
    unpack(load_pack<T, ALIGNED>(o + off, g.slot_base(i), d), acc[i]);
  }
  const float lse_row = lse[row];
  math::OnlineSoftmax<float> sm;
  float weight;
  sm.push(lse_row, weight);  // weight 1: the accumulator starts as o
  float z[kMaxSources], rs[kMaxSources];
  for (int j = 0; j < m; ++j) {
    float e[VPT][8];
    float2 t = make_float2(0.0f, 0.0f);  // {e . e, w . e}
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      unpack(load_pack<T, ALIGNED>(rec.v[j] + off, g.slot_base(i), d), e[i]);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        t.x = fmaf(e[i][c], e[i][c], t.x);
        t.y = fmaf(wf[i][c], e[i][c], t.y);
      }
    }
    t = g.sum2(t, scratch);
    rs[j] = math::rstd_from_sum_sq(t.x, dl, eps);
    z[j] = t.y * rs[j];
    const float scale = sm.push(z[j], weight);
#pragma unroll
    for (int i = 0; i < VPT; ++i)
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[i][c] = fmaf(weight, e[i][c], acc[i][c] * scale);
  }
  const float inv = 1.0f / sm.l;
  float2 ss = make_float2(0.0f, 0.0f);  // {x . x, unused}
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      acc[i][c] *= inv;  // x
      ss.x = fmaf(acc[i][c], acc[i][c], ss.x);
    }
  ss = g.sum2(ss, scratch);
  const float rx = math::rstd_from_sum_sq(ss.x, dl, eps);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    float gf[8], uv[8];
    unpack(load_pack<T, ALIGNED>(gain, g.slot_base(i), d), gf);
#pragma unroll
    for (int c = 0; c < 8; ++c) uv[c] = acc[i][c] * rx * gf[c];
    store8<T, ALIGNED>(u + off, g.slot_base(i), d, uv);
  }
  if (g.tid == 0) {
    float* st = stats + row * (2 * m + 2);
    st[0] = expf(lse_row - sm.m) * inv;
    for (int j = 0; j < m; ++j) {
      st[1 + j] = expf(z[j] - sm.m) * inv;
      st[m + 1 + j] = rs[j];
    }
    st[2 * m + 1] = rx;
  }
}

// Per row (x = a_0 o + sum_j a_j e_j recomputed in fp32, r = rstd_x), as the CPU:
//   dx = r g du - x r^3 (du . g x) / d;  dgain += du x r
//   s_0 = dx . o, s_j = dx . e_j, s = sum_i a_i s_i
//   d_o = a_0 dx;  dlse = a_0 (s_0 - s);  dz_j = a_j (s_j - s)
//   de_j += a_j dx + dz_j r_j w - dz_j r_j^3 (w . e_j) e_j / d;  coef[row, j] = dz_j r_j
// (dw += coef e_j by mix_dw_kernel, a fourth pass over the recent rows). Three
// passes over the recent rows here (x; the dots; the updates), the second and
// third mostly from L1/L2. Each
// thread does the read-add-write of de_j for its own elements source after
// source, so drecent may alias. dgain: each group accumulates its rows in
// registers over a fixed grid-stride row assignment; the block's groups are
// summed in order into dgain_partial[blockIdx] (through shared memory in warp
// mode), and dw_reduce_kernel sums the block partials in a fixed order.
template <typename T, int VPT, bool ALIGNED>
__global__ void __launch_bounds__(kMaxThreads)
    merge_norm_backward_kernel(T* d_o, float* dlse, DSources<T> drec, float* coef,
                               float* dgain_partial, const T* du, const T* w, const T* o,
                               Sources<T> rec, int m, const T* gain, const float* stats,
                               int64_t N, int64_t d, bool block_mode) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float2 scratch[32];
  const Group g = Group::make(block_mode);
  const float fd = static_cast<float>(d);
  float dgacc[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) dgacc[i][c] = 0.0f;

  const int64_t groups = int64_t(gridDim.x) * g.per_block;
  for (int64_t row = int64_t(blockIdx.x) * g.per_block + g.index; row < N; row += groups) {
    const int64_t off = row * d;
    const float* st = stats + row * (2 * m + 2);
    const float a0 = st[0], r = st[2 * m + 1];
    float x[VPT][8], gx[VPT][8];  // x, and g du (then dx)
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      float ov[8];
      unpack(load_pack<T, ALIGNED>(o + off, g.slot_base(i), d), ov);
#pragma unroll
      for (int c = 0; c < 8; ++c) x[i][c] = a0 * ov[c];
    }
    for (int j = 0; j < m; ++j) {
      const float aj = st[1 + j];
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        float ev[8];
        unpack(load_pack<T, ALIGNED>(rec.v[j] + off, g.slot_base(i), d), ev);
#pragma unroll
        for (int c = 0; c < 8; ++c) x[i][c] = fmaf(aj, ev[c], x[i][c]);
      }
    }
    float2 t = make_float2(0.0f, 0.0f);  // {du . g x, unused}
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t sb = g.slot_base(i);
      float dv[8], gf[8];
      unpack(load_pack<T, ALIGNED>(du + off, sb, d), dv);
      unpack(load_pack<T, ALIGNED>(gain, sb, d), gf);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        gx[i][c] = gf[c] * dv[c];
        t.x = fmaf(gx[i][c], x[i][c], t.x);
        dgacc[i][c] = fmaf(dv[c] * x[i][c], r, dgacc[i][c]);
      }
    }
    t = g.sum2(t, scratch);
    const float c3 = r * r * r * t.x / fd;
    float2 s0 = make_float2(0.0f, 0.0f);  // {dx . o, unused}
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      float ov[8];
      unpack(load_pack<T, ALIGNED>(o + off, g.slot_base(i), d), ov);  // L1 hits
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        gx[i][c] = r * gx[i][c] - c3 * x[i][c];  // dx
        s0.x = fmaf(gx[i][c], ov[c], s0.x);
      }
    }
    s0 = g.sum2(s0, scratch);
    float s = a0 * s0.x;
    float sj[kMaxSources], we[kMaxSources];  // dx . e_j, w . e_j
    for (int j = 0; j < m; ++j) {
      float2 q = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t sb = g.slot_base(i);
        float ev[8], wf[8];
        unpack(load_pack<T, ALIGNED>(rec.v[j] + off, sb, d), ev);
        unpack(load_pack<T, ALIGNED>(w, sb, d), wf);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          q.x = fmaf(gx[i][c], ev[c], q.x);
          q.y = fmaf(wf[c], ev[c], q.y);
        }
      }
      q = g.sum2(q, scratch);
      sj[j] = q.x;
      we[j] = q.y;
      s = fmaf(st[1 + j], q.x, s);
    }
    if (g.tid == 0) dlse[row] = a0 * (s0.x - s);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      float od[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) od[c] = a0 * gx[i][c];
      store8<T, ALIGNED>(d_o + off, g.slot_base(i), d, od);
    }
    for (int j = 0; j < m; ++j) {
      const float aj = st[1 + j], rj = st[m + 1 + j];
      const float dz = aj * (sj[j] - s);
      const float cw = dz * rj;                            // coefficient of w
      const float ce = -dz * rj * rj * rj * we[j] / fd;  // coefficient of e_j (through rstd_j)
      if (g.tid == 0) coef[row * m + j] = cw;
      T* der = drec.dv[j] + off;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t sb = g.slot_base(i);
        float wf[8], ev[8], de[8];
        unpack(load_pack<T, ALIGNED>(w, sb, d), wf);
        unpack(load_pack<T, ALIGNED>(rec.v[j] + off, sb, d), ev);
        unpack(load_pack<T, ALIGNED>(der, sb, d), de);
#pragma unroll
        for (int c = 0; c < 8; ++c) de[c] += fmaf(ce, ev[c], fmaf(cw, wf[c], aj * gx[i][c]));
        store8<T, ALIGNED>(der, sb, d, de);
      }
    }
  }

  // dgain partial of this block: its groups' accumulators summed in group order.
  sum_groups_in_order<VPT>(dgain_partial + int64_t(blockIdx.x) * d, reinterpret_cast<float*>(smem),
                           dgacc, g, d);
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

namespace {

// Source row and rstd pointers; clears `aligned` if a row pointer is not
// 16-byte aligned.
template <typename T>
Sources<T> source_ptrs(Span<const Tensor> sources, Span<const Tensor> rstds, bool& aligned) {
  Sources<T> src{};
  for (size_t j = 0; j < sources.size(); ++j) {
    src.v[j] = dptr<T>(sources[j]);
    src.rstd[j] = rstds.empty() ? nullptr : dptr<float>(rstds[j]);
    aligned = aligned && aligned16(src.v[j]);
  }
  return src;
}

// Launch shape of a kernel with one row group per row: `rows` rows, times
// `per_row` blocks (the phase-1 queries) in block mode or per row block.
struct RowGrid {
  unsigned blocks;
  int threads;
};
RowGrid row_grid(const RowLayout& lay, int64_t rows, int per_row = 1) {
  return {static_cast<unsigned>(ceil_div(rows, lay.groups_per_block()) * per_row), lay.threads()};
}

// Grid of a row kernel that strides rows over one wave of resident blocks of
// `threads` threads with `smem` bytes of dynamic shared memory (raising the
// kernel's shared-memory limit when needed). It depends only on the device
// and the shapes, so results that sum per-block partials repeat bit for bit.
template <typename Kernel>
int64_t resident_grid(const char* op, Kernel kernel, int threads, size_t smem, int64_t rows,
                      int rows_per_block) {
  allow_smem(kernel, smem);
  int per_sm = 0;
  ATTNRES_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  ATTNRES_CHECK(per_sm > 0, op, ": no block of ", threads, " threads with ", smem,
                " bytes of shared memory fits on an SM");
  const int64_t sms = ::attnres::cuda::device_properties().multiProcessorCount;
  return std::min<int64_t>(ceil_div(rows, rows_per_block), sms * per_sm);
}

// dws.dw[q] += sum over rows and sources of coef[q, row, j] v_j[row] (q < Q):
// mix_dw_kernel's chunk partials, then dw_reduce_kernel.
template <typename T>
void launch_dw(const DwPtrs& dws, const float* coef, const Sources<T>& src, int Q, int k,
               int64_t N, int64_t d, const RowLayout& lay, bool aligned) {
  const int64_t chunks = ceil_div(N, kDwRows);
  Tensor partial = Tensor::empty({Q, chunks, d}, DType::F32, Device::CUDA);
  with_variant(lay.vpt, aligned, [&](auto vpt, auto al) {
    constexpr int VPT = decltype(vpt)::value;
    constexpr bool AL = decltype(al)::value;
    const int G = lay.group_size(), threads = kDwThreads / G * G;  // whole row groups
    mix_dw_kernel<T, VPT, AL><<<static_cast<unsigned>(chunks * Q), threads, 0, stream()>>>(
        partial.data<float>(), coef, src, Q, k, N, d, G);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
  dw_reduce_kernel<<<dim3(static_cast<unsigned>(ceil_div(d, 32)), static_cast<unsigned>(Q)), 1024,
                     0, stream()>>>(dws, partial.data<float>(), chunks, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace

void mix_forward(Span<Tensor> outs, Tensor& probs, Tensor* lse, Span<const Tensor> ws,
                 Span<const Tensor> sources, Span<const Tensor> rstds) {
  const char* op = "mix_forward";
  check_capacity(op, sources.size());
  const int64_t N = sources[0].dim(0), d = ws[0].dim(0);
  const int k = static_cast<int>(sources.size()), n_queries = static_cast<int>(ws.size());
  if (N == 0) return;
  const RowLayout lay = row_layout(op, d);
  dispatch_float(ws[0], op, [&](auto tag) {
    using T = decltype(tag);
    bool aligned = d % 8 == 0;
    const Sources<T> src = source_ptrs<T>(sources, rstds, aligned);
    for (int q0 = 0; q0 < n_queries; q0 += kMaxQueries) {
      const int Q = std::min(kMaxQueries, n_queries - q0);
      Queries<T> qs{};
      bool al = aligned;
      for (int q = 0; q < Q; ++q) {
        qs.w[q] = dptr<T>(ws[q0 + q]);
        qs.out[q] = dptr<T>(outs[q0 + q]);
        al = al && aligned16(qs.w[q]) && aligned16(qs.out[q]);
      }
      float* pp = dptr<float>(probs) + int64_t(q0) * N * k;
      float* lp = lse ? dptr<float>(*lse) + int64_t(q0) * N : nullptr;
      const RowGrid grid = row_grid(lay, N, Q);
      with_variant(lay.vpt, al, [&](auto vpt, auto alc) {
        constexpr int VPT = decltype(vpt)::value;
        constexpr bool AL = decltype(alc)::value;
        mix_forward_kernel<T, VPT, AL><<<grid.blocks, grid.threads, 0, stream()>>>(
            qs, Q, pp, lp, src, k, N, d, lay.block_mode());
        ATTNRES_CUDA_CHECK_LAUNCH();
      });
    }
  });
}

void mix_backward(Span<Tensor> dsources, Span<Tensor> dws, Span<const Tensor> douts,
                  const Tensor* dlse, Span<const Tensor> ws, Span<const Tensor> sources,
                  Span<const Tensor> rstds, const Tensor& probs) {
  const char* op = "mix_backward";
  check_capacity(op, sources.size());
  const int64_t N = sources[0].dim(0), d = ws[0].dim(0);
  const int k = static_cast<int>(sources.size()), n_queries = static_cast<int>(ws.size());
  if (N == 0 || d == 0) return;  // nothing to add anywhere
  const RowLayout lay = row_layout(op, d);
  dispatch_float(ws[0], op, [&](auto tag) {
    using T = decltype(tag);
    bool src_aligned = d % 8 == 0;
    const Sources<T> src = source_ptrs<T>(sources, rstds, src_aligned);
    DSources<T> dsrc{};
    bool aligned = src_aligned;
    for (int j = 0; j < k; ++j) {
      dsrc.dv[j] = dptr<T>(dsources[j]);
      aligned = aligned && aligned16(dsrc.dv[j]);
    }
    const int groups_per_block = lay.groups_per_block(), threads = lay.threads();
    const size_t row_bytes = size_t(lay.vpt) * lay.group_size() * sizeof(Pack<T>);
    // Launches of up to kMaxQueries queries, the last queries first (the
    // descending order of kernels/mix.h).
    const int n_launches = static_cast<int>(ceil_div(n_queries, kMaxQueries));
    for (int c = n_launches - 1; c >= 0; --c) {
      const int q0 = c * kMaxQueries, Q = std::min(kMaxQueries, n_queries - q0);
      QueryGrads<T> qg{};
      DwPtrs dwp{};
      bool al = aligned;
      for (int q = 0; q < Q; ++q) {
        qg.w[q] = dptr<T>(ws[q0 + q]);
        qg.dout[q] = dptr<T>(douts[q0 + q]);
        dwp.dw[q] = dptr<float>(dws[q0 + q]);
        al = al && aligned16(qg.w[q]) && aligned16(qg.dout[q]);
      }
      // Shared memory per group: kc cached source rows, then the dots and
      // the softmax sums.
      const size_t db = dots_bytes(Q, k);
      const size_t per_group = kSmemBudget / groups_per_block;
      const int kc = per_group > db
                         ? static_cast<int>(std::min<size_t>(k, (per_group - db) / row_bytes))
                         : 0;
      const size_t smem = groups_per_block * (kc * row_bytes + db);
      Tensor coef = Tensor::empty({Q, N, k}, DType::F32, Device::CUDA);
      const float* dl = dlse ? dptr<float>(*dlse) + int64_t(q0) * N : nullptr;
      const float* pp = dptr<float>(probs) + int64_t(q0) * N * k;

      with_variant(lay.vpt, al, [&](auto vpt, auto alc) {
        constexpr int VPT = decltype(vpt)::value;
        constexpr bool AL = decltype(alc)::value;
        auto kernel = Q == 1 ? mix_backward_kernel<T, VPT, AL, true>
                             : mix_backward_kernel<T, VPT, AL, false>;
        // (The rows' results do not depend on the grid: dw is formed by launch_dw.)
        const int64_t grid = resident_grid(op, kernel, threads, smem, N, groups_per_block);
        kernel<<<static_cast<unsigned>(grid), threads, smem, stream()>>>(
            dsrc, coef.data<float>(), qg, Q, dl, src, pp, k, kc, N, d, lay.block_mode());
        ATTNRES_CUDA_CHECK_LAUNCH();
      });
      launch_dw<T>(dwp, coef.data<float>(), src, Q, k, N, d, lay, src_aligned);
    }
  });
}

void mix_merge_norm_forward(Tensor& u, Tensor& stats, const Tensor& w, const Tensor& o,
                            const Tensor& lse, Span<const Tensor> recent, const Tensor& gain,
                            float eps) {
  const char* op = "mix_merge_norm_forward";
  check_capacity(op, recent.size());
  const int64_t N = o.dim(0), d = w.dim(0);
  const int m = static_cast<int>(recent.size());
  if (N == 0) return;
  const RowLayout lay = row_layout(op, d);
  dispatch_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    bool aligned = d % 8 == 0 && aligned16(u.raw()) && aligned16(w.raw()) && aligned16(o.raw()) &&
                   aligned16(gain.raw());
    const Sources<T> rec = source_ptrs<T>(recent, {}, aligned);
    const RowGrid grid = row_grid(lay, N);
    with_variant(lay.vpt, aligned, [&](auto vpt, auto al) {
      constexpr int VPT = decltype(vpt)::value;
      constexpr bool AL = decltype(al)::value;
      merge_norm_forward_kernel<T, VPT, AL><<<grid.blocks, grid.threads, 0, stream()>>>(
          dptr<T>(u), dptr<float>(stats), dptr<T>(w), dptr<T>(o), dptr<float>(lse), rec, m,
          dptr<T>(gain), N, d, eps, lay.block_mode());
      ATTNRES_CUDA_CHECK_LAUNCH();
    });
  });
}

void mix_merge_norm_backward(Tensor& d_o, Tensor& dlse, Span<Tensor> drecent, Tensor& dw,
                             Tensor& dgain, const Tensor& du, const Tensor& w, const Tensor& o,
                             Span<const Tensor> recent, const Tensor& gain, const Tensor& stats) {
  const char* op = "mix_merge_norm_backward";
  check_capacity(op, recent.size());
  const int64_t N = o.dim(0), d = w.dim(0);
  const int m = static_cast<int>(recent.size());
  if (N == 0 || d == 0) return;
  const RowLayout lay = row_layout(op, d);
  dispatch_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    bool rec_aligned = d % 8 == 0;
    const Sources<T> rec = source_ptrs<T>(recent, {}, rec_aligned);
    DSources<T> drec{};
    bool aligned = rec_aligned && aligned16(d_o.raw()) && aligned16(du.raw()) &&
                   aligned16(w.raw()) && aligned16(o.raw()) && aligned16(gain.raw());
    for (int j = 0; j < m; ++j) {
      drec.dv[j] = dptr<T>(drecent[j]);
      aligned = aligned && aligned16(drec.dv[j]);
    }
    const int groups_per_block = lay.groups_per_block(), threads = lay.threads();
    // Warp mode: the block's per-group dgain rows meet in shared memory.
    const size_t smem = lay.block_mode() ? 0 : size_t(groups_per_block) * d * sizeof(float);
    Tensor coef = Tensor::empty({N, m}, DType::F32, Device::CUDA);
    Tensor partial;
    int64_t grid = 0;
    with_variant(lay.vpt, aligned, [&](auto vpt, auto al) {
      constexpr int VPT = decltype(vpt)::value;
      constexpr bool AL = decltype(al)::value;
      auto kernel = merge_norm_backward_kernel<T, VPT, AL>;
      grid = resident_grid(op, kernel, threads, smem, N, groups_per_block);
      partial = Tensor::empty({grid, d}, DType::F32, Device::CUDA);
      kernel<<<static_cast<unsigned>(grid), threads, smem, stream()>>>(
          dptr<T>(d_o), dptr<float>(dlse), drec, coef.data<float>(), partial.data<float>(),
          dptr<T>(du), dptr<T>(w), dptr<T>(o), rec, m, dptr<T>(gain), dptr<float>(stats), N, d,
          lay.block_mode());
      ATTNRES_CUDA_CHECK_LAUNCH();
    });
    DwPtrs dg{};
    dg.dw[0] = dptr<float>(dgain);
    dw_reduce_kernel<<<dim3(static_cast<unsigned>(ceil_div(d, 32)), 1u), 1024, 0, stream()>>>(
        dg, partial.data<float>(), grid, d);
    ATTNRES_CUDA_CHECK_LAUNCH();
    DwPtrs dwp{};
    dwp.dw[0] = dptr<float>(dw);
    launch_dw<T>(dwp, coef.data<float>(), rec, 1, m, N, d, lay, rec_aligned);
  });
}

}  // namespace attnres::kernels::cuda
