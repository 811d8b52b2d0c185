#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/math.h"

namespace attnres::kernels::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 14;

// Token t's scores over the E experts: sigmoid(r), or softmax(r).
template <typename T>
void scores_of(T* s, const T* r, int64_t E, bool sigmoid_router) {
  const math::MoeScores<T> score(r, E, sigmoid_router);
  for (int64_t e = 0; e < E; ++e) s[e] = score(e);
}

}  // namespace

template <typename T>
void moe_choose(const T* logits, const T* bias, int64_t N, int64_t E, const MoeRouteOptions& opt,
                int32_t* expert, T* gate) {
  const int K = static_cast<int>(opt.top_k);
  const bool sig = opt.router == MoeRouter::Sigmoid;
#pragma omp parallel if (N * E >= kParallelMin)
  {
    std::vector<T> chosen(static_cast<size_t>(K)), key(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const math::MoeScores<T> score(logits + t * E, E, sig);
      math::moe_top_k(score, bias, E, K, expert + t * K, chosen.data(), key.data());
      math::moe_gates(chosen.data(), K, static_cast<T>(opt.scale), gate + t * K);
    }
  }
}

template <typename T>
void moe_route_backward(T* dlogits, const T* dgate, const T* logits, const int32_t* expert,
                        int64_t N, int64_t E, const MoeRouteOptions& opt) {
  const int64_t K = opt.top_k;
  const bool sig = opt.router == MoeRouter::Sigmoid;
#pragma omp parallel if (N * E >= kParallelMin)
  {
    std::vector<T> s(static_cast<size_t>(E)), chosen(static_cast<size_t>(K)),
        dr(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      scores_of(s.data(), logits + t * E, E, sig);
      for (int64_t j = 0; j < K; ++j) chosen[j] = s[expert[t * K + j]];
      math::moe_gate_backward(chosen.data(), dgate + t * K, static_cast<int>(K),
                              static_cast<T>(opt.scale), sig, dr.data());
      T* d = dlogits + t * E;
      std::fill(d, d + E, T(0));
      for (int64_t j = 0; j < K; ++j) d[expert[t * K + j]] = dr[j];
    }
  }
}

template <typename T>
double moe_balance(const T* logits, const std::vector<int64_t>& load, int64_t N, int64_t E,
                   int64_t K, bool sigmoid_router) {
  // sum_e f_e P_e = sum_t sum_e f_e n_te / N, summed in double.
  std::vector<T> s(static_cast<size_t>(E));
  double total = 0;
  for (int64_t t = 0; t < N; ++t) {
    scores_of(s.data(), logits + t * E, E, sigmoid_router);
    double norm = 1;
    if (sigmoid_router) norm = std::accumulate(s.begin(), s.end(), 0.0);
    double row = 0;
    for (int64_t e = 0; e < E; ++e) row += static_cast<double>(load[e]) * s[e];
    total += row / norm;
  }
  return total / (static_cast<double>(N) * static_cast<double>(N * K));
}

