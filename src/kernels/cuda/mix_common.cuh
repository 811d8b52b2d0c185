// Private to the CUDA AttnRes depth Mix (mix.cu: the source rstd, phase 1
// and the dw kernels; mix_merge_norm.cu: phase 2): the row-group machinery
// both phases' row kernels are built on, their launch helpers, and the dw
// launchers mix.cu provides. kernels/mix.h, docs/model.md section 2 and the
// CPU reference kernels/cpu/mix.cpp define the op.
//
// The op is memory-bound: per token row it streams k source rows of d
// elements and does O(k d) FLOPs. Every row kernel works on rows with row
// groups. A group of threads owns one token row at a time: one warp when
// d <= 1024 (several rows per block; reductions are warp shuffles, no block
// barrier), else a whole block of ceil(d / 1024) warps, at most 8 (so
// d <= 8192; reductions through shared memory). Thread t of a group of G owns
// VPT "slots" of 8 consecutive elements, slot i covering [(i G + t) 8, +8):
// one 16-byte load per slot for bf16 (two for fp32), coalesced across the
// group. VPT (1..4) is a template parameter so the row lives in registers.
//
// Source pointers travel in a by-value kernel parameter of fixed capacity
// (kMaxSources), so no device-side pointer array has to be uploaded per call.
//
// dw of the depth weights (sums over rows) is deterministic in both phases:
// the row kernels store each row's coefficient, and launch_dw sums coef * v
// over fixed chunks of rows in order, then the chunks column by column in a
// fixed order (in double).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "core/span.h"
#include "kernels/cuda/common.cuh"
#include "kernels/mix_rows.h"

