// CUDA AttnRes depth Mix, phase 1 and the shared pieces (see kernels/mix.h;
// mix_common.cuh has the row groups and the overview, mix_merge_norm.cu phase 2).
//
// - mix_source_rstd: one warp per row, sum of squares, math::rstd_from_sum_sq.
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
// - The rows kernels of phase 1 (the default for bf16 rows of d % 4 == 0,
//   d <= 4096, up to 8 queries a launch; kernels/mix_rows.h): a block per
//   row, each thread 4 elements, the queries' w (and dout) slots parked in
//   shared memory and read once per row instead of once per source, the
//   queries' fp32 accumulators in registers, dw summed in the backward's row
//   pass (per-block partials), 64 registers. ATTNRES_MIX_KERNELS=warp keeps
//   the kernels above everywhere (until the rows kernels have run on a GPU).
// - dw of the queries (sums over rows) is deterministic. The warp kernels
//   store each row's coefficient (dlogit r), mix_dw_kernel sums coef * v over
//   fixed chunks of rows in order, and dw_reduce_kernel sums the chunks
//   column by column in a fixed order (in double); phase 2's warp kernel uses
//   the same two (launch_dw, launch_dw_reduce). The rows kernels write one
//   partial row per block (their grid depends only on the device and the
//   shapes) for dw_reduce_kernel.
#include "kernels/cuda/mix.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/mix_common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda::mix {