template <typename T>
void moe_balance_backward(T* dlogits, const T* logits, const std::vector<int64_t>& load, int64_t N,
                          int64_t E, int64_t K, bool sigmoid_router, double dscale) {
  // d/dn_te = a_e = dscale f_e / N; through n = s / sum(s) (sigmoid) or the
  // softmax: dr_i = (a_i - sum_e a_e n_e) times s_i (1 - s_i) / sum(s), or p_i.
  std::vector<T> a(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    a[e] = static_cast<T>(dscale * static_cast<double>(load[e]) /
                          (static_cast<double>(N * K) * static_cast<double>(N)));
#pragma omp parallel if (N * E >= kParallelMin)
  {
    std::vector<T> s(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      scores_of(s.data(), logits + t * E, E, sigmoid_router);
      T sum = T(1);
      if (sigmoid_router) sum = std::accumulate(s.begin(), s.end(), T(0));
      T c = T(0);
      for (int64_t e = 0; e < E; ++e) c += a[e] * s[e] / sum;
      T* d = dlogits + t * E;
      for (int64_t e = 0; e < E; ++e)
        d[e] += sigmoid_router ? (a[e] - c) / sum * s[e] * (T(1) - s[e]) : s[e] * (a[e] - c);
    }
  }
}

template <typename T>
void moe_permute(T* x, const T* u, const int32_t* token, int64_t M, int64_t d) {
#pragma omp parallel for schedule(static) if (M * d >= kParallelMin)
  for (int64_t m = 0; m < M; ++m) std::copy(u + token[m] * d, u + token[m] * d + d, x + m * d);
}

template <typename T>
void moe_unpermute_add(T* du, const T* dx, const int32_t* row, int64_t N, int64_t K, int64_t d) {
#pragma omp parallel for schedule(static) if (N * K * d >= kParallelMin)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = row[t * K + j];
      if (r < 0) continue;
      T* o = du + t * d;
      const T* g = dx + int64_t{r} * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) o[i] += g[i];
    }
}

template <typename T>
void moe_combine(T* out, const T* y, const T* gate, const int32_t* row, const T* base, int64_t N,
                 int64_t K, int64_t d) {
#pragma omp parallel for schedule(static) if (N * K * d >= kParallelMin)
  for (int64_t t = 0; t < N; ++t) {
    T* o = out + t * d;
    const T* b = base ? base + t * d : nullptr;
    for (int64_t i = 0; i < d; ++i) o[i] = b ? b[i] : T(0);  // b may be o itself
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = row[t * K + j];
      if (r < 0) continue;
      const T g = gate[t * K + j];
      const T* yr = y + int64_t{r} * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) o[i] += g * yr[i];
    }
  }
}

template <typename T>
void moe_combine_backward(T* dy, T* dgate, const T* dout, const T* y, const T* gate,
                          const int32_t* row, int64_t N, int64_t K, int64_t d) {
#pragma omp parallel for schedule(static) if (N * K * d >= kParallelMin)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = row[t * K + j];
      if (r < 0) {
        dgate[t * K + j] = T(0);
        continue;
      }
      const T* g = dout + t * d;
      const T* yr = y + int64_t{r} * d;
      T* dyr = dy + int64_t{r} * d;
      const T w = gate[t * K + j];
      T dot = T(0);
      for (int64_t i = 0; i < d; ++i) {
        dot += g[i] * yr[i];
        dyr[i] = w * g[i];
      }
      dgate[t * K + j] = dot;
    }
}

#define ATTNRES_MOE_INSTANTIATE(T)                                                              \
  template void moe_choose<T>(const T*, const T*, int64_t, int64_t, const MoeRouteOptions&,      \
                             int32_t*, T*);                                                     \
  template void moe_route_backward<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t, \
                                      const MoeRouteOptions&);                                  \
  template double moe_balance<T>(const T*, const std::vector<int64_t>&, int64_t, int64_t,       \
                                 int64_t, bool);                                                \
  template void moe_balance_backward<T>(T*, const T*, const std::vector<int64_t>&, int64_t,     \
                                        int64_t, int64_t, bool, double);                        \
  template void moe_permute<T>(T*, const T*, const int32_t*, int64_t, int64_t);                 \
  template void moe_unpermute_add<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);  \
  template void moe_combine<T>(T*, const T*, const T*, const int32_t*, const T*, int64_t,       \
                               int64_t, int64_t);                                               \
  template void moe_combine_backward<T>(T*, T*, const T*, const T*, const T*, const int32_t*,   \
                                        int64_t, int64_t, int64_t);
ATTNRES_MOE_INSTANTIATE(float)
ATTNRES_MOE_INSTANTIATE(double)
#undef ATTNRES_MOE_INSTANTIATE

}  // namespace attnres::kernels::cpu
