// CUDA causal attention whose values have a width of their own (vd != hd:
// MLA, model.mla; kernels/attention.h). The tiled kernels (attention_fwd.cu,
// attention_bwd.cu, the mma path and cuDNN's graphs) take one width for q, k
// and v; these take any hd, vd <= 256, written for correctness first: one
// block per query row (forward, dQ, decoding) or key row (dK/dV), the row's
// scores over its visible keys in shared memory (so T <= kMaxKeys), fp32
// arithmetic, every sum in a fixed order (no atomics: bit-reproducible). The
// FLOPs are the tiled kernels' (2 (hd + vd) per visible pair forward, about
// 3.5x backward), but every row re-reads its keys and values from L2.
//
// Layout as the tiled kernels: qkv [B*T, H hd + Hkv hd + Hkv vd] (q | k | v
// column blocks of the joint row), out / dout [B*T, H vd], lse [B, H, T] F32
// of the scaled scores; decoding q [B, H hd], caches [B, Tmax, Hkv hd] and
// [B, Tmax, Hkv vd], out [B, H vd].
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"

namespace attnres::kernels::cuda {

namespace {

constexpr int kThreads = 128;
// A row's fp32 scores (dK/dV: probabilities and dS, two rows) in shared memory:
// 2 x 96 KiB + the key and value rows, within an H100's 227 KiB.
constexpr int64_t kMaxKeys = 24 * 1024;

struct Dims {
  int B, T, H, Hkv, hd, vd, group;
  int64_t ld;   // the joint row's width (q, k, v and dq, dk, dv)
  int64_t ldo;  // out / dout: H vd
  float scale;  // 1 / sqrt(hd), as the CPU computes it in float
};

Dims dims_of(const AttnShape& s) {
  Dims d{};
  d.B = int(s.B), d.T = int(s.T), d.H = int(s.H), d.Hkv = int(s.Hkv), d.hd = int(s.hd);
  d.vd = int(s.dv()), d.group = int(s.H / s.Hkv);
  d.ld = qkv_width(s), d.ldo = s.H * s.dv();
  d.scale = 1.f / std::sqrt(static_cast<float>(s.hd));
  return d;
}

// (b, h, t) of block x over B H T rows in (b, h, t) order.
struct Row {
  int b, h, t;
};
__device__ __forceinline__ Row row_of(int64_t x, int H, int T) {
  return {int(x / (int64_t(H) * T)), int((x / T) % H), int(x % T)};
}

// Scores of query row `q` (fp32, shared) against keys 0 .. n-1 whose rows
// start at k (row stride ldk): s[j] = scale q . k_j; returns their maximum
// (block-wide). Ends with a barrier.
template <typename T>
__device__ float scores(float* s, const float* q, const T* k, int64_t ldk, int n, int hd,
                        float scale, float* scratch) {
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const T* kr = k + int64_t(j) * ldk;
    float dot = 0.f;
    for (int c = 0; c < hd; ++c) dot = fmaf(q[c], to_f32(kr[c]), dot);
    s[j] = dot * scale;
    mx = fmaxf(mx, s[j]);
  }
  mx = block_max(mx, scratch);
  __syncthreads();
  return mx;
}

// The softmax of the row's n scores s (max m) over its keys, and the output
// o = sum_i p_i v_i / sum_i p_i over vd columns (v rows ldv apart); returns
// the log-sum-exp m + log(sum). s is overwritten with the unnormalised p.
template <typename T>
__device__ float softmax_values(float* s, int n, float m, const T* v, int64_t ldv, int vd, T* o,
                                float* scratch) {
  float sum = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    s[i] = expf(s[i] - m);
    sum += s[i];
  }
  const float l = block_sum(sum, scratch);
  __syncthreads();
  for (int e = threadIdx.x; e < vd; e += blockDim.x) {
    float acc = 0.f;
    for (int i = 0; i < n; ++i) acc = fmaf(s[i], to_f32(v[int64_t(i) * ldv + e]), acc);
    o[e] = from_f32<T>(acc / l);
  }
  return m + logf(l);
}

