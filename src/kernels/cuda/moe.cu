// CUDA mixture-of-experts routing and permutation (see kernels/moe.h).
//
// The choice is the CPU's: one thread per token runs math::MoeScores and
// math::moe_top_k (the same functions the CPU routing calls), so the two
// backends choose alike up to expf against exp in the scores. The capacity
// and the permutation are decided on the host (kernels/moe.cpp): the expert
// GEMMs need the counts there anyway, and one pass in token order is the
// drop rule. What is left here is data movement: gathering token rows by
// expert, adding them back, and the weighted combine, each output element
// written by one thread in a fixed order (deterministic), sums in fp32.
#include "kernels/cuda/moe.h"

#include <cstdint>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

// A thread keeps its token's K chosen experts in registers.
constexpr int kMaxTopK = 32;

void check_top_k(const char* op, int64_t K) {
  if (K > kMaxTopK)
    fail(op, ": top_k ", K, " on CUDA: at most ", kMaxTopK, " experts per token");
}

// The statistics (logits, gate weights, their gradients) are F32 on CUDA.
float* stat_ptr(const char* op, const Tensor& t) {
  if (t.dtype() != DType::F32)
    fail(op, ": the CUDA routing takes F32 logits and gate weights, got ", dtype_name(t.dtype()));
  return dptr<float>(t);
}

__global__ void choose_kernel(int32_t* expert, float* gate, const float* logits,
                              const float* bias, int64_t N, int64_t E, int K, bool sigmoid_router,
                              float scale) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  int idx[kMaxTopK];
  float chosen[kMaxTopK], key[kMaxTopK];
  const math::MoeScores<float> score(logits + t * E, E, sigmoid_router);
  math::moe_top_k(score, bias, E, K, idx, chosen, key);
  math::moe_gates(chosen, K, scale, gate + t * K);
  for (int j = 0; j < K; ++j) expert[t * K + j] = idx[j];
}

__global__ void zero_dropped_kernel(float* gate, const int32_t* row, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    if (row[i] < 0) gate[i] = 0.f;
}

__global__ void route_backward_kernel(float* dlogits, const float* dgate, const float* logits,
                                      const int32_t* expert, int64_t N, int64_t E, int K,
                                      bool sigmoid_router, float scale) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const math::MoeScores<float> score(logits + t * E, E, sigmoid_router);
  float s[kMaxTopK], dr[kMaxTopK];
  for (int j = 0; j < K; ++j) s[j] = score(expert[t * K + j]);
  math::moe_gate_backward(s, dgate + t * K, K, scale, sigmoid_router, dr);
  float* d = dlogits + t * E;
  for (int64_t e = 0; e < E; ++e) d[e] = 0.f;  // nothing reaches an unchosen logit
  for (int j = 0; j < K; ++j) d[expert[t * K + j]] = dr[j];
}

// Token t's part of sum_e f_e P_e before the division by N N K: sum_e
// load_e n_te, in double as the CPU (n = s / sum(s) for sigmoid scores).
__global__ void balance_kernel(double* out, const float* logits, const double* load, int64_t N,
                               int64_t E, bool sigmoid_router) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const math::MoeScores<float> score(logits + t * E, E, sigmoid_router);
  double norm = 0, row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float s = score(e);
    norm += s;
    row += load[e] * s;
  }
  out[t] = row / (sigmoid_router ? norm : 1.0);
}

// dlogits += d(balance)/dlogits for a_e = dscale f_e / N (kernels/cpu/moe.cpp).
__global__ void balance_backward_kernel(float* dlogits, const float* logits, const float* a,
                                        int64_t N, int64_t E, bool sigmoid_router) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const math::MoeScores<float> score(logits + t * E, E, sigmoid_router);
  float sum = 1.f;
  if (sigmoid_router) {
    sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += score(e);
  }
  float c = 0.f;
  for (int64_t e = 0; e < E; ++e) c += a[e] * score(e) / sum;
  float* d = dlogits + t * E;
  for (int64_t e = 0; e < E; ++e) {
    const float s = score(e);
    d[e] += sigmoid_router ? (a[e] - c) / sum * s * (1.f - s) : s * (a[e] - c);
  }
}