namespace {

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
struct Queries {
  const T* w[kMaxQueries];
  T* out[kMaxQueries];
};
template <typename T>
struct QueryGrads {
  const T* w[kMaxQueries];
  const T* dout[kMaxQueries];
};

// Shared memory of a backward row group after its source cache: Q k float4
// dot records and Q floats, rounded up to 16 bytes so that the next group's
// cache stays 16-byte aligned.
__host__ __device__ inline size_t dots_bytes(int Q, int k) {
  return size_t(Q) * k * 16 + (size_t(Q) * 4 + 15) / 16 * 16;
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
// boundary): its dout and w rows stay in registers for the whole row instead
// of being re-read from L1 per source. That costs registers (182 against 122
// at d = 768 bf16: 2 resident blocks per SM instead of 4); which way is faster
// for one query is to be measured.
template <typename T, int VPT, bool ALIGNED, bool kOne>
__global__ void __launch_bounds__(kMaxThreads)
    mix_backward_kernel(DSources<T> dsrc, float* coef, QueryGrads<T> qg, int Q, const float* dlse,
                        Sources<T> src, const float* probs, int k, int kc, int64_t N, int64_t d,
                        bool block_mode, bool set) {
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
        if (set) {  // Store::Set: the sum starts from 0, the old contents unread
#pragma unroll
          for (int e = 0; e < 8; ++e) dv[i][e] = 0.0f;
        } else {
          unpack(load_pack<T, ALIGNED>(dvr, sb, d), dv[i]);
        }
      }
      for (int q = Q - 1; q >= 0; --q) {
        const float4 dd = dots[q * k + j];
        const float a = dd.z;
        const float dl = a * (dd.y - ssum[q] + (dlse ? dlse[int64_t(q) * N + row] : 0.0f));
        const auto [cw, cv] = math::mix_backward_coefs(dl, dd.w, dd.x, fd);
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

// ---- phase 1, the rows kernels (kernels/mix_rows.h) -----------------------------
// A block per row at a time (rows strided over a grid of resident blocks),
// thread t the 4 elements [4 t, 4 t + 4). Why: the warp kernels above re-read
// the Q queries' w (and dout) rows for every source, 4 k Q row reads per token
// row from L1/L2 against 3 k + Q rows of DRAM traffic in the backward, and at
// 128 registers (16 warps per SM) they wait on those loads: DRAM at 39% of
// peak, 5 of every 8.4 cycles stalled on global loads (Nsight Compute,
// docs/measurements/2026-11-26-h100-4). Here the queries' w slots are parked
// in shared memory once per block (and dout's once per row), each thread
// reading back only its own; the fp32 accumulators of the Q queries (outputs
// forward, dw backward) are Q x 4 registers. __launch_bounds__(1024, 1)
// holds a kernel to 64 registers, so at d = 768 (192 threads) 5 blocks of 6
// warps are resident per SM (30 warps), against the warp kernels' 16.

// Forward, Q queries (a launch of at most kMaxQueries). Per row:
// - pass 1 reads each source slot once (the next in flight), forms its Q
//   partial dots, sums them over the warp and parks the warp sums in shared
//   memory (no barrier per source);
// - the logits (warp sums added in warp order, times r_j), then per query a
//   plain softmax over the k logits in source order by one thread: the
//   weights a_qj to shared memory and probs, lse = max + log(sum);
// - pass 2 reads each source slot again (from L2: the row's sources were read
//   a moment before) and accumulates out_q = sum_j a_qj v_j in registers.
// With k == 1 the weight is exactly 1 and out is the source bit for bit.
// A query's arithmetic does not depend on Q: the same bits alone or with others.
template <int Q>
__global__ void __launch_bounds__(rows::kMaxThreads, 1)
    mix_forward_rows_kernel(Queries<bf16> qs, float* probs, float* lse, Sources<bf16> src, int k,
                            int64_t N, int64_t d) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int G = static_cast<int>(blockDim.x), W = G >> 5, t = static_cast<int>(threadIdx.x);
  const int lane = t & 31, warp = t >> 5;
  uint2* wsl = reinterpret_cast<uint2*>(smem);          // [Q][G]: w_q's slots
  float* red = reinterpret_cast<float*>(wsl + Q * G);   // [k][W][Q]: warp partial dots
  float* lg = red + size_t(k) * W * Q;                  // [Q][k]: logits, then weights
  const rows::Slot sl(d);
#pragma unroll
  for (int q = 0; q < Q; ++q) wsl[q * G + t] = sl.load(qs.w[q]);

  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t off = row * d;
    uint2 cur = sl.load(src.v[0] + off);
    for (int j = 0; j < k; ++j) {
      const uint2 nxt = j + 1 < k ? sl.load(src.v[j + 1] + off) : make_uint2(0, 0);
      float v[rows::kEpt], p[Q];
      rows::unpack(cur, v);
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        float w[rows::kEpt];
        rows::unpack(wsl[q * G + t], w);
        p[q] = rows::dot(w, v);
      }
      rows::warp_sums<Q>(p);
      if (lane == 0)
#pragma unroll
        for (int q = 0; q < Q; ++q) red[(size_t(j) * W + warp) * Q + q] = p[q];
      cur = nxt;
    }
    __syncthreads();
    for (int i = t; i < Q * k; i += G) {
      const int q = i / k, j = i % k;
      float s = 0.0f;
      for (int w = 0; w < W; ++w) s += red[(size_t(j) * W + w) * Q + q];
      lg[i] = s * src.rstd[j][row];
    }
    __syncthreads();
    if (t < Q) {  // query t's softmax over its k logits, in source order
      float* l = lg + t * k;
      float mx = -INFINITY, sum = 0.0f;
      for (int j = 0; j < k; ++j) mx = fmaxf(mx, l[j]);
      for (int j = 0; j < k; ++j) sum += expf(l[j] - mx);
      const float inv = 1.0f / sum;
      float* pr = probs + (int64_t(t) * N + row) * k;
      for (int j = 0; j < k; ++j) pr[j] = l[j] = expf(l[j] - mx) * inv;
      if (lse) lse[int64_t(t) * N + row] = mx + logf(sum);
    }
    __syncthreads();
    float acc[Q][rows::kEpt];
#pragma unroll
    for (int q = 0; q < Q; ++q)
#pragma unroll
      for (int e = 0; e < rows::kEpt; ++e) acc[q][e] = 0.0f;
    cur = sl.load(src.v[0] + off);
    for (int j = 0; j < k; ++j) {
      const uint2 nxt = j + 1 < k ? sl.load(src.v[j + 1] + off) : make_uint2(0, 0);
      float v[rows::kEpt];
      rows::unpack(cur, v);
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        const float a = lg[q * k + j];
#pragma unroll
        for (int e = 0; e < rows::kEpt; ++e) acc[q][e] = fmaf(a, v[e], acc[q][e]);
      }
      cur = nxt;
    }
#pragma unroll
    for (int q = 0; q < Q; ++q) sl.store(qs.out[q] + off, acc[q]);
    // (No barrier: the next row writes red (lane 0s) after every thread has
    // passed this row's second barrier, and lg after its own first one.)
  }
}