// Forward: block per (b, h, query t).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(Dims d, T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv) {
  extern __shared__ float sm[];
  float* sq = sm;           // [hd]
  float* s = sm + d.hd;     // [t + 1]
  __shared__ float scratch[32];
  const Row r = row_of(blockIdx.x, d.H, d.T);
  const int j = r.h / d.group, n = r.t + 1;
  const T* base = qkv + int64_t(r.b) * d.T * d.ld;
  const T* q = base + int64_t(r.t) * d.ld + int64_t(r.h) * d.hd;
  const T* k = base + int64_t(d.H) * d.hd + int64_t(j) * d.hd;
  const T* v = base + int64_t(d.H + d.Hkv) * d.hd + int64_t(j) * d.vd;
  for (int c = threadIdx.x; c < d.hd; c += blockDim.x) sq[c] = to_f32(q[c]);
  __syncthreads();
  const float m = scores(s, sq, k, d.ld, n, d.hd, d.scale, scratch);
  T* o = out + (int64_t(r.b) * d.T + r.t) * d.ldo + int64_t(r.h) * d.vd;
  const float L = softmax_values(s, n, m, v, d.ld, d.vd, o, scratch);
  if (threadIdx.x == 0) lse[(int64_t(r.b) * d.H + r.h) * d.T + r.t] = L;
}

// D[b, h, t] = dO_t . O_t over vd: a warp per row.
template <typename T>
__global__ void rowdot_kernel(Dims d, float* __restrict__ D, const T* __restrict__ dout,
                              const T* __restrict__ out) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= int64_t(d.B) * d.H * d.T) return;  // whole warps leave together
  const Row r = row_of(row, d.H, d.T);
  const int64_t off = (int64_t(r.b) * d.T + r.t) * d.ldo + int64_t(r.h) * d.vd;
  float acc = 0.f;
  for (int e = lane; e < d.vd; e += 32) acc = fmaf(to_f32(dout[off + e]), to_f32(out[off + e]), acc);
  acc = warp_sum(acc);
  if (lane == 0) D[row] = acc;
}

template <typename T>
__device__ __forceinline__ void put(T* p, float v, bool acc) {
  *p = from_f32<T>(acc ? to_f32(*p) + v : v);
}

// dQ: block per (b, h, query t). P_i = exp(s_i - lse), dP_i = dO_t . v_i,
// dS_i = P_i (dP_i - D_t), dq = scale sum_i dS_i k_i.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(Dims d, bool accumulate, T* __restrict__ dqkv, const T* __restrict__ dout,
              const T* __restrict__ qkv, const float* __restrict__ lse, const float* __restrict__ D) {
  extern __shared__ float sm[];
  float* sq = sm;             // [hd]
  float* sdo = sq + d.hd;     // [vd]
  float* s = sdo + d.vd;      // [t + 1]
  __shared__ float scratch[32];
  const Row r = row_of(blockIdx.x, d.H, d.T);
  const int j = r.h / d.group, n = r.t + 1;
  const int64_t srow = (int64_t(r.b) * d.H + r.h) * d.T + r.t;
  const T* base = qkv + int64_t(r.b) * d.T * d.ld;
  const T* q = base + int64_t(r.t) * d.ld + int64_t(r.h) * d.hd;
  const T* k = base + int64_t(d.H) * d.hd + int64_t(j) * d.hd;
  const T* v = base + int64_t(d.H + d.Hkv) * d.hd + int64_t(j) * d.vd;
  const T* dor = dout + (int64_t(r.b) * d.T + r.t) * d.ldo + int64_t(r.h) * d.vd;
  for (int c = threadIdx.x; c < d.hd; c += blockDim.x) sq[c] = to_f32(q[c]);
  for (int e = threadIdx.x; e < d.vd; e += blockDim.x) sdo[e] = to_f32(dor[e]);
  __syncthreads();
  scores(s, sq, k, d.ld, n, d.hd, d.scale, scratch);
  const float L = lse[srow], Dt = D[srow];
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const T* vr = v + int64_t(i) * d.ld;
    float dp = 0.f;
    for (int e = 0; e < d.vd; ++e) dp = fmaf(sdo[e], to_f32(vr[e]), dp);
    const float p = expf(s[i] - L);
    s[i] = p * (dp - Dt);  // dS
  }
  __syncthreads();
  T* dq = dqkv + (int64_t(r.b) * d.T + r.t) * d.ld + int64_t(r.h) * d.hd;
  for (int c = threadIdx.x; c < d.hd; c += blockDim.x) {
    float acc = 0.f;
    for (int i = 0; i < n; ++i) acc = fmaf(s[i], to_f32(k[int64_t(i) * d.ld + c]), acc);
    put(dq + c, d.scale * acc, accumulate);
  }
}

