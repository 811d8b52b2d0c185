// Private to the CUDA attention kernels (attention.cu, attention_fwd.cu,
// attention_bwd.cu): launch parameters, the launchers each file provides, the
// PTX building blocks of the tensor-core (mma.sync) path, and the tile loops
// the forward and backward kernels share (block-to-tile mapping, the generic
// path's 2 x 4 products, the warp-level mma products, the cp.async pipeline).
//
// Two paths (chosen in attention.cu):
// - the mma path: BF16 with head dim 32, 64 or 128, 16-byte aligned
//   pointers and row strides that are multiples of 16 bytes (every row start
//   16-byte aligned: tiles move in 16-byte cp.async / uint4 pieces).
//   FlashAttention-2 style kernels on tensor cores
//   (mma.sync.m16n8k16 bf16 -> fp32, ldmatrix fragments, cp.async
//   double-buffered tiles in padded shared memory);
// - the generic path: F32 (any head dim up to 256) and BF16 head dims the mma
//   path does not cover. fp32 CUDA-core FMA on 32 x 32 tiles in shared memory;
//   it matches the CPU to fp32 rounding (expf, fp32 accumulation).
// Both paths use the same backward structure: a preprocess kernel (per query
// row D = dO . O and the log-sum-exp in a padded layout), a kernel parallel
// over key tiles for dK/dV (GQA summed in registers over the group's query
// heads in a fixed order) and a kernel parallel over query tiles for dQ. No
// atomics anywhere, so every result is bit-reproducible.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace attnres::kernels::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxHeadDim = 256;  // the generic kernels' largest head-dim bucket

// Shape and strides of one call, passed by value to every kernel.
//
// Training: q, k, v are column blocks of one joint qkv [B*T, (H + 2 Hkv) hd]
// (and dq, dk, dv of dqkv, same layout), so all six share the row stride
// ldq = ldk = (H + 2 Hkv) hd; out and dout are separate [B*T, H hd] tensors
// with ldo = H hd. That is why out/dout have a stride of their own: a query
// row offset computed with ldq must never be used to address out or dout.
// Decode: q, out [B, H hd] (ldq = ldo = H hd), caches [B, Tmax, Hkv hd]
// (ldk = Hkv hd).
struct Params {
  int B, T, H, Hkv, hd;
  int group;        // H / Hkv: query heads per KV head
  int64_t ldq;      // row stride (elements) of q and dq
  int64_t ldo;      // row stride of out and dout
  int64_t ldk;      // row stride of k, v, dk, dv
  float scale;      // 1 / sqrt(hd)
  bool accumulate;  // backward: dq/dk/dv += gradients (Store::Add), else = (Store::Set)
};

// Rows of the backward scratch per (batch, head): T rounded up to 128 (the
// largest query tile), so tiles can read D and lse in 16-byte pieces without
// bounds checks. Padding rows hold D = 0 and lse = +inf (probability 0).
inline int64_t padded_rows(int64_t T) { return (T + 127) / 128 * 128; }

// ---- launchers -------------------------------------------------------------------
// attention_fwd.cu
template <typename T>
void forward_generic(const Params& p, T* out, float* lse, const T* q, const T* k, const T* v);
void forward_mma(const Params& p, bf16* out, float* lse, const bf16* q, const bf16* k,
                 const bf16* v);
// attention_bwd.cu (each runs the preprocess kernel, then dK/dV, then dQ)
template <typename T>
void backward_generic(const Params& p, T* dq, T* dk, T* dv, const T* dout, const T* q,
                      const T* k, const T* v, const T* out, const float* lse);
void backward_mma(const Params& p, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                  const bf16* k, const bf16* v, const bf16* out, const float* lse);

// Head dims the mma kernels are instantiated for.
inline bool mma_head_dim(int hd) { return hd == 32 || hd == 64 || hd == 128; }

