// Private to the CUDA attention kernels (attention.cu, attention_fwd.cu,
// attention_bwd.cu): launch parameters, the launchers each file provides, and
// the PTX building blocks of the tensor-core (mma.sync) path.
//
// Two paths (chosen in attention.cu):
// - the mma path: BF16 with head dim 32, 64 or 128 and 16-byte aligned
//   pointers. FlashAttention-2 style kernels on tensor cores
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
struct Params {
  int B, T, H, Hkv, hd;
  int group;         // H / Hkv: query heads per KV head
  int64_t ldq, ldk;  // row strides (elements) of q/out/dq/dout and of k/v/dk/dv
  float scale;       // 1 / sqrt(hd)
  bool accumulate;   // backward: dq/dk/dv += gradients (Store::Add), else = (Store::Set)
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

}  // namespace attnres::kernels::cuda::attn