// dK, dV: block per (b, KV head j, key row u). Over the group's query heads
// in order and the queries t >= u: dv += P_t dO_t, dk += scale dS_t q_t.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(Dims d, bool accumulate, T* __restrict__ dqkv, const T* __restrict__ dout,
                const T* __restrict__ qkv, const float* __restrict__ lse, const float* __restrict__ D) {
  extern __shared__ float sm[];
  float* sk = sm;            // [hd]
  float* sv = sk + d.hd;     // [vd]
  float* p = sv + d.vd;      // [T - u]
  float* ds = p + d.T;       // [T - u]
  const Row r = row_of(blockIdx.x, d.Hkv, d.T);  // (b, j, u)
  const int j = r.h, u = r.t, n = d.T - u;
  const T* base = qkv + int64_t(r.b) * d.T * d.ld;
  const T* kr = base + int64_t(u) * d.ld + int64_t(d.H) * d.hd + int64_t(j) * d.hd;
  const T* vr = base + int64_t(u) * d.ld + int64_t(d.H + d.Hkv) * d.hd + int64_t(j) * d.vd;
  for (int c = threadIdx.x; c < d.hd; c += blockDim.x) sk[c] = to_f32(kr[c]);
  for (int e = threadIdx.x; e < d.vd; e += blockDim.x) sv[e] = to_f32(vr[e]);
  // A thread's output columns: dk's c = tid, tid + 128 (hd <= 256), dv's likewise.
  float dk[2] = {0.f, 0.f}, dv[2] = {0.f, 0.f};
  for (int h = j * d.group; h < (j + 1) * d.group; ++h) {
    __syncthreads();  // sk / sv loaded; the previous head's p / ds read
    const int64_t srow0 = (int64_t(r.b) * d.H + h) * d.T;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int t = u + i;
      const T* q = base + int64_t(t) * d.ld + int64_t(h) * d.hd;
      const T* dor = dout + (int64_t(r.b) * d.T + t) * d.ldo + int64_t(h) * d.vd;
      float s = 0.f, dp = 0.f;
      for (int c = 0; c < d.hd; ++c) s = fmaf(to_f32(q[c]), sk[c], s);
      for (int e = 0; e < d.vd; ++e) dp = fmaf(to_f32(dor[e]), sv[e], dp);
      const float pr = expf(s * d.scale - lse[srow0 + t]);
      p[i] = pr;
      ds[i] = pr * (dp - D[srow0 + t]);
    }
    __syncthreads();
    for (int w = 0; w < 2; ++w) {
      const int c = threadIdx.x + w * kThreads;
      for (int i = 0; i < n; ++i) {
        const int64_t t = u + i;
        if (c < d.hd) dk[w] = fmaf(ds[i], to_f32(base[t * d.ld + int64_t(h) * d.hd + c]), dk[w]);
        if (c < d.vd) dv[w] = fmaf(p[i], to_f32(dout[(int64_t(r.b) * d.T + t) * d.ldo + int64_t(h) * d.vd + c]), dv[w]);
      }
    }
  }
  T* dbase = dqkv + (int64_t(r.b) * d.T + u) * d.ld;
  for (int w = 0; w < 2; ++w) {
    const int c = threadIdx.x + w * kThreads;
    if (c < d.hd) put(dbase + int64_t(d.H) * d.hd + int64_t(j) * d.hd + c, d.scale * dk[w], accumulate);
    if (c < d.vd) put(dbase + int64_t(d.H + d.Hkv) * d.hd + int64_t(j) * d.vd + c, dv[w], accumulate);
  }
}

// Decoding: block per (b, h); the query sees cache rows 0 .. len-1.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(Dims d, int64_t Tmax, int len, T* __restrict__ out, const T* __restrict__ q,
                  const T* __restrict__ kc, const T* __restrict__ vc) {
  extern __shared__ float sm[];
  float* sq = sm;
  float* s = sm + d.hd;
  __shared__ float scratch[32];
  const int b = blockIdx.x / d.H, h = blockIdx.x % d.H, j = h / d.group;
  const T* qr = q + int64_t(b) * d.H * d.hd + int64_t(h) * d.hd;
  const T* k = kc + int64_t(b) * Tmax * d.Hkv * d.hd + int64_t(j) * d.hd;
  const T* v = vc + int64_t(b) * Tmax * d.Hkv * d.vd + int64_t(j) * d.vd;
  for (int c = threadIdx.x; c < d.hd; c += blockDim.x) sq[c] = to_f32(qr[c]);
  __syncthreads();
  const float m = scores(s, sq, k, int64_t(d.Hkv) * d.hd, len, d.hd, d.scale, scratch);
  T* o = out + int64_t(b) * d.H * d.vd + int64_t(h) * d.vd;
  softmax_values(s, len, m, v, int64_t(d.Hkv) * d.vd, d.vd, o, scratch);
}