// x[m, c] = u[token[m], c].
template <typename T>
__global__ void permute_kernel(T* x, const T* u, const int32_t* token, int64_t M, int64_t d) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * d;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = u[int64_t(token[i / d]) * d + i % d];
}

// du[t, c] += sum over t's kept slots, in slot order, of dx[row, c] (fp32, rounded once).
template <typename T>
__global__ void unpermute_add_kernel(T* du, const T* dx, const int32_t* row, int64_t N, int K,
                                     int64_t d) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * d;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, c = i % d;
    float acc = to_f32(du[i]);
    for (int j = 0; j < K; ++j) {
      const int32_t r = row[t * K + j];
      if (r >= 0) acc += to_f32(dx[int64_t(r) * d + c]);
    }
    du[i] = from_f32<T>(acc);
  }
}

// out[t, c] = base[t, c] + sum over t's kept slots, in slot order, of g y[row, c].
template <typename T>
__global__ void combine_kernel(T* out, const T* y, const float* gate, const int32_t* row,
                               const T* base, int64_t N, int K, int64_t d) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * d;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, c = i % d;
    float acc = base ? to_f32(base[i]) : 0.f;  // base may be out itself: read first
    for (int j = 0; j < K; ++j) {
      const int32_t r = row[t * K + j];
      if (r >= 0) acc += gate[t * K + j] * to_f32(y[int64_t(r) * d + c]);
    }
    out[i] = from_f32<T>(acc);
  }
}

// One warp per slot (t, j): dy[row] = g dout[t]; dgate = dout[t] . y[row]
// (0 when dropped), its lanes' partial sums added in a fixed tree.
template <typename T>
__global__ void combine_backward_kernel(T* dy, float* dgate, const T* dout, const T* y,
                                        const float* gate, const int32_t* row, int64_t slots,
                                        int K, int64_t d) {
  const int64_t slot = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (slot >= slots) return;
  const int32_t r = row[slot];
  if (r < 0) {
    if (lane == 0) dgate[slot] = 0.f;
    return;
  }
  const T* g = dout + (slot / K) * d;
  const T* yr = y + int64_t(r) * d;
  T* dyr = dy + int64_t(r) * d;
  const float w = gate[slot];
  float dot = 0.f;
  for (int64_t c = lane; c < d; c += 32) {
    const float gc = to_f32(g[c]);
    dot += gc * to_f32(yr[c]);
    dyr[c] = from_f32<T>(w * gc);
  }
  dot = warp_sum(dot);
  if (lane == 0) dgate[slot] = dot;
}

constexpr int kThreads = 256;
int blocks_for(int64_t n) { return static_cast<int>(std::max<int64_t>(1, ceil_div(n, kThreads))); }

}  // namespace

void moe_choose(Tensor& expert, Tensor& gate, const Tensor& logits, const Tensor* bias,
                const MoeRouteOptions& opt) {
  const char* op = "moe_route";
  check_top_k(op, opt.top_k);
  const int64_t N = logits.dim(0), E = logits.dim(1);
  if (N == 0) return;
  choose_kernel<<<blocks_for(N), kThreads, 0, stream()>>>(
      dptr<int32_t>(expert), stat_ptr(op, gate), stat_ptr(op, logits),
      bias ? stat_ptr(op, *bias) : nullptr, N, E, static_cast<int>(opt.top_k),
      opt.router == MoeRouter::Sigmoid, static_cast<float>(opt.scale));
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void moe_zero_dropped(Tensor& gate, const Tensor& row) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  zero_dropped_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      stat_ptr("moe_route", gate), dptr<int32_t>(row), n);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void moe_route_backward(Tensor& dlogits, const Tensor& dgate, const Tensor& logits,
                        const MoeRouting& r, const MoeRouteOptions& opt) {
  const char* op = "moe_route_backward";
  check_top_k(op, r.K);
  if (r.N == 0) return;
  route_backward_kernel<<<blocks_for(r.N), kThreads, 0, stream()>>>(
      stat_ptr(op, dlogits), stat_ptr(op, dgate), stat_ptr(op, logits),
      dptr<int32_t>(r.expert), r.N, r.E, static_cast<int>(r.K), opt.router == MoeRouter::Sigmoid,
      static_cast<float>(opt.scale));
  ATTNRES_CUDA_CHECK_LAUNCH();
}