namespace attnres::kernels::cuda::mix {

constexpr int kMaxSources = 64;  // by-value parameter capacity (1.5 KiB of pointers)
constexpr int kMaxVpt = 4;       // slots of 8 elements per thread: 32 values in registers
constexpr int kWarpRowThreads = 128;  // warp mode: 4 rows per block
// Block mode: up to 8 warps per row, so d <= 8192. (The bound also lets the
// compiler give each thread up to 255 registers: the row slots live there.)
constexpr int kMaxThreads = 256;

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
// more are split over launches); dw launches are as wide.
constexpr int kMaxQueries = 16;
struct DwPtrs {
  float* dw[kMaxQueries];
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
  // Two sums with one pair of barriers in block mode. Written out rather
  // than through block_reduce, and used even by callers that need only .x:
  // ptxas allocates the merge kernels' registers differently for either
  // alternative, with spills at d = 1024.
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

inline RowLayout row_layout(const char* op, int64_t d) {
  const int64_t slots = std::max<int64_t>(1, ceil_div(d, 8));
  if (slots <= 32 * kMaxVpt) return {static_cast<int>(ceil_div(slots, 32)), 1};
  const int64_t wpr = ceil_div(slots, 32 * kMaxVpt);
  if (wpr * 32 > kMaxThreads)
    fail(op, ": d = ", d, " exceeds the CUDA kernel's limit of ", kMaxThreads * kMaxVpt * 8);
  return {static_cast<int>(ceil_div(slots, 32 * wpr)), static_cast<int>(wpr)};
}

// Runs fn(integral_constant<int, n>) for the runtime n in [Lo, Hi], one
// instantiation per value (kernels whose per-thread arrays have n entries).
template <int Lo, int Hi, typename Fn>
void with_int(const char* what, int n, Fn&& fn) {
  if constexpr (Lo > Hi) {
    fail("mix: internal error, ", what, " = ", n);
  } else if (n == Lo) {
    fn(std::integral_constant<int, Lo>{});
  } else {
    with_int<Lo + 1, Hi>(what, n, fn);
  }
}

// Runs fn(integral_constant<int, VPT>, bool_constant<ALIGNED>) for the runtime
// choice, instantiating every kernel variant once.
template <typename Fn>
void with_variant(int vpt, bool aligned, Fn&& fn) {
  with_int<1, kMaxVpt>("VPT", vpt, [&](auto v) {
    if (aligned) fn(v, std::true_type{});
    else fn(v, std::false_type{});
  });
}

inline void check_capacity(const char* op, size_t k) {
  if (k > static_cast<size_t>(kMaxSources))
    fail(op, ": ", k, " sources exceed the CUDA kernel's capacity of ", kMaxSources);
}

// 16-byte alignment (a named helper: the launchers' `aligned` flags would hide
// common.cuh's aligned()).
inline bool aligned16(const void* p) { return aligned(p, 16); }

// The rows kernels' alignment condition (kernels/mix_rows.h): d % 4 == 0 and
// the data of every tensor of the groups 8-byte aligned.
inline bool rows_aligned(int64_t d, std::initializer_list<Span<const Tensor>> groups) {
  if (d % mix_rows::kEpt != 0) return false;
  for (const Span<const Tensor>& g : groups)
    for (const Tensor& t : g)
      if (!aligned(t.raw(), 8)) return false;
  return true;
}
inline Span<const Tensor> one(const Tensor& t) { return Span<const Tensor>(&t, 1); }

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
inline RowGrid row_grid(const RowLayout& lay, int64_t rows, int per_row = 1) {
  return {static_cast<unsigned>(ceil_div(rows, lay.groups_per_block()) * per_row), lay.threads()};
}

// Blocks resident per SM for a kernel of `threads` threads with `smem` bytes
// of dynamic shared memory (raising the kernel's shared-memory limit when
// needed); an error when none fits.
template <typename Kernel>
int resident_per_sm(const char* op, Kernel kernel, int threads, size_t smem) {
  allow_smem(kernel, smem);
  int per_sm = 0;
  ATTNRES_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  ATTNRES_CHECK(per_sm > 0, op, ": no block of ", threads, " threads with ", smem,
                " bytes of shared memory fits on an SM");
  return per_sm;
}

// Grid of a row kernel that strides rows over one wave of resident blocks:
// for kernels whose results do not depend on the grid (each row on its own).
template <typename Kernel>
int64_t resident_grid(const char* op, Kernel kernel, int threads, size_t smem, int64_t rows,
                      int rows_per_block) {
  const int per_sm = resident_per_sm(op, kernel, threads, smem);
  const int64_t sms = ::attnres::cuda::device_properties().multiProcessorCount;
  return std::min<int64_t>(ceil_div(rows, rows_per_block), sms * per_sm);
}

// Grid of a row kernel that sums per-block partials (dw, dgain: block b takes
// rows b, b + grid, ..., its partial row summed in that order, then the
// partials in block order). Its bits depend on the grid, so the grid depends
// on the row count alone: not on the occupancy (which changes with the
// kernel's template, the query count Q and its shared memory, so a query's dw
// would depend on the queries beside it) nor on the device. 512 blocks is
// about a wave of 4 blocks per SM on an H100 (132 SMs); the partials' reduce
// reads 512 d floats per query.
constexpr int64_t kPartialBlocks = 512;
template <typename Kernel>
int64_t partial_grid(const char* op, Kernel kernel, int threads, size_t smem, int64_t rows) {
  resident_per_sm(op, kernel, threads, smem);  // the smem limit raised, and a block fits
  return std::min<int64_t>(rows, kPartialBlocks);
}

// ---- the rows layout (kernels/mix_rows.h) --------------------------------------
// Thread t of a block owns the 4 elements [4 t, 4 t + 4) of a bf16 row: one
// 8-byte load or store. d % 4 == 0, so a slot is all in or all out.
namespace rows {
using mix_rows::kEpt;
constexpr int kMaxThreads = mix_rows::kMaxThreads;

struct Slot {
  int64_t base;
  bool live;
  __device__ explicit Slot(int64_t d) : base(int64_t(threadIdx.x) * kEpt), live(base < d) {}
  __device__ uint2 load(const bf16* row) const {
    return live ? *reinterpret_cast<const uint2*>(row + base) : make_uint2(0, 0);
  }
  __device__ void store(bf16* row, const float (&x)[kEpt]) const {
    if (!live) return;
    bf16 tmp[kEpt];
#pragma unroll
    for (int e = 0; e < kEpt; ++e) tmp[e] = from_f32<bf16>(x[e]);
    uint2 u;
    memcpy(&u, tmp, sizeof u);
    *reinterpret_cast<uint2*>(row + base) = u;
  }
  // A per-block partial row of fp32 (dw, dgain): this thread's 4 elements.
  __device__ void store_f32(float* row, const float (&x)[kEpt]) const {
    if (live) *reinterpret_cast<float4*>(row + base) = make_float4(x[0], x[1], x[2], x[3]);
  }
};

__device__ __forceinline__ void unpack(const uint2& u, float (&x)[kEpt]) {
  bf16 tmp[kEpt];
  memcpy(tmp, &u, sizeof u);
#pragma unroll
  for (int e = 0; e < kEpt; ++e) x[e] = to_f32(tmp[e]);
}

__device__ __forceinline__ float dot(const float (&a)[kEpt], const float (&b)[kEpt]) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < kEpt; ++e) s = fmaf(a[e], b[e], s);
  return s;
}

// Sums each of v[0..R) over the warp (xor butterflies: every lane the same bits).
template <int R>
__device__ __forceinline__ void warp_sums(float (&v)[R]) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] += __shfl_xor_sync(0xffffffffu, v[r], o);
}

// Sums each of v[0..R) over the block: the warps' sums meet in red [32][R]
// and every thread adds them in warp order (the same bits everywhere). Starts
// with a barrier, so consecutive calls may share red.
template <int R>
__device__ void block_sums(float (&v)[R], float* red) {
  warp_sums<R>(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) red[warp * R + r] = v[r];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s = 0.0f;
    for (int w = 0; w < W; ++w) s += red[w * R + r];
    v[r] = s;
  }
}
}  // namespace rows

// ---- dw (mix.cu) -------------------------------------------------------------------
// dws.dw[q] += sum over rows and sources of coef[q, row, j] v_j[row] (q < Q):
// chunk partials of rows (mix_dw_kernel), then launch_dw_reduce.
template <typename T>
void launch_dw(const DwPtrs& dws, const float* coef, const Sources<T>& src, int Q, int k,
               int64_t N, int64_t d, const RowLayout& lay, bool aligned);
// dws.dw[q][c] += sum over b < chunks (in order) of partial[q, b, c], q < Q.
void launch_dw_reduce(const DwPtrs& dws, const float* partial, int64_t chunks, int64_t d, int Q);

}  // namespace attnres::kernels::cuda::mix