// ---- PTX building blocks (sm_80+) ------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses registers (and L1). With
// valid == false the 16 bytes are zero-filled (src-size 0) and nothing is read,
// which is how rows past the end of a sequence become zeros.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A thread's place in its warp's mma fragments (see mma_bf16 below): its warp,
// its lane, the fragment row g = lane / 4 (C rows g and g + 8) and tig =
// lane % 4 (C columns 2 tig, 2 tig + 1 of each 8-column n-block).
struct FragLane {
  int warp, lane, g, tig;
};
__device__ __forceinline__ FragLane frag_lane() {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  return {warp, lane, lane >> 2, lane & 3};
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i and
// every lane receives, in r[i], row lane/4, columns 2*(lane%4), +1 of matrix i
// (with .trans: column lane/4, rows 2*(lane%4), +1).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c[16x8] += a[16x16] b[16x8], bf16 inputs, fp32 accumulators. Fragments
// (g = lane/4, t = lane%4): a = {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)},
// b = {(k 2t.., n g), (k 2t+8.., n g)}, c = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the MUFU unit (one instruction; flushes denormal results to 0,
// irrelevant for probabilities). ex2(-inf) = +0, which is how masked scores
// become probability 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> bf16x2 (round to nearest even), `lo` in the low half: the
// element at the lower column index, as ldmatrix would load it.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// The A fragment of a 16x16 block of a product P (16 rows x 16 columns, the
// columns being the k dimension of the next mma) from the two 16x8 C
// fragments that hold its columns 0-7 (c0) and 8-15 (c1): the register layout
// of C pairs matches A's, which is what lets FlashAttention keep P in registers.
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                       const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Shared-memory row stride (elements) of a bf16 tile with D columns: 8 extra
// elements (16 bytes) shift consecutive rows by 4 banks, so the 8 rows an
// ldmatrix phase reads (16 bytes each) hit 32 distinct banks.
template <int D>
constexpr int smem_row() { return D + 8; }

// Asynchronously copies a ROWS x D bf16 tile (global row stride ld) into
// shared memory (row stride smem_row<D>()); rows >= nvalid become zeros. The
// tile's first row must exist (nvalid >= 1): its address stands in as the
// source of the zero-filled copies.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_async(bf16* s, const bf16* g, int64_t ld, int nvalid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kTotal = ROWS * kChunks;
#pragma unroll
  for (int i0 = 0; i0 < kTotal; i0 += NT) {
    const int i = i0 + static_cast<int>(threadIdx.x);
    if (kTotal % NT == 0 || i < kTotal) {
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = r < nvalid;
      cp_async16(smem_u32(s + r * smem_row<D>() + c * 8), ok ? g + r * ld + c * 8 : g, ok);
    }
  }
}

// Gradient stores, each element written by exactly one thread: dst = v, or
// dst += v when accumulating (read, add in fp32, round once). Without
// accumulation the old value is never read (it may be NaN).
template <typename T>
__device__ __forceinline__ void put(T* dst, float v, bool accumulate) {
  *dst = from_f32<T>(accumulate ? to_f32(*dst) + v : v);
}
// The same for a 4-byte aligned bf16 pair.
__device__ __forceinline__ void put_pair(bf16* dst, float a, float b, bool accumulate) {
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(dst);
  if (accumulate) {
    const float2 f = __bfloat1622float2(*p);
    a += f.x;
    b += f.y;
  }
  *p = __floats2bfloat162_rn(a, b);
}

// ---- tiles of a block ------------------------------------------------------------
// Blocks of the kernels over query tiles (forward, dQ) take the longest tiles
// (the last ones, which see the most keys) of every (batch, head) first,
// which balances the causal triangle's uneven work across the SMs.
struct QueryTile {
  int bh;       // batch * H + head
  int b, h, j;  // batch, query head, its KV head
  int q0;       // first query row
};
template <int BQ>
__device__ __forceinline__ QueryTile query_tile(const Params& p) {
  const int BH = p.B * p.H;
  const int nqt = (p.T + BQ - 1) / BQ;
  QueryTile t;
  t.bh = static_cast<int>(blockIdx.x % BH);
  const int qt = nqt - 1 - static_cast<int>(blockIdx.x / BH);
  t.b = t.bh / p.H;
  t.h = t.bh % p.H;
  t.j = t.h / p.group;
  t.q0 = qt * BQ;
  return t;
}
// Key tiles of BK keys that rows [q0, q0 + BQ) see (causal: keys up to the
// tile's last row).
template <int BQ, int BK>
__device__ __forceinline__ int visible_key_tiles(int q0, int T_) {
  const int kv_end = min(q0 + BQ, T_);
  return (kv_end + BK - 1) / BK;
}

