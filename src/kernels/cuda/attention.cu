// CUDA causal GQA attention (see kernels/attention.h): path selection and the
// KV-cache decode kernel. The training kernels live in attention_fwd.cu and
// attention_bwd.cu; attention.cuh describes their design.
//
// Layout: q, k and v are the column blocks of one joint qkv [B*T, (H + 2 Hkv)
// hd] (q at column 0, k at H hd, v at (H + Hkv) hd; dq, dk, dv likewise in
// dqkv), so they share the joint row stride; out and dout are separate
// [B*T, H hd] tensors with a row stride of their own (attn::Params ldq, ldo,
// ldk).
//
// Path: BF16 tensors with head dim 32, 64 or 128 whose q/k/v/out (and
// gradient) pointers are 16-byte aligned and whose row strides are multiples
// of 16 bytes (so that every row start is; the tiles move in 16-byte pieces)
// run the tensor-core kernels. With hd % 8 == 0 both always hold for
// allocator-aligned tensors: the block offsets H hd, (H + Hkv) hd and the
// strides are multiples of 8 elements. Everything else (F32, other head dims
// up to 256) runs the generic fp32 kernels. Either way all arithmetic is fp32
// and lse is F32.
//
// Decode: one block of 128 threads per (sequence, head) streams the cache in
// chunks of 64 positions with an online softmax. Scores: each warp takes
// whole positions and reads the key row with its 32 lanes (coalesced), one
// warp-sum per score. Output: thread d owns output dims d and d + 128 and
// reads value rows coalesced across the block. Each cache element is read
// once (the kernel is memory bound: 2 * len * hd elements per head, ~4 * len
// * hd FLOPs); the query heads of a GQA group re-read their KV head's cache,
// mostly from L2. Every thread recomputes the chunk's max and sum from the
// shared scores in the same order, so no broadcast is needed and the result
// is deterministic.
#include "kernels/cuda/attention.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/attention.cuh"

namespace attnres::kernels::cuda {

namespace {

// ldq: row stride of q and dq; ldo: of out and dout; ldk: of k, v, dk, dv
// (elements). Training passes the joint qkv's width for ldq and ldk and H hd
// for ldo; decode passes its contiguous q/out and cache strides.
attn::Params make_params(const AttnShape& s, int64_t ldq, int64_t ldo, int64_t ldk,
                         const char* op) {
  if (s.hd > attn::kMaxHeadDim)
    fail(op, ": head dim ", s.hd, " is larger than the CUDA kernels support (",
         attn::kMaxHeadDim, ")");
  if (s.B > INT_MAX || s.T > INT_MAX || s.H > INT_MAX || s.B * s.H > INT_MAX ||
      s.B * s.T > INT_MAX)
    fail(op, ": shape B=", s.B, " T=", s.T, " H=", s.H, " is too large for the CUDA kernels");
  attn::Params p{};
  p.B = static_cast<int>(s.B);
  p.T = static_cast<int>(s.T);
  p.H = static_cast<int>(s.H);
  p.Hkv = static_cast<int>(s.Hkv);
  p.hd = static_cast<int>(s.hd);
  p.group = static_cast<int>(s.H / s.Hkv);
  p.ldq = ldq;
  p.ldo = ldo;
  p.ldk = ldk;
  p.scale = 1.f / std::sqrt(static_cast<float>(s.hd));  // as the CPU computes it in float
  p.accumulate = true;
  return p;
}

// Training-call strides: q, k, v (and dq, dk, dv) share the joint row.
attn::Params make_train_params(const AttnShape& s, const char* op) {
  const int64_t ld = qkv_width(s);  // (H + 2 Hkv) hd (kernels/attention.h)
  return make_params(s, ld, s.H * s.hd, ld, op);
}

// The mma kernels move tiles in 16-byte pieces (cp.async, uint4 stores) from
// base + row * ld: every pointer must be 16-byte aligned and every row stride
// a multiple of 16 bytes. (q/k/v are offsets into the joint row, so the
// pointers are checked, not the tensors.)
bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* ptr : ptrs)
    if (!aligned(ptr, 16)) return false;
  return true;
}
bool rows_aligned16(const attn::Params& p) {
  for (int64_t ld : {p.ldq, p.ldo, p.ldk})
    if (ld * int64_t(sizeof(bf16)) % 16 != 0) return false;
  return true;
}

// ---- decode ---------------------------------------------------------------------

constexpr int kDecThreads = 128;
constexpr int kDecChunk = 64;
constexpr int kDecDims = attn::kMaxHeadDim / kDecThreads;  // output dims per thread