// Backward, Q queries (a launch of at most kMaxQueries; the warp kernel's
// formulas). Per row:
// - the queries' dout slots to shared memory;
// - pass 1 reads each source slot once, forms its 2Q partial dots (w_q . v_j,
//   dout_q . v_j), sums them over the warp and parks the warp sums;
// - the dots (warps in order), then the coefficients, once per (q, j);
// - pass 2 updates each dsource slot once, source by source in order (the
//   next source's dv and v in flight unless the two dsources are one tensor),
//   the queries' terms added in descending q in fp32 and rounded once; v_j is
//   read again (from L2), and dw_q's accumulator (registers, over all the
//   block's rows) takes coef_qj v_j from it: no other pass reads the sources.
// At the end each thread writes its dw slots to the block's partial row
// dw_partial[q][block], which launch_dw_reduce sums in block order.
template <int Q>
__global__ void __launch_bounds__(rows::kMaxThreads, 1)
    mix_backward_rows_kernel(DSources<bf16> dsrc, float* dw_partial, QueryGrads<bf16> qg,
                             const float* dlse, Sources<bf16> src, const float* probs, int k,
                             int64_t N, int64_t d, bool set) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int G = static_cast<int>(blockDim.x), W = G >> 5, t = static_cast<int>(threadIdx.x);
  const int lane = t & 31, warp = t >> 5;
  uint2* wsl = reinterpret_cast<uint2*>(smem);  // [Q][G]: w_q's slots
  uint2* dsl = wsl + Q * G;                     // [Q][G]: this row's dout_q slots
  float* red = reinterpret_cast<float*>(dsl + Q * G);  // [k][W][2Q]
  float* xw = red + size_t(k) * W * 2 * Q;  // [Q][k]: w_q . v_j, then the coefficient of v_j
  float* xd = xw + size_t(Q) * k;           // [Q][k]: dout_q . v_j, then the coefficient of w_q
  float* av = xd + size_t(Q) * k;           // [Q][k]: a_qj
  float* rv = av + size_t(Q) * k;           // [k]: r_j
  float* ss = rv + k;                       // [Q]: sum_j a_qj dout_q . v_j
  const rows::Slot sl(d);
  const float fd = static_cast<float>(d);
  // A dsource slot: its old contents, or 0 under Store::Set (not read).
  auto load_dv = [&](const bf16* row) { return set ? make_uint2(0, 0) : sl.load(row); };
#pragma unroll
  for (int q = 0; q < Q; ++q) wsl[q * G + t] = sl.load(qg.w[q]);
  float dw[Q][rows::kEpt];
#pragma unroll
  for (int q = 0; q < Q; ++q)
#pragma unroll
    for (int e = 0; e < rows::kEpt; ++e) dw[q][e] = 0.0f;

  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t off = row * d;
#pragma unroll
    for (int q = 0; q < Q; ++q) dsl[q * G + t] = sl.load(qg.dout[q] + off);

    uint2 cur = sl.load(src.v[0] + off);
    for (int j = 0; j < k; ++j) {
      const uint2 nxt = j + 1 < k ? sl.load(src.v[j + 1] + off) : make_uint2(0, 0);
      float v[rows::kEpt], p[2 * Q];
      rows::unpack(cur, v);
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        float w[rows::kEpt], y[rows::kEpt];
        rows::unpack(wsl[q * G + t], w);
        rows::unpack(dsl[q * G + t], y);
        p[2 * q] = rows::dot(w, v);
        p[2 * q + 1] = rows::dot(y, v);
      }
      rows::warp_sums<2 * Q>(p);
      if (lane == 0)
