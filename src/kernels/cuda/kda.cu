// CUDA KDA core (see kernels/kda.h): the chunkwise forward and backward and
// the token-by-token recurrence, the CPU's algorithm (kernels/cpu/kda.cpp)
// step for step, written for correctness first.
//
// One thread block per (sequence, head): the chunks of a sequence depend on
// each other through the state, the heads and sequences do not. A block runs
// its chunks one after another; inside a chunk every step is a loop over the
// step's independent outputs spread over the block's threads, with a barrier
// between steps (block_gemm: one output element per thread). Values come in
// and go out as F32 or BF16; everything in between (the chunk's rows, the
// cumulative log-decays, A, P, U, the K x V states) is fp32, in a global
// work buffer carved per resident block (grid-stride over the (b, h) pairs,
// so the buffer is sized by the resident blocks, not by B H).
//
// Decays: the CPU forms every exp(Gamma_i - Gamma_j) (j <= i) as a product
// of the decays of rows j+1 .. i; here it is the exponential of the
// difference of the chunk's own cumulative sums (they restart at 0 in every
// chunk), which is <= 0 up to rounding: no exponential overflows however
// strong the gates, and exp(Gamma_i) alone may only underflow towards its
// true, tiny value. Its rounding is that of the chunk's cumulative sum,
// about 1e-7 |Gamma| in the exponent (|Gamma| <= C max |g|), which the GPU
// tests bound (tests/gpu/test_kda.cpp).
//
// Not yet fast: the chunk's GEMMs are plain block loops over global memory
// (L1/L2 resident), no tensor cores, no shared-memory tiles. The floors
// (FLOPs 4 B T H (K V + C K + C V) forward, bytes of q, k, v, g, o) and a
// tiled version wait for a GPU to measure on.
#include "kernels/cuda/kda.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace attnres::kernels::cuda {