// Blocks of the dK/dV kernels: one key tile of one (batch, KV head), the early
// key tiles (seen by the most queries) first.
struct KeyTile {
  int b, j;  // batch, KV head
  int kt;    // key tile index
  int k0;    // first key
};
template <int BK>
__device__ __forceinline__ KeyTile key_tile(const Params& p) {
  const int BKV = p.B * p.Hkv;
  const int bj = static_cast<int>(blockIdx.x % BKV);
  KeyTile t;
  t.kt = static_cast<int>(blockIdx.x / BKV);
  t.b = bj / p.Hkv;
  t.j = bj % p.Hkv;
  t.k0 = t.kt * BK;
  return t;
}

// ---- generic fp32 path -------------------------------------------------------------
// 32 x 32 tiles, 128 threads as 16 x 8: thread (ty, tx) = (tid / 8, tid % 8)
// owns rows 2ty, 2ty+1 of a tile's score block and its columns tx + 8c.
constexpr int kGenTile = 32;      // query rows and keys per tile
constexpr int kGenThreads = 128;  // 16 x 8 threads

// Two products of the same shape at once, over hd columns of shared rows of
// stride SR: x[i][c] = a[2ty + i] . b[tx + 8c] and y[i][c] = a2[2ty + i] . b2[tx + 8c]
// (S and dP, one pass over d).
template <int SR>
__device__ __forceinline__ void dots_2x4_pair(float (&x)[2][4], float (&y)[2][4], const float* a,
                                              const float* b, const float* a2, const float* b2,
                                              int hd, int ty, int tx) {
  for (int d = 0; d < hd; ++d) {
    const float a0 = a[(2 * ty) * SR + d], a1 = a[(2 * ty + 1) * SR + d];
    const float c0 = a2[(2 * ty) * SR + d], c1 = a2[(2 * ty + 1) * SR + d];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float bv = b[(tx + 8 * c) * SR + d], b2v = b2[(tx + 8 * c) * SR + d];
      x[0][c] = fmaf(a0, bv, x[0][c]);
      x[1][c] = fmaf(a1, bv, x[1][c]);
      y[0][c] = fmaf(c0, b2v, y[0][c]);
      y[1][c] = fmaf(c1, b2v, y[1][c]);
    }
  }
}

// acc[i][c] += sum over kk of w[2ty + i][kk] b[kk][tx + 8c] for output columns
// tx + 8c < hd: w a kGenTile x kGenTile block (rows of stride kGenTile + 1;
// P or dS), b kGenTile rows of stride BR (V or K).
template <int NC, int BR>
__device__ __forceinline__ void acc_2xNC(float (&acc)[2][NC], const float* w, const float* b,
                                         int hd, int ty, int tx) {
  constexpr int WR = kGenTile + 1;
  for (int kk = 0; kk < kGenTile; ++kk) {
    const float w0 = w[(2 * ty) * WR + kk], w1 = w[(2 * ty + 1) * WR + kk];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = tx + 8 * c;
      if (col < hd) {
        const float bv = b[kk * BR + col];
        acc[0][c] = fmaf(w0, bv, acc[0][c]);
        acc[1][c] = fmaf(w1, bv, acc[1][c]);
      }
    }
  }
}

// ---- tensor-core path: warp tiles ------------------------------------------------------
// ldmatrix lane offsets (in elements, for a tile with row stride SR). A
// operand (16 rows x 16 k): lanes 0-15 address rows 0-15 at k 0, lanes 16-31
// rows 0-15 at k 8. B operand from a [n][k] tile: matrices (n 0-7, k 0-7),
// (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1 of n-block 0
// and b0, b1 of n-block 1. B operand from a [k][n] tile via .trans: matrices
// (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
template <int SR>
struct LdsmOffsets {
  int a, bn, bt;
  __device__ explicit LdsmOffsets(int lane)
      : a((lane & 15) * SR + (lane >> 4) * 8),
        bn(((lane & 7) + (lane >> 4) * 8) * SR + ((lane >> 3) & 1) * 8),
        bt(((lane & 7) + ((lane >> 3) & 1) * 8) * SR + (lane >> 4) * 8) {}
};

