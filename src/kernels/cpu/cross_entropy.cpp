// CPU LM head + softmax cross-entropy, fused and chunked over rows.
//
// The [N, V] logit matrix of a whole batch is large (V ~ 32k-128k), so rows
// are processed kChunkRows at a time: one GEMM makes the chunk's logits, a
// per-row pass turns them into the loss and, in place, into dlogits, and two
// GEMMs (beta = 1) push dlogits into dh and dw. The chunk size is a constant,
// so the order in which dw sums the chunks, and with it the result bits, never
// changes. The GEMMs spread their tiles over the OpenMP team (blas.h); the
// per-row pass is split over rows.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/cpu/blas.h"

namespace attnres::kernels::cpu {

namespace {

constexpr int64_t kChunkRows = 128;
// Below this many logits, thread start-up costs more than the row pass.
constexpr int64_t kParallelMin = 1 << 14;

}  // namespace

template <typename T>
double lm_head_cross_entropy(const T* h, const T* w, const int32_t* targets, T* dh, T* dw,
                             int64_t N, int64_t V, int64_t d, double grad_scale,
                             bool accumulate_dh) {
  if (N == 0) return 0.0;
  const bool grads = dh || dw;
  const T gs = static_cast<T>(grad_scale);
  const int64_t chunk = std::min(N, kChunkRows);
  // Uninitialised on purpose: the GEMM overwrites it (beta = 0).
  std::unique_ptr<T[]> logits(new T[static_cast<size_t>(chunk * V)]);
  // Per-row losses, summed in row order at the end (deterministic).
  std::vector<double> row_loss(static_cast<size_t>(N));

  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    const T* hc = h + r0 * d;
    T* L = logits.get();
    // logits[rows, V] = h_chunk W^T
    if (d > 0) gemm(false, true, rows, V, d, T(1), hc, d, w, d, T(0), L, V);
    else std::fill(L, L + rows * V, T(0));

#pragma omp parallel for schedule(static) if (rows * V >= kParallelMin)
    for (int64_t i = 0; i < rows; ++i) {
      T* l = L + i * V;
      const int32_t t = targets[r0 + i];
      const T target_logit = l[t];  // read before the row is overwritten
      T m = l[0];
#pragma omp simd reduction(max : m)
      for (int64_t c = 0; c < V; ++c) m = std::max(m, l[c]);
      // The exp sum is kept in double: V terms, where fp32 would lose digits.
      double sum = 0;
      if (grads) {
        for (int64_t c = 0; c < V; ++c) {
          const T e = std::exp(l[c] - m);
          sum += e;
          l[c] = e;  // unnormalised probabilities, turned into dlogits below
        }
      } else {
        for (int64_t c = 0; c < V; ++c) sum += std::exp(l[c] - m);
      }
      // -log softmax_t = logsumexp - logit_t = m + log(sum) - logit_t.
      row_loss[r0 + i] = static_cast<double>(m) + std::log(sum) - static_cast<double>(target_logit);
      if (grads) {
        // dlogits = grad_scale * (softmax - onehot), in place.
        const T scale = static_cast<T>(grad_scale / sum);
#pragma omp simd
        for (int64_t c = 0; c < V; ++c) l[c] *= scale;
        l[t] -= gs;
      }
    }

    if (dh && d > 0)  // dh (+)= dL W: the chunks own disjoint rows of dh
      gemm(false, false, rows, d, V, T(1), L, V, w, d, accumulate_dh ? T(1) : T(0), dh + r0 * d,
           d);
    if (dw && d > 0) gemm(true, false, V, d, rows, T(1), L, V, hc, d, T(1), dw, d);  // dw += dL^T h
  }

  double total = 0;
  for (int64_t n = 0; n < N; ++n) total += row_loss[n];
  return total;
}

template double lm_head_cross_entropy<float>(const float*, const float*, const int32_t*, float*,
                                             float*, int64_t, int64_t, int64_t, double, bool);
template double lm_head_cross_entropy<double>(const double*, const double*, const int32_t*,
                                              double*, double*, int64_t, int64_t, int64_t, double,
                                              bool);

}  // namespace attnres::kernels::cpu