namespace {

constexpr int kThreads = 256;

struct Dims {
  int64_t B, T, H, K, V, C;
  float scale;
  __host__ __device__ int64_t chunks() const { return ceil_div(T, C); }
};

// One resident block's fp32 work buffers (rows of a chunk: n <= C).
struct Work {
  float *q, *k, *G, *Kb, *Qb, *Ke;  // [C, K]: the rows, Gamma, exp(Gamma).K, exp(Gamma).Q, exp(Gamma_C - Gamma).K
  float *v, *R, *U;                  // [C, V]: the values, V - Kb S_0, the WY pseudo-values
  float *beta;                       // [C]
  float *A, *P;                      // [C, C]
  float *eL;                         // [K]: exp(Gamma_C)
  float *S;                          // [K, V]: the forward's running state
  // The backward's.
  float *dS, *dS0;                   // [K, V]
  float *Ob, *Ub, *Xb, *Vb;          // [C, V]
  float *Keb, *Qbb, *Kbb, *Gg;       // [C, K]
  float *Mb, *Ab, *Pb;               // [C, C]
  float *betab;                      // [C]
  float *starts;                     // [chunks, K, V]: the chunks' start states
};

// Floats of one block's work buffers (carve() lays them out in this order).
__host__ __device__ int64_t work_floats(const Dims& d, bool backward) {
  const int64_t CK = d.C * d.K, CV = d.C * d.V, CC = d.C * d.C, KV = d.K * d.V;
  int64_t n = 6 * CK + 3 * CV + d.C + 2 * CC + d.K + KV;
  if (backward) n += 2 * KV + 4 * CV + 4 * CK + 3 * CC + d.C + d.chunks() * KV;
  return n;
}

__device__ Work carve(float* base, const Dims& d, bool backward) {
  const int64_t CK = d.C * d.K, CV = d.C * d.V, CC = d.C * d.C, KV = d.K * d.V;
  Work w{};
  float* p = base;
  auto take = [&p](int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  w.q = take(CK), w.k = take(CK), w.G = take(CK), w.Kb = take(CK), w.Qb = take(CK), w.Ke = take(CK);
  w.v = take(CV), w.R = take(CV), w.U = take(CV);
  w.beta = take(d.C);
  w.A = take(CC), w.P = take(CC);
  w.eL = take(d.K);
  w.S = take(KV);
  if (backward) {
    w.dS = take(KV), w.dS0 = take(KV);
    w.Ob = take(CV), w.Ub = take(CV), w.Xb = take(CV), w.Vb = take(CV);
    w.Keb = take(CK), w.Qbb = take(CK), w.Kbb = take(CK), w.Gg = take(CK);
    w.Mb = take(CC), w.Ab = take(CC), w.Pb = take(CC);
    w.betab = take(d.C);
    w.starts = take(d.chunks() * KV);
  }
  return w;
}

// C [m x n] (row stride ldc) = alpha op(A) op(B) (+ C when acc), row-major
// as gemm_serial on the CPU: op(A)[i, p] = ta ? A[p lda + i] : A[i lda + p],
// op(B)[p, j] = tb ? B[j ldb + p] : B[p ldb + j]. Each thread one element,
// its dot product in order p = 0 .. k-1; a barrier after.
__device__ void block_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                           const float* A, int64_t lda, const float* B, int64_t ldb, bool acc,
                           float* C, int64_t ldc) {
  for (int64_t idx = threadIdx.x; idx < m * n; idx += blockDim.x) {
    const int64_t i = idx / n, j = idx % n;
    float s = 0.f;
    for (int64_t p = 0; p < k; ++p)
      s += (ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
    C[i * ldc + j] = alpha * s + (acc ? C[i * ldc + j] : 0.f);
  }
  __syncthreads();
}

template <typename T>
struct Inputs {
  const T *q, *k, *v, *g, *beta;
};

// Rows [t0, t0 + n) of sequence b, head h into the work buffers, Gamma the
// chunk's cumulative log-decay, the decayed rows, eL, A and P (P only
// with_p). Upper triangles of A and P are 0; A's diagonal too.
template <typename T>
__device__ void prepare(const Work& w, const Dims& d, const Inputs<T>& in, int64_t b, int64_t h,
                        int64_t t0, int64_t n, bool with_p) {
  const int64_t K = d.K, V = d.V, C = d.C, HK = d.H * K, HV = d.H * V;
  for (int64_t x = threadIdx.x; x < n * K; x += blockDim.x) {
    const int64_t i = x / K, c = x % K, row = b * d.T + t0 + i;
    w.q[x] = to_f32(in.q[row * HK + h * K + c]);
    w.k[x] = to_f32(in.k[row * HK + h * K + c]);
  }
  for (int64_t x = threadIdx.x; x < n * V; x += blockDim.x) {
    const int64_t i = x / V, e = x % V, row = b * d.T + t0 + i;
    w.v[x] = to_f32(in.v[row * HV + h * V + e]);
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    w.beta[i] = to_f32(in.beta[(b * d.T + t0 + i) * d.H + h]);
  for (int64_t c = threadIdx.x; c < K; c += blockDim.x) {  // Gamma: a running sum per channel
    float s = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      s += to_f32(in.g[(b * d.T + t0 + i) * HK + h * K + c]);
      w.G[i * K + c] = s;
    }
    w.eL[c] = expf(s);
  }
  __syncthreads();
  const int64_t last = n - 1;
  for (int64_t x = threadIdx.x; x < n * K; x += blockDim.x) {
    const int64_t c = x % K;
    const float eg = expf(w.G[x]);
    w.Kb[x] = eg * w.k[x];
    w.Qb[x] = eg * w.q[x];
    w.Ke[x] = expf(w.G[last * K + c] - w.G[x]) * w.k[x];
  }
  for (int64_t x = threadIdx.x; x < C * C; x += blockDim.x) {
    const int64_t i = x / C, j = x % C;
    float sa = 0.f, sp = 0.f;
    if (i < n && j <= i) {
      for (int64_t c = 0; c < K; ++c) {
        const float kj = w.k[j * K + c] * expf(w.G[i * K + c] - w.G[j * K + c]);
        sa += w.k[i * K + c] * kj;
        sp += w.q[i * K + c] * kj;
      }
    }
    w.A[x] = j < i ? sa : 0.f;
    if (with_p) w.P[x] = sp;
  }
  __syncthreads();
}

// R = V - Kb S_0, then (I + Diag(beta) A) U = Diag(beta) R by forward
// substitution: a thread per value column (its column of U depends on its
// own earlier rows only).
__device__ void solve(const Work& w, const Dims& d, int64_t n, const float* S0) {
  const int64_t V = d.V, K = d.K, C = d.C;
  for (int64_t x = threadIdx.x; x < n * V; x += blockDim.x) w.R[x] = w.v[x];
  __syncthreads();
  block_gemm(false, false, n, V, K, -1.f, w.Kb, K, S0, V, true, w.R, V);
  for (int64_t e = threadIdx.x; e < V; e += blockDim.x)
    for (int64_t i = 0; i < n; ++i) {
      const float bi = w.beta[i];
      float u = bi * w.R[i * V + e];
      for (int64_t j = 0; j < i; ++j) u -= bi * w.A[i * C + j] * w.U[j * V + e];
      w.U[i * V + e] = u;
    }
  __syncthreads();
}

// S <- Diag(eL) S + Ke^T U (in place: each element reads only itself of S).
__device__ void advance(const Work& w, const Dims& d, int64_t n, float* S) {
  const int64_t K = d.K, V = d.V;
  for (int64_t x = threadIdx.x; x < K * V; x += blockDim.x) {
    const int64_t c = x / V, e = x % V;
    float s = w.eL[c] * S[x];
    for (int64_t i = 0; i < n; ++i) s += w.Ke[i * K + c] * w.U[i * V + e];
    S[x] = s;
  }
  __syncthreads();
}

template <typename T>
__global__ void kda_forward_kernel(T* o, Inputs<T> in, Dims d, float* work) {
  const Work w = carve(work + int64_t(blockIdx.x) * work_floats(d, false), d, false);
  const int64_t K = d.K, V = d.V, C = d.C, HV = d.H * V;
  for (int64_t bh = blockIdx.x; bh < d.B * d.H; bh += gridDim.x) {
    const int64_t b = bh / d.H, h = bh % d.H;
    for (int64_t x = threadIdx.x; x < K * V; x += blockDim.x) w.S[x] = 0.f;
    __syncthreads();
    for (int64_t t0 = 0; t0 < d.T; t0 += C) {
      const int64_t n = d.T - t0 < C ? d.T - t0 : C;
      prepare(w, d, in, b, h, t0, n, true);
      solve(w, d, n, w.S);
      // O = scale (Qb S_0 + P U), before the state moves on.
      for (int64_t x = threadIdx.x; x < n * V; x += blockDim.x) {
        const int64_t i = x / V, e = x % V;
        float s = 0.f;
        for (int64_t c = 0; c < K; ++c) s += w.Qb[i * K + c] * w.S[c * V + e];
        for (int64_t j = 0; j <= i; ++j) s += w.P[i * C + j] * w.U[j * V + e];
        o[(b * d.T + t0 + i) * HV + h * V + e] = from_f32<T>(d.scale * s);
      }
      __syncthreads();
      advance(w, d, n, w.S);
    }
  }
}

template <typename T>
__device__ void put(T* p, float v, bool acc) {
  *p = from_f32<T>(acc ? to_f32(*p) + v : v);
}

template <typename T>
struct Grads {
  T *dq, *dk, *dv, *dg, *dbeta;
  const T* dout;
  bool acc;
};

template <typename T>
__global__ void kda_backward_kernel(Grads<T> gr, Inputs<T> in, Dims d, float* work) {
  const Work w = carve(work + int64_t(blockIdx.x) * work_floats(d, true), d, true);
  const int64_t K = d.K, V = d.V, C = d.C, KV = K * V, HK = d.H * K, HV = d.H * V;
  const int64_t chunks = d.chunks();
  for (int64_t bh = blockIdx.x; bh < d.B * d.H; bh += gridDim.x) {
    const int64_t b = bh / d.H, h = bh % d.H;
    // The chunks' start states, by the forward's recurrence again.
    for (int64_t x = threadIdx.x; x < KV; x += blockDim.x) w.starts[x] = 0.f;
    __syncthreads();
    for (int64_t c = 0; c + 1 < chunks; ++c) {
      const int64_t t0 = c * C, n = d.T - t0 < C ? d.T - t0 : C;
      float* S = w.starts + (c + 1) * KV;
      for (int64_t x = threadIdx.x; x < KV; x += blockDim.x) S[x] = S[x - KV];
      __syncthreads();
      prepare(w, d, in, b, h, t0, n, false);
      solve(w, d, n, S);
      advance(w, d, n, S);
    }
    float *dS = w.dS, *dS0 = w.dS0;
    for (int64_t x = threadIdx.x; x < KV; x += blockDim.x) dS[x] = 0.f;
    __syncthreads();
    for (int64_t c = chunks - 1; c >= 0; --c) {
      const int64_t t0 = c * C, n = d.T - t0 < C ? d.T - t0 : C, last = n - 1;
      const float* S0 = w.starts + c * KV;
      prepare(w, d, in, b, h, t0, n, true);
      solve(w, d, n, S0);
      for (int64_t x = threadIdx.x; x < n * K; x += blockDim.x) w.Gg[x] = 0.f;
      __syncthreads();
      // (a) S_C = Diag(eL) S_0 + Ke^T U.
      for (int64_t x = threadIdx.x; x < K; x += blockDim.x) {
        float s = 0.f;
        for (int64_t e = 0; e < V; ++e) {
          dS0[x * V + e] = w.eL[x] * dS[x * V + e];
          s += S0[x * V + e] * dS[x * V + e];
        }
        w.Gg[last * K + x] += w.eL[x] * s;
      }
      __syncthreads();
      block_gemm(false, true, n, K, V, 1.f, w.U, V, dS, V, false, w.Keb, K);
      block_gemm(false, false, n, V, K, 1.f, w.Ke, K, dS, V, false, w.Ub, V);
      // (b) O = scale (Qb S_0 + P U).
      for (int64_t x = threadIdx.x; x < n * V; x += blockDim.x) {
        const int64_t i = x / V, e = x % V;
        w.Ob[x] = d.scale * to_f32(gr.dout[(b * d.T + t0 + i) * HV + h * V + e]);
      }
      __syncthreads();
      block_gemm(false, true, n, K, V, 1.f, w.Ob, V, S0, V, false, w.Qbb, K);
      block_gemm(true, false, K, V, n, 1.f, w.Qb, K, w.Ob, V, true, dS0, V);
      block_gemm(false, true, n, n, V, 1.f, w.Ob, V, w.U, V, false, w.Pb, C);
      for (int64_t x = threadIdx.x; x < n * n; x += blockDim.x) {
        const int64_t i = x / n, j = x % n;
        if (j > i) w.Pb[i * C + j] = 0.f;  // P is lower triangular
      }
      __syncthreads();
      block_gemm(true, false, n, V, n, 1.f, w.P, C, w.Ob, V, true, w.Ub, V);
      // (c) M U = X: M^T Xb = Ub by back substitution (M_ji = beta_j A_ji,
      // j > i), a thread per value column.
      for (int64_t e = threadIdx.x; e < V; e += blockDim.x)
        for (int64_t i = n - 1; i >= 0; --i) {
          float x = w.Ub[i * V + e];
          for (int64_t j = i + 1; j < n; ++j) x -= w.beta[j] * w.A[j * C + i] * w.Xb[j * V + e];
          w.Xb[i * V + e] = x;
        }
      __syncthreads();
      // Mb = -Xb U^T (its strictly lower part is all M has).
      block_gemm(false, true, n, n, V, -1.f, w.Xb, V, w.U, V, false, w.Mb, C);
      for (int64_t x = threadIdx.x; x < C * C; x += blockDim.x) {
        const int64_t i = x / C, j = x % C;
        w.Ab[x] = i < n && j < i ? w.beta[i] * w.Mb[x] : 0.f;
      }
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float s = 0.f, r = 0.f;
        for (int64_t j = 0; j < i; ++j) s += w.Mb[i * C + j] * w.A[i * C + j];
        for (int64_t e = 0; e < V; ++e) r += w.Xb[i * V + e] * w.R[i * V + e];
        w.betab[i] = s + r;
      }
      // Rb = beta Xb is dL/dV (R = V - Kb S_0), kept in Vb.
      for (int64_t x = threadIdx.x; x < n * V; x += blockDim.x) w.Vb[x] = w.beta[x / V] * w.Xb[x];
      __syncthreads();
      block_gemm(false, true, n, K, V, -1.f, w.Vb, V, S0, V, false, w.Kbb, K);
      block_gemm(true, false, K, V, n, -1.f, w.Kb, K, w.Vb, V, true, dS0, V);
      // (d) + (e): per channel x, the pairs' sums (E_ij = exp(Gamma_i - Gamma_j))
      //   ZA_i = sum_{j<i} Ab_ij k_j E_ij, ZP_i = sum_{j<=i} Pb_ij k_j E_ij,
      //   YA_i = sum_{l>i} Ab_li k_l E_li, YP_i = sum_{l>=i} Pb_li q_l E_li,
      // then dK, dQ and dGamma of row i; a thread per channel (the rows'
      // dGamma of the last row gathers every row's Ke term, in row order).
      for (int64_t x = threadIdx.x; x < K; x += blockDim.x) {
        float te_sum = 0.f;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t p = i * K + x;
          const float Gi = w.G[p];
          float za = 0.f, zp = 0.f, ya = 0.f, yp = 0.f;
          for (int64_t j = 0; j <= i; ++j) {
            const float kj = w.k[j * K + x] * expf(Gi - w.G[j * K + x]);
            if (j < i) za += w.Ab[i * C + j] * kj;
            zp += w.Pb[i * C + j] * kj;
          }
          for (int64_t l = i; l < n; ++l) {
            const float e = expf(w.G[l * K + x] - Gi);
            if (l > i) ya += w.Ab[l * C + i] * w.k[l * K + x] * e;
            yp += w.Pb[l * C + i] * w.q[l * K + x] * e;
          }
          const float eg = expf(Gi), ee = expf(w.G[last * K + x] - Gi);
          const float kv = w.k[p], qv = w.q[p];
          const float te = ee * kv * w.Keb[p];
          const int64_t row = b * d.T + t0 + i;
          put(gr.dk + row * HK + h * K + x, eg * w.Kbb[p] + ee * w.Keb[p] + za + ya + yp, gr.acc);
          put(gr.dq + row * HK + h * K + x, eg * w.Qbb[p] + zp, gr.acc);
          w.Gg[p] += eg * kv * w.Kbb[p] + eg * qv * w.Qbb[p] - te + kv * za + qv * zp - kv * ya -
                     kv * yp;
          te_sum += te;
        }
        w.Gg[last * K + x] += te_sum;
        // (f) Gamma = cumsum(g): dg is dGamma's reverse cumulative sum.
        float s = 0.f;
        for (int64_t i = n - 1; i >= 0; --i) {
          s += w.Gg[i * K + x];
          put(gr.dg + (b * d.T + t0 + i) * HK + h * K + x, s, gr.acc);
        }
      }
      for (int64_t x = threadIdx.x; x < n * V; x += blockDim.x) {
        const int64_t i = x / V, e = x % V;
        put(gr.dv + (b * d.T + t0 + i) * HV + h * V + e, w.Vb[x], gr.acc);
      }
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        put(gr.dbeta + (b * d.T + t0 + i) * d.H + h, w.betab[i], gr.acc);
      __syncthreads();
      float* t = dS;  // the chunk before continues from this chunk's dS_0
      dS = dS0, dS0 = t;
    }
  }
}