// A warp owns MT m-tiles of 16 rows; live[mt] says whether m-tile mt has work
// in the current tile (warp-uniform). The products below take the A operand
// of k-step kk (16 columns of k) from a_frag(kk, a), which fills a[mt] for
// the live m-tiles. The caller owns a (one k-step's A fragments): declared in
// the kernel, next to the other register tiles, it keeps ptxas's register
// allocation of the kernels as it is with the loops written out.
// - A rows in shared memory: rows row0 + [0, 16 MT) of a tile at s (row
//   stride SR), a_off = LdsmOffsets::a:
template <int MT, int SR>
__device__ __forceinline__ auto smem_frags(const bf16* s, int row0, int a_off,
                                           const bool (&live)[MT]) {
  return [=, &live](int kk, uint32_t (&a)[MT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      if (live[mt]) ldsm_x4(a[mt], smem_u32(s + (row0 + mt * 16) * SR + a_off + kk * 16));
  };
}
// - A fragments already in registers, x[mt][kk]:
template <int MT, int KK>
__device__ __forceinline__ auto reg_frags(const uint32_t (&x)[MT][KK][4]) {
  return [&x](int kk, uint32_t (&a)[MT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) a[mt][i] = x[mt][kk][i];
  };
}
// - A = a product's C fragments c (16 rows x 8 columns each) packed to bf16:
//   k-step kk takes c[mt][2 kk] and c[mt][2 kk + 1] (every m-tile).
template <int MT, int NB>
__device__ __forceinline__ auto c_frags(const float (&c)[MT][NB][4]) {
  return [&c](int kk, uint32_t (&a)[MT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) c_to_a(a[mt], c[mt][2 * kk], c[mt][2 * kk + 1]);
  };
}

// c += A B for the live m-tiles, A 16 MT rows x K, B K x N from a tile in
// shared memory (row stride SR) at s: an [n][k] tile (TRANS_B false, b_off =
// LdsmOffsets::bn) or a [k][n] tile read with ldmatrix.trans (TRANS_B true,
// b_off = LdsmOffsets::bt). Each B fragment feeds every live m-tile.
template <bool TRANS_B, int MT, int K, int N, int SR, typename AFrag>
__device__ __forceinline__ void mma_acc(float (&c)[MT][N / 8][4], uint32_t (&a)[MT][4],
                                        AFrag&& a_frag, const bf16* s, int b_off,
                                        const bool (&live)[MT]) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    a_frag(kk, a);
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      uint32_t b[4];
      if constexpr (TRANS_B) ldsm_x4_t(b, smem_u32(s + kk * 16 * SR + b_off + nb * 16));
      else ldsm_x4(b, smem_u32(s + nb * 16 * SR + b_off + kk * 16));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (!live[mt]) continue;
        mma_bf16(c[mt][2 * nb], a[mt], b[0], b[1]);
        mma_bf16(c[mt][2 * nb + 1], a[mt], b[2], b[3]);
      }
    }
  }
}
// Zeroes a warp's C fragments: MT m-tiles of NB n-blocks (16 x 8 each).
template <int MT, int NB>
__device__ __forceinline__ void zero_frags(float (&c)[MT][NB][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[mt][n][e] = 0.f;
}

// c = A B^T (B an [n][k] tile of N rows x K) for the live m-tiles.
template <int MT, int N, int K, int SR, typename AFrag>
__device__ __forceinline__ void mma_abt(float (&c)[MT][N / 8][4], uint32_t (&a)[MT][4],
                                        AFrag&& a_frag, const bf16* s, int bn_off,
                                        const bool (&live)[MT]) {
  zero_frags(c);
  mma_acc<false, MT, K, N, SR>(c, a, a_frag, s, bn_off, live);
}
// c += A B (B a [k][n] tile of K rows x N) for the live m-tiles.
template <int MT, int K, int N, int SR, typename AFrag>
__device__ __forceinline__ void mma_ab_acc(float (&c)[MT][N / 8][4], uint32_t (&a)[MT][4],
                                           AFrag&& a_frag, const bf16* s, int bt_off,
                                           const bool (&live)[MT]) {
  mma_acc<true, MT, K, N, SR>(c, a, a_frag, s, bt_off, live);
}

// Calls put(mt, r, row, col) for each row of a warp's C fragments that
// exists (row < T_): m-tile mt holds rows row0 + 16 mt + g (r = 0: elements
// 0, 1) and + 8 (r = 1: elements 2, 3), in columns col = 2 tig and col + 1 of
// each 8-column n-block. For the epilogues that store gradients with put_pair.
template <int MT, typename Put>
__device__ __forceinline__ void for_frag_rows(int row0, int T_, Put&& put) {
  const FragLane fl = frag_lane();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + mt * 16 + fl.g + 8 * r;
      if (row >= T_) continue;
      put(mt, r, row, fl.tig * 2);
    }
  }
}