#pragma unroll
        for (int i = 0; i < 2 * Q; ++i) red[(size_t(j) * W + warp) * 2 * Q + i] = p[i];
      cur = nxt;
    }
    __syncthreads();
    for (int i = t; i < Q * k; i += G) {  // the dots: the warps' sums in warp order
      const int q = i / k, j = i % k;
      float sw = 0.0f, sd = 0.0f;
      for (int w = 0; w < W; ++w) {
        sw += red[(size_t(j) * W + w) * 2 * Q + 2 * q];
        sd += red[(size_t(j) * W + w) * 2 * Q + 2 * q + 1];
      }
      xw[i] = sw, xd[i] = sd;
      av[i] = probs[(int64_t(q) * N + row) * k + j];
      if (q == 0) rv[j] = src.rstd[j][row];
    }
    __syncthreads();
    if (t < Q) {  // s_q = sum_j a_qj (dout_q . v_j), in source order
      float s = 0.0f;
      for (int j = 0; j < k; ++j) s = fmaf(av[t * k + j], xd[t * k + j], s);
      ss[t] = s;
    }
    __syncthreads();
    for (int i = t; i < Q * k; i += G) {
      const int q = i / k, j = i % k;
      const float dl = av[i] * (xd[i] - ss[q] + (dlse ? dlse[int64_t(q) * N + row] : 0.0f));
      const auto [cw, cv] = math::mix_backward_coefs(dl, rv[j], xw[i], fd);
      xw[i] = cv, xd[i] = cw;
    }
    __syncthreads();

    uint2 dvc = load_dv(dsrc.dv[0] + off), vc = sl.load(src.v[0] + off);
    for (int j = 0; j < k; ++j) {
      const bool ahead = j + 1 < k && dsrc.dv[j + 1] != dsrc.dv[j];
      uint2 dvn = make_uint2(0, 0), vn = dvn;
      if (ahead) dvn = load_dv(dsrc.dv[j + 1] + off), vn = sl.load(src.v[j + 1] + off);
      float v[rows::kEpt], dv[rows::kEpt];
      rows::unpack(vc, v);
      rows::unpack(dvc, dv);
#pragma unroll
      for (int q = Q - 1; q >= 0; --q) {
        const int i = q * k + j;
        const float cv = xw[i], cw = xd[i], a = av[i];
        float w[rows::kEpt], y[rows::kEpt];
        rows::unpack(wsl[q * G + t], w);
        rows::unpack(dsl[q * G + t], y);
#pragma unroll
        for (int e = 0; e < rows::kEpt; ++e) {
          dv[e] += fmaf(cv, v[e], fmaf(cw, w[e], a * y[e]));
          dw[q][e] = fmaf(cw, v[e], dw[q][e]);
        }
      }
      sl.store(dsrc.dv[j] + off, dv);
      if (j + 1 < k) {
        if (!ahead) dvn = load_dv(dsrc.dv[j + 1] + off), vn = sl.load(src.v[j + 1] + off);  // after the store
        dvc = dvn, vc = vn;
      }
    }
    // (No barrier: a thread reads back only its own dsl slots; red is written
    // after every thread has passed this row's second barrier, xw, xd, av
    // after the next row's first.)
  }
#pragma unroll
  for (int q = 0; q < Q; ++q)
    sl.store_f32(dw_partial + (int64_t(q) * gridDim.x + blockIdx.x) * d, dw[q]);
}