void check_dims(const Dims& d, int64_t keys, const char* op) {
  if (d.hd > 256 || d.vd > 256)
    fail(op, ": head dims ", d.hd, " (keys) and ", d.vd, " (values) beyond 256, which the CUDA "
         "kernels for values of their own width take");
  if (keys > kMaxKeys)
    fail(op, ": ", keys, " keys; the CUDA kernels for values of their own width keep a row's "
         "scores in shared memory, at most ", kMaxKeys);
}

}  // namespace

void attention_forward_values(Tensor& out, Tensor& lse, const Tensor& qkv, const AttnShape& s) {
  const char* op = "attention_forward (values of their own width)";
  if (s.B == 0 || s.T == 0) return;
  const Dims d = dims_of(s);
  check_dims(d, s.T, op);
  const size_t smem = sizeof(float) * (size_t(d.hd) + size_t(d.T));
  dispatch_float(qkv, op, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = forward_kernel<T>;
    allow_smem(kernel, smem);
    kernel<<<static_cast<unsigned>(int64_t(d.B) * d.H * d.T), kThreads, smem, stream()>>>(
        d, dptr<T>(out), dptr<float>(lse), dptr<T>(qkv));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void attention_backward_values(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                               const Tensor& out, const Tensor& lse, const AttnShape& s,
                               Store store) {
  const char* op = "attention_backward (values of their own width)";
  if (s.B == 0 || s.T == 0) return;
  const Dims d = dims_of(s);
  check_dims(d, s.T, op);
  const bool acc = store == Store::Add;
  const int64_t rows = int64_t(d.B) * d.H * d.T;
  Tensor D = Tensor::empty({rows}, DType::F32, Device::CUDA);
  dispatch_float(qkv, op, [&](auto tag) {
    using T = decltype(tag);
    rowdot_kernel<T><<<static_cast<unsigned>(ceil_div(rows * 32, 256)), 256, 0, stream()>>>(
        d, dptr<float>(D), dptr<T>(dout), dptr<T>(out));
    ATTNRES_CUDA_CHECK_LAUNCH();
    const size_t smem_q = sizeof(float) * (size_t(d.hd) + size_t(d.vd) + size_t(d.T));
    auto dq = dq_kernel<T>;
    allow_smem(dq, smem_q);
    dq<<<static_cast<unsigned>(rows), kThreads, smem_q, stream()>>>(
        d, acc, dptr<T>(dqkv), dptr<T>(dout), dptr<T>(qkv), dptr<float>(lse), dptr<float>(D));
    ATTNRES_CUDA_CHECK_LAUNCH();
    const size_t smem_k = sizeof(float) * (size_t(d.hd) + size_t(d.vd) + 2 * size_t(d.T));
    auto dkdv = dkdv_kernel<T>;
    allow_smem(dkdv, smem_k);
    dkdv<<<static_cast<unsigned>(int64_t(d.B) * d.Hkv * d.T), kThreads, smem_k, stream()>>>(
        d, acc, dptr<T>(dqkv), dptr<T>(dout), dptr<T>(qkv), dptr<float>(lse), dptr<float>(D));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void attention_decode_values(Tensor& out, const Tensor& q, const Tensor& k_cache,
                             const Tensor& v_cache, int64_t len, const AttnShape& s) {
  const char* op = "attention_decode (values of their own width)";
  if (s.B == 0) return;
  AttnShape s1 = s;
  s1.T = 1;
  const Dims d = dims_of(s1);
  check_dims(d, len, op);
  if (len > INT_MAX) fail(op, ": len=", len, " is too large for the CUDA kernel");
  const size_t smem = sizeof(float) * (size_t(d.hd) + size_t(len));
  dispatch_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = decode_kernel<T>;
    allow_smem(kernel, smem);
    kernel<<<static_cast<unsigned>(int64_t(d.B) * d.H), kThreads, smem, stream()>>>(
        d, k_cache.dim(1), static_cast<int>(len), dptr<T>(out), dptr<T>(q), dptr<T>(k_cache),
        dptr<T>(v_cache));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attnres::kernels::cuda