// ---- tensor-core path: double-buffered tiles -----------------------------------------
// One step of a two-stage cp.async pipeline over n items: issue(it + 1, stage)
// starts the next item's copies into the other stage, then this waits until
// item it (stage it & 1) has landed for the whole block. Item 0 must have been
// issued and committed before the loop.
template <typename Issue>
__device__ __forceinline__ void pipeline_wait(int it, int n, Issue&& issue) {
  if (it + 1 < n) {
    issue(it + 1, (it & 1) ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// Key tile t (BK keys from t BK on) of K and V (rows of stride ld from kg, vg)
// into stage `stage` of sK and sV ([2][BK][smem_row<D>()] each).
template <int BK, int D, int NT>
__device__ __forceinline__ void load_kv_tile(bf16* sK, bf16* sV, const bf16* kg, const bf16* vg,
                                             int64_t ld, int T_, int t, int stage) {
  constexpr int SR = smem_row<D>();
  const int k1 = t * BK;
  load_tile_async<BK, D, NT>(sK + stage * BK * SR, kg + int64_t(k1) * ld, ld, T_ - k1);
  load_tile_async<BK, D, NT>(sV + stage * BK * SR, vg + int64_t(k1) * ld, ld, T_ - k1);
}

// The kernels over query tiles (forward, dQ) stream the key tiles of their KV
// head: issue(t, stage) for pipeline_wait copies key tile t of K and V (batch
// b, KV head j, in the joint qkv: row stride ldk) into `stage` of sK and sV.
template <int BK, int D, int NT>
__device__ __forceinline__ auto kv_tile_issuer(bf16* sK, bf16* sV, const bf16* k, const bf16* v,
                                               const Params& p, int b, int j) {
  const bf16* kg = k + int64_t(b) * p.T * p.ldk + int64_t(j) * D;
  const bf16* vg = v + int64_t(b) * p.T * p.ldk + int64_t(j) * D;
  const int64_t ld = p.ldk;
  const int T_ = p.T;
  return [=](int t, int stage) { load_kv_tile<BK, D, NT>(sK, sV, kg, vg, ld, T_, t, stage); };
}

// Which of a warp's m-tiles (rows wq0 + 16 mt + [0, 16), forward and dQ) have
// work in the key tile from k0: live[mt] when one of its rows is at or after
// k0 (causal) and before T_. Returns whether the warp has any: false when all
// its rows precede the tile's first key or lie past the end of the sequence
// (both warp-uniform), so it skips the tile.
template <int MT>
__device__ __forceinline__ bool live_row_tiles(bool (&live)[MT], int k0, int wq0, int T_) {
  if (k0 <= wq0 + 16 * MT - 1 && wq0 < T_) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) live[mt] = k0 <= wq0 + mt * 16 + 15 && wq0 + mt * 16 < T_;
    return true;
  }
  return false;  // (live is left unset)
}

}  // namespace attnres::kernels::cuda::attn