template <typename T>
__global__ void __launch_bounds__(kDecThreads)
    decode_kernel(attn::Params p, int64_t Tmax, int len, T* __restrict__ out,
                  const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc) {
  __shared__ float sq[attn::kMaxHeadDim];
  __shared__ float ss[kDecChunk];  // scores, then probabilities
  const int bh = blockIdx.x;
  const int b = bh / p.H, h = bh % p.H, j = h / p.group;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int hd = p.hd;
  const int64_t qoff = int64_t(b) * p.ldq + int64_t(h) * hd;
  const int64_t ooff = int64_t(b) * p.ldo + int64_t(h) * hd;  // out's own stride (= ldq here)
  const T* kb = kc + int64_t(b) * Tmax * p.ldk + int64_t(j) * hd;
  const T* vb = vc + int64_t(b) * Tmax * p.ldk + int64_t(j) * hd;
  for (int d = tid; d < hd; d += kDecThreads) sq[d] = to_f32(q[qoff + d]);

  float o[kDecDims] = {};
  float m = -INFINITY, l = 0.f;
  for (int c0 = 0; c0 < len; c0 += kDecChunk) {
    const int nk = min(kDecChunk, len - c0);
    __syncthreads();  // sq is visible; the previous chunk's readers of ss are done
    for (int kk = warp; kk < nk; kk += kDecThreads / 32) {
      const T* krow = kb + int64_t(c0 + kk) * p.ldk;
      float dot = 0.f;
      for (int d = lane; d < hd; d += 32) dot = fmaf(sq[d], to_f32(krow[d]), dot);
      dot = warp_sum(dot);
      if (lane == 0) ss[kk] = dot * p.scale;
    }
    __syncthreads();
    float cmax = -INFINITY;
    for (int kk = 0; kk < nk; ++kk) cmax = fmaxf(cmax, ss[kk]);
    const float m_new = fmaxf(m, cmax);  // finite: every chunk has a real score
    const float corr = expf(m - m_new);  // 0 on the first chunk (m = -inf)
    __syncthreads();                     // everyone has read the scores
    if (tid < nk) ss[tid] = expf(ss[tid] - m_new);
    __syncthreads();
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kDecDims; ++i) o[i] *= corr;
    for (int kk = 0; kk < nk; ++kk) {
      const float pk = ss[kk];
      sum += pk;
      const T* vrow = vb + int64_t(c0 + kk) * p.ldk;
#pragma unroll
      for (int i = 0; i < kDecDims; ++i) {
        const int d = tid + i * kDecThreads;
        if (d < hd) o[i] = fmaf(pk, to_f32(vrow[d]), o[i]);
      }
    }
    l = l * corr + sum;
    m = m_new;
  }
  const float inv = 1.f / l;
#pragma unroll
  for (int i = 0; i < kDecDims; ++i) {
    const int d = tid + i * kDecThreads;
    if (d < hd) out[ooff + d] = from_f32<T>(o[i] * inv);
  }
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttnShape& s) {
  const char* op = "attention_forward";
  if (s.dv() != s.hd) return attention_forward_values(out, lse, qkv, s);
  if (s.B == 0 || s.T == 0) return;
  const attn::Params p = make_train_params(s, op);
  float* lp = dptr<float>(lse);
  dispatch_float(qkv, op, [&](auto tag) {
    using T = decltype(tag);
    const QkvBlocks<T> x = qkv_blocks(dptr<T>(qkv), s);
    T* o = dptr<T>(out);
    if constexpr (std::is_same_v<T, bf16>) {
      if (attn::mma_head_dim(p.hd) && rows_aligned16(p) && aligned16({o, x.q, x.k, x.v})) {
        attn::forward_mma(p, o, lp, x.q, x.k, x.v);
        return;
      }
    }
    attn::forward_generic<T>(p, o, lp, x.q, x.k, x.v);
  });
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const AttnShape& s, Store store) {
  const char* op = "attention_backward";
  if (s.dv() != s.hd) return attention_backward_values(dqkv, dout, qkv, out, lse, s, store);
  if (s.B == 0 || s.T == 0) return;
  attn::Params p = make_train_params(s, op);
  p.accumulate = store == Store::Add;  // all three blocks of dqkv: += (Add) or = (Set)
  const float* lp = dptr<float>(lse);
  dispatch_float(qkv, op, [&](auto tag) {
    using T = decltype(tag);
    const QkvBlocks<T> x = qkv_blocks(dptr<T>(qkv), s), dx = qkv_blocks(dptr<T>(dqkv), s);
    const T* o = dptr<T>(out);
    const T* dO = dptr<T>(dout);
    if constexpr (std::is_same_v<T, bf16>) {
      if (attn::mma_head_dim(p.hd) && rows_aligned16(p) &&
          aligned16({dx.q, dx.k, dx.v, dO, x.q, x.k, x.v, o})) {
        attn::backward_mma(p, dx.q, dx.k, dx.v, dO, x.q, x.k, x.v, o, lp);
        return;
      }
    }
    attn::backward_generic<T>(p, dx.q, dx.k, dx.v, dO, x.q, x.k, x.v, o, lp);
  });
}

void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t len, const AttnShape& s) {
  const char* op = "attention_decode";
  if (s.dv() != s.hd) return attention_decode_values(out, q, k_cache, v_cache, len, s);
  if (s.B == 0) return;
  AttnShape s1 = s;
  s1.T = 1;  // s.T is ignored by decode
  // q and out [B, H hd] are contiguous (not the training's joint qkv), the
  // caches [B, Tmax, Hkv hd]: one stride for q/out, one for the caches.
  const attn::Params p = make_params(s1, s.H * s.hd, s.H * s.hd, s.Hkv * s.hd, op);
  const int64_t Tmax = k_cache.dim(1);
  if (len > INT_MAX) fail(op, ": len=", len, " is too large for the CUDA kernel");
  dispatch_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    decode_kernel<T><<<static_cast<unsigned>(s.B * s.H), kDecThreads, 0, stream()>>>(
        p, Tmax, static_cast<int>(len), dptr<T>(out), dptr<T>(q), dptr<T>(k_cache),
        dptr<T>(v_cache));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attnres::kernels::cuda