double moe_balance(const Tensor& logits, const MoeRouting& r, MoeRouter router) {
  const char* op = "moe_balance";
  if (r.N == 0) return 0;
  std::vector<double> load(r.load.begin(), r.load.end());
  const Tensor load_dev = Tensor::from_vector(load, {r.E}).to(Device::CUDA);
  Tensor rows = Tensor::empty({r.N}, DType::F64, Device::CUDA);
  balance_kernel<<<blocks_for(r.N), kThreads, 0, stream()>>>(
      dptr<double>(rows), stat_ptr(op, logits), dptr<double>(load_dev), r.N, r.E,
      router == MoeRouter::Sigmoid);
  ATTNRES_CUDA_CHECK_LAUNCH();
  // The tokens' parts added on the host in token order, as the CPU adds them.
  const Tensor host = rows.to(Device::CPU);
  double total = 0;
  for (int64_t t = 0; t < r.N; ++t) total += host.data<double>()[t];
  return total / (static_cast<double>(r.N) * static_cast<double>(r.N * r.K));
}

void moe_balance_backward(Tensor& dlogits, const Tensor& logits, const MoeRouting& r,
                          MoeRouter router, double dscale) {
  const char* op = "moe_balance_backward";
  if (r.N == 0) return;
  std::vector<float> a(static_cast<size_t>(r.E));
  for (int64_t e = 0; e < r.E; ++e)  // as the CPU computes them
    a[e] = static_cast<float>(dscale * static_cast<double>(r.load[e]) /
                              (static_cast<double>(r.N * r.K) * static_cast<double>(r.N)));
  const Tensor a_dev = Tensor::from_vector(a, {r.E}).to(Device::CUDA);
  balance_backward_kernel<<<blocks_for(r.N), kThreads, 0, stream()>>>(
      stat_ptr(op, dlogits), stat_ptr(op, logits), dptr<float>(a_dev), r.N, r.E,
      router == MoeRouter::Sigmoid);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void moe_permute(Tensor& x, const Tensor& u, const MoeRouting& r) {
  const int64_t M = r.rows(), d = u.dim(1);
  if (M * d == 0) return;
  dispatch_float(u, "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    permute_kernel<T><<<grid_for(M * d, kThreads), kThreads, 0, stream()>>>(
        dptr<T>(x), dptr<T>(u), dptr<int32_t>(r.token), M, d);
  });
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_add(Tensor& du, const Tensor& dx, const MoeRouting& r) {
  const int64_t d = dx.dim(1);
  if (r.N * d == 0) return;
  dispatch_float(dx, "moe_unpermute_add", [&](auto tag) {
    using T = decltype(tag);
    unpermute_add_kernel<T><<<grid_for(r.N * d, kThreads), kThreads, 0, stream()>>>(
        dptr<T>(du), dptr<T>(dx), dptr<int32_t>(r.row), r.N, static_cast<int>(r.K), d);
  });
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void moe_combine(Tensor& out, const Tensor& y, const MoeRouting& r, const Tensor* base) {
  const char* op = "moe_combine";
  const int64_t d = y.dim(1);
  if (r.N * d == 0) return;
  dispatch_float(y, op, [&](auto tag) {
    using T = decltype(tag);
    combine_kernel<T><<<grid_for(r.N * d, kThreads), kThreads, 0, stream()>>>(
        dptr<T>(out), dptr<T>(y), stat_ptr(op, r.gate), dptr<int32_t>(r.row),
        dptr_or_null<T>(base), r.N, static_cast<int>(r.K), d);
  });
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void moe_combine_backward(Tensor& dy, Tensor& dgate, const Tensor& dout, const Tensor& y,
                          const MoeRouting& r) {
  const char* op = "moe_combine_backward";
  const int64_t d = y.dim(1), slots = r.N * r.K;
  if (slots == 0) return;
  dispatch_float(y, op, [&](auto tag) {
    using T = decltype(tag);
    combine_backward_kernel<T><<<blocks_for(slots * 32), kThreads, 0, stream()>>>(
        dptr<T>(dy), stat_ptr(op, dgate), dptr<T>(dout), dptr<T>(y), stat_ptr(op, r.gate),
        dptr<int32_t>(r.row), slots, static_cast<int>(r.K), d);
  });
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::kernels::cuda