// dw of the depth queries, deterministic, in two kernels. mix_dw_kernel: one
// block per (chunk of kDwRows rows, query), the query varying fastest (so the
// Q blocks of the same rows share their source reads through L2):
//   partial[q, chunk, :] = sum_{rows, j} coef[q, row, j] v_j[row, :].
// The block is R = kDwThreads / G row groups of the row kernels' size G
// (8 warps at d <= 1024). Row group r takes the chunk's rows
// r, r + R, ... and sums coef v_j over them and the sources in order, in
// registers; the R sums then meet in shared memory and are added in r order.
// Fixed shapes, so fixed bits. (A single warp per chunk of 64 rows would run
// about 2 warps per SM at N = 16K: latency-bound.)
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

}  // namespace

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
  launch_dw_reduce(dws, partial.data<float>(), chunks, d, Q);
}
template void launch_dw<float>(const DwPtrs&, const float*, const Sources<float>&, int, int,
                               int64_t, int64_t, const RowLayout&, bool);
template void launch_dw<bf16>(const DwPtrs&, const float*, const Sources<bf16>&, int, int,
                              int64_t, int64_t, const RowLayout&, bool);

void launch_dw_reduce(const DwPtrs& dws, const float* partial, int64_t chunks, int64_t d, int Q) {
  dw_reduce_kernel<<<dim3(static_cast<unsigned>(ceil_div(d, 32)), static_cast<unsigned>(Q)), 1024,
                     0, stream()>>>(dws, partial, chunks, d);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::kernels::cuda::mix

namespace attnres::kernels::cuda {

using namespace mix;

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

void mix_forward(Span<Tensor> outs, Tensor& probs, Tensor* lse, Span<const Tensor> ws,
                 Span<const Tensor> sources, Span<const Tensor> rstds) {
  const char* op = "mix_forward";
  check_capacity(op, sources.size());
  const int64_t N = sources[0].dim(0), d = ws[0].dim(0);
  const int k = static_cast<int>(sources.size()), n_queries = static_cast<int>(ws.size());
  if (N == 0) return;
  dispatch_float(ws[0], op, [&](auto tag) {
    using T = decltype(tag);
    bool aligned = d % 8 == 0;
    const Sources<T> src = source_ptrs<T>(sources, rstds, aligned);
    // The rows kernel where it applies (kernels/mix_rows.h).
    const mix_rows::Plan plan =
        mix_rows::plan_phase1(false, std::is_same_v<T, bf16>, rows_aligned(d, {outs, ws, sources}),
                              d, n_queries, k);
    if constexpr (std::is_same_v<T, bf16>) {
      if (plan.rows) {
        for (int q0 = 0; q0 < n_queries; q0 += plan.queries) {
          const int Q = std::min(plan.queries, n_queries - q0);
          Queries<bf16> qs{};
          for (int q = 0; q < Q; ++q) {
            qs.w[q] = dptr<bf16>(ws[q0 + q]);
            qs.out[q] = dptr<bf16>(outs[q0 + q]);
          }
          float* pp = dptr<float>(probs) + int64_t(q0) * N * k;
          float* lp = lse ? dptr<float>(*lse) + int64_t(q0) * N : nullptr;
          const size_t smem = mix_rows::forward_smem(Q, k, plan.threads);
          with_int<1, mix_rows::kMaxQueries>("Q", Q, [&](auto qn) {
            auto kernel = mix_forward_rows_kernel<decltype(qn)::value>;
            const int64_t grid = resident_grid(op, kernel, plan.threads, smem, N, 1);
            kernel<<<static_cast<unsigned>(grid), plan.threads, smem, stream()>>>(qs, pp, lp, src,
                                                                                 k, N, d);
            ATTNRES_CUDA_CHECK_LAUNCH();
          });
        }
        return;
      }
    }
    const RowLayout lay = row_layout(op, d);
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
                  Span<const Tensor> rstds, const Tensor& probs, Store store) {
  const char* op = "mix_backward";
  check_capacity(op, sources.size());
  const int64_t N = sources[0].dim(0), d = ws[0].dim(0);
  const int k = static_cast<int>(sources.size()), n_queries = static_cast<int>(ws.size());
  if (N == 0 || d == 0) return;  // nothing to add anywhere
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
    const mix_rows::Plan plan = mix_rows::plan_phase1(
        true, std::is_same_v<T, bf16>, rows_aligned(d, {dsources, douts, ws, sources}), d,
        n_queries, k);
    const RowLayout lay = row_layout(op, d);
    // Launches of up to plan.queries (rows) or kMaxQueries (warp) queries,
    // the last queries first (the descending order of kernels/mix.h).
    const int per_launch = plan.rows ? plan.queries : kMaxQueries;
    const int n_launches = static_cast<int>(ceil_div(n_queries, per_launch));
    for (int c = n_launches - 1; c >= 0; --c) {
      const int q0 = c * per_launch, Q = std::min(per_launch, n_queries - q0);
      QueryGrads<T> qg{};
      DwPtrs dwp{};
      bool al = aligned;
      for (int q = 0; q < Q; ++q) {
        qg.w[q] = dptr<T>(ws[q0 + q]);
        qg.dout[q] = dptr<T>(douts[q0 + q]);
        dwp.dw[q] = dptr<float>(dws[q0 + q]);
        al = al && aligned16(qg.w[q]) && aligned16(qg.dout[q]);
      }
      const float* dl = dlse ? dptr<float>(*dlse) + int64_t(q0) * N : nullptr;
      const float* pp = dptr<float>(probs) + int64_t(q0) * N * k;
      // Store::Set: the first launch writes (the dsources are distinct,
      // kernels/mix.cpp), the later ones add.
      const bool set = store == Store::Set && c == n_launches - 1;
      if constexpr (std::is_same_v<T, bf16>) {
        if (plan.rows) {  // dw summed in the row passes: per-block partials, then the reduction
          const size_t smem = mix_rows::backward_smem(Q, k, plan.threads);
          with_int<1, mix_rows::kMaxQueries>("Q", Q, [&](auto qn) {
            auto kernel = mix_backward_rows_kernel<decltype(qn)::value>;
            const int64_t grid = partial_grid(op, kernel, plan.threads, smem, N);
            Tensor partial = Tensor::empty({Q, grid, d}, DType::F32, Device::CUDA);
            kernel<<<static_cast<unsigned>(grid), plan.threads, smem, stream()>>>(
                dsrc, partial.data<float>(), qg, dl, src, pp, k, N, d, set);
            ATTNRES_CUDA_CHECK_LAUNCH();
            launch_dw_reduce(dwp, partial.data<float>(), grid, d, Q);
          });
          continue;
        }
      }
      // The warp kernel. Shared memory per group: kc cached source rows, then
      // the dots and the softmax sums.
      Tensor coef = Tensor::empty({Q, N, k}, DType::F32, Device::CUDA);
      const int groups_per_block = lay.groups_per_block(), threads = lay.threads();
      const size_t row_bytes = size_t(lay.vpt) * lay.group_size() * sizeof(Pack<T>);
      const size_t db = dots_bytes(Q, k);
      const size_t per_group = kSmemBudget / groups_per_block;
      const int kc =
          per_group > db ? static_cast<int>(std::min<size_t>(k, (per_group - db) / row_bytes)) : 0;
      const size_t smem = groups_per_block * (kc * row_bytes + db);
      with_variant(lay.vpt, al, [&](auto vpt, auto alc) {
        constexpr int VPT = decltype(vpt)::value;
        constexpr bool AL = decltype(alc)::value;
        auto kernel = Q == 1 ? mix_backward_kernel<T, VPT, AL, true>
                             : mix_backward_kernel<T, VPT, AL, false>;
        // (The rows' results do not depend on the grid: dw is formed by launch_dw.)
        const int64_t grid = resident_grid(op, kernel, threads, smem, N, groups_per_block);
        kernel<<<static_cast<unsigned>(grid), threads, smem, stream()>>>(
            dsrc, coef.data<float>(), qg, Q, dl, src, pp, k, kc, N, d, lay.block_mode(), set);
        ATTNRES_CUDA_CHECK_LAUNCH();
      });
      launch_dw<T>(dwp, coef.data<float>(), src, Q, k, N, d, lay, src_aligned);
    }
  });
}

}  // namespace attnres::kernels::cuda