// The token-by-token recurrence: a thread per value column e of the state
// (decay, prediction, write and output of column e read only column e).
template <typename T>
__global__ void kda_recurrent_kernel(T* o, Inputs<T> in, Dims d, float* state) {
  const int64_t K = d.K, V = d.V, HK = d.H * K, HV = d.H * V;
  for (int64_t bh = blockIdx.x; bh < d.B * d.H; bh += gridDim.x) {
    const int64_t b = bh / d.H, h = bh % d.H;
    float* S = state + bh * K * V;
    for (int64_t e = threadIdx.x; e < V; e += blockDim.x)
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t row = b * d.T + t;
        const T* q = in.q + row * HK + h * K;
        const T* k = in.k + row * HK + h * K;
        const T* g = in.g + row * HK + h * K;
        float pred = 0.f;
        for (int64_t c = 0; c < K; ++c) {
          const float s = S[c * V + e] * expf(to_f32(g[c]));
          S[c * V + e] = s;
          pred += s * to_f32(k[c]);
        }
        const float u = to_f32(in.beta[row * d.H + h]) * (to_f32(in.v[row * HV + h * V + e]) - pred);
        float out = 0.f;
        for (int64_t c = 0; c < K; ++c) {
          const float s = S[c * V + e] + to_f32(k[c]) * u;
          S[c * V + e] = s;
          out += s * to_f32(q[c]);
        }
        o[row * HV + h * V + e] = from_f32<T>(d.scale * out);
      }
  }
}

