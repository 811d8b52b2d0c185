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
  if (sigmoid_router) {
    for (int64_t e = 0; e < E; ++e) s[e] = math::sigmoid(r[e]);
    return;
  }
  T m = r[0], sum = T(0);
  for (int64_t e = 1; e < E; ++e) m = std::max(m, r[e]);
  for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(r[e] - m));
  for (int64_t e = 0; e < E; ++e) s[e] /= sum;
}

}  // namespace

template <typename T>
void moe_route(const T* logits, const T* bias, int64_t N, int64_t E, const MoeRouteOptions& opt,
               int32_t* expert, T* gate, int32_t* row, std::vector<int32_t>& token,
               std::vector<int64_t>& offsets, std::vector<int64_t>& load, int64_t& dropped) {
  const int64_t K = opt.top_k;
  const bool sig = opt.router == MoeRouter::Sigmoid;
  // The choice and the gate weights: each token on its own.
#pragma omp parallel if (N * E >= kParallelMin)
  {
    std::vector<T> s(static_cast<size_t>(E)), key(static_cast<size_t>(E));
    std::vector<int32_t> idx(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      scores_of(s.data(), logits + t * E, E, sig);
      for (int64_t e = 0; e < E; ++e) key[e] = s[e] + (bias ? bias[e] : T(0));
      std::iota(idx.begin(), idx.end(), 0);
      // The K largest keys, ties to the lower index; then in ascending index.
      std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int32_t a, int32_t b) {
        return key[a] > key[b] || (key[a] == key[b] && a < b);
      });
      std::sort(idx.begin(), idx.begin() + K);
      T sum = T(0);
      for (int64_t j = 0; j < K; ++j) sum += s[idx[j]];
      for (int64_t j = 0; j < K; ++j) {
        expert[t * K + j] = idx[j];
        gate[t * K + j] = static_cast<T>(opt.scale) * s[idx[j]] / sum;
      }
    }
  }
  // Capacity and the permutation, in token order: who is dropped depends on
  // the order, so one pass over the slots decides it.
  load.assign(static_cast<size_t>(E), 0);
  std::vector<int64_t> kept(static_cast<size_t>(E), 0);
  dropped = 0;
  for (int64_t i = 0; i < N * K; ++i) {
    const int32_t e = expert[i];
    ++load[e];
    if (opt.capacity > 0 && kept[e] >= opt.capacity) {
      row[i] = -1;
      gate[i] = T(0);
      ++dropped;
    } else {
      row[i] = static_cast<int32_t>(kept[e]++);  // its index within e, for now
    }
  }
  offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + kept[e];
  token.assign(static_cast<size_t>(offsets[E]), 0);
  for (int64_t i = 0; i < N * K; ++i) {
    if (row[i] < 0) continue;
    row[i] = static_cast<int32_t>(offsets[expert[i]] + row[i]);
    token[row[i]] = static_cast<int32_t>(i / K);
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
  template void moe_route<T>(const T*, const T*, int64_t, int64_t, const MoeRouteOptions&,      \
                             int32_t*, T*, int32_t*, std::vector<int32_t>&,                     \
                             std::vector<int64_t>&, std::vector<int64_t>&, int64_t&);           \
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