Dims dims_of(const KdaShape& s, double scale) {
  return {s.B, s.T, s.H, s.K, s.V, s.chunk, static_cast<float>(scale)};
}

// Resident blocks: every (b, h) pair its own block up to 2 per SM (the
// work buffers are per resident block).
int blocks_for(const Dims& d) {
  int device = 0, sms = 1;
  ATTNRES_CUDA_CHECK(cudaGetDevice(&device));
  ATTNRES_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return static_cast<int>(std::min<int64_t>(d.B * d.H, 2 * int64_t(sms)));
}

template <typename T>
Inputs<T> inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                 const Tensor& beta) {
  return {dptr<T>(q), dptr<T>(k), dptr<T>(v), dptr<T>(g), dptr<T>(beta)};
}

}  // namespace

void kda_forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                 const Tensor& beta, const KdaShape& s, double scale) {
  const Dims d = dims_of(s, scale);
  const int blocks = blocks_for(d);
  Tensor work = Tensor::empty({blocks * work_floats(d, false)}, DType::F32, Device::CUDA);
  dispatch_float(q, "kda_forward", [&](auto tag) {
    using T = decltype(tag);
    kda_forward_kernel<T><<<blocks, kThreads, 0, stream()>>>(dptr<T>(o), inputs<T>(q, k, v, g, beta),
                                                             d, dptr<float>(work));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void kda_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                  const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                  Store store) {
  const Dims d = dims_of(s, scale);
  const int blocks = blocks_for(d);
  Tensor work = Tensor::empty({blocks * work_floats(d, true)}, DType::F32, Device::CUDA);
  dispatch_float(q, "kda_backward", [&](auto tag) {
    using T = decltype(tag);
    const Grads<T> gr{dptr<T>(dq), dptr<T>(dk), dptr<T>(dv), dptr<T>(dg), dptr<T>(dbeta),
                      dptr<T>(dout), store == Store::Add};
    kda_backward_kernel<T><<<blocks, kThreads, 0, stream()>>>(gr, inputs<T>(q, k, v, g, beta), d,
                                                              dptr<float>(work));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void kda_recurrent_forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                           Tensor* state) {
  const Dims d = dims_of(s, scale);
  Tensor own;
  if (!state) own = Tensor::zeros({s.B, s.H, s.K, s.V}, DType::F32, Device::CUDA);
  Tensor& S = state ? *state : own;
  const int blocks = blocks_for(d);
  dispatch_float(q, "kda_recurrent_forward", [&](auto tag) {
    using T = decltype(tag);
    kda_recurrent_kernel<T><<<blocks, kThreads, 0, stream()>>>(dptr<T>(o), inputs<T>(q, k, v, g, beta),
                                                               d, dptr<float>(S));
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attnres::kernels::cuda
