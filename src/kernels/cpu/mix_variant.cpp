// CPU depth Mix of the residual variants: rows are independent except for a
// shared query's (or the scalars') gradient, which is reduced through
// per-chunk partials over fixed row ranges (bits independent of the thread
// count), as in cpu/mix.cpp.
#include "kernels/cpu/mix_variant.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/mix_common.h"
#include "kernels/cpu/reduce.h"
#include "kernels/math.h"

namespace attnres::kernels::cpu {

using mix::dot;
using mix::kParallelMin;
using mix::kRowChunk;

namespace {

// The query of row n, head h (none for Scalars and Weights).
template <typename T>
const T* query_of(const T* query, const MixForm& f, int64_t n, int64_t h, int64_t d, int64_t dh) {
  if (f.logits == MixLogits::Scalars || f.logits == MixLogits::Weights) return nullptr;
  return query + (f.logits == MixLogits::RowQueries ? n * d : 0) + h * dh;
}

// The key's rstd of source row v (dh channels): 1 without the key norm.
template <typename T>
T key_rstd(const T* v, int64_t dh, const MixForm& f, T eps) {
  return f.key_norm ? math::rstd_from_sum_sq(dot(v, v, dh), dh, eps) : T(1);
}
}  // namespace

template <typename T>
void mix_variant_forward(T* out, T* weights, const T* query, const T* const* sources, int64_t N,
                         int64_t d, int64_t k, const MixForm& f, T eps) {
  const int64_t H = f.heads, dh = d / H;
#pragma omp parallel for schedule(static) if (N * d * k >= kParallelMin)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      T* a = weights + (n * H + h) * k;
      const T* q = query_of(query, f, n, h, d, dh);
      T m = -INFINITY;
      for (int64_t j = 0; j < k; ++j) {
        const T* v = sources[j] + n * d + h * dh;
        a[j] = q ? dot(q, v, dh) * key_rstd(v, dh, f, eps) : query[j];
        m = std::max(m, a[j]);
      }
      if (f.logits == MixLogits::Weights) {
        // the weights as they are
      } else if (f.score == MixScore::Sigmoid) {
        for (int64_t j = 0; j < k; ++j) a[j] = math::sigmoid(a[j]);
      } else {  // max subtracted: k == 1 gives a_0 = 1 exactly
        T l = 0;
        for (int64_t j = 0; j < k; ++j) l += (a[j] = std::exp(a[j] - m));
        const T inv = T(1) / l;
        for (int64_t j = 0; j < k; ++j) a[j] *= inv;
      }
      T* o = out + n * d + h * dh;
      std::fill(o, o + dh, T(0));
      for (int64_t j = 0; j < k; ++j) {
        const T* v = sources[j] + n * d + h * dh;
        const T aj = a[j];
#pragma omp simd
        for (int64_t c = 0; c < dh; ++c) o[c] += aj * v[c];
      }
    }
}

// Per row and head, with g = dout_h, a_j the weights:
//   da_j     = g . v_j
//   dlogit_j = a_j (da_j - sum_i a_i da_i)     softmax
//            = a_j (1 - a_j) da_j              sigmoid
//            = da_j                        Weights (no score)
//   Scalars, Weights: ds_j += dlogit_j;  dv_j += a_j g
//   else, with r_j the key's rstd (1 without the norm), qv = q . v_j:
//            dv_j += a_j g + dlogit_j r_j q - dlogit_j r_j^3 qv / dh v_j
//                    (the last term only with the key norm: dr/dv = -r^3 v / dh)
//            dq   += dlogit_j r_j v_j
template <typename T>
void mix_variant_backward(T* const* dsources, T* dquery, const T* dout, const T* query,
                          const T* const* sources, const T* weights, int64_t N, int64_t d,
                          int64_t k, const MixForm& f, T eps) {
  const int64_t H = f.heads, dh = d / H;
  // A shared query's and the scalars' gradients sum over rows: per-chunk
  // partials in double, combined in chunk order.
  const bool shared = f.logits != MixLogits::RowQueries;
  const int64_t width = f.logits == MixLogits::Scalars || f.logits == MixLogits::Weights ? k : d;
  const int64_t n_chunks = (N + kRowChunk - 1) / kRowChunk;
  std::vector<double> partial(shared ? static_cast<size_t>(n_chunks * width) : 0, 0.0);
#pragma omp parallel if (N * d * k >= kParallelMin)
  {
    std::vector<T> da(static_cast<size_t>(k)), qv(static_cast<size_t>(k)), r(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      double* pc = shared ? partial.data() + ch * width : nullptr;
      for (int64_t n = ch * kRowChunk; n < std::min(N, (ch + 1) * kRowChunk); ++n)
        for (int64_t h = 0; h < H; ++h) {
          const T* a = weights + (n * H + h) * k;
          const T* g = dout + n * d + h * dh;
          const T* q = query_of(query, f, n, h, d, dh);
          // Every read of this row's sources before any write to dsources
          // (which may alias each other).
          T s = 0;
          for (int64_t j = 0; j < k; ++j) {
            const T* v = sources[j] + n * d + h * dh;
            da[j] = dot(g, v, dh);
            if (q) {
              qv[j] = dot(q, v, dh);
              r[j] = key_rstd(v, dh, f, eps);
            }
            s += a[j] * da[j];
          }
          for (int64_t j = 0; j < k; ++j) {
            const T aj = a[j];
            const T dz = f.logits == MixLogits::Weights   ? da[j]
                         : f.score == MixScore::Sigmoid ? aj * (T(1) - aj) * da[j]
                                                        : aj * (da[j] - s);
            const T* v = sources[j] + n * d + h * dh;
            T* dv = dsources[j] + n * d + h * dh;
            if (!q) {
              pc[j] += static_cast<double>(dz);
#pragma omp simd
              for (int64_t c = 0; c < dh; ++c) dv[c] += aj * g[c];
              continue;
            }
            const T cw = dz * r[j];
            const T cv = f.key_norm ? math::mix_backward_coefs(dz, r[j], qv[j], T(dh)).cv : T(0);
            T* dq = shared ? nullptr : dquery + n * d + h * dh;
            double* pq = shared ? pc + h * dh : nullptr;
#pragma omp simd
            for (int64_t c = 0; c < dh; ++c) {
              const T vc = v[c];
              dv[c] += aj * g[c] + cw * q[c] + cv * vc;
              if (dq) dq[c] += cw * vc;
              else pq[c] += static_cast<double>(cw * vc);
            }
          }
        }
    }
  }
  if (shared) add_chunk_sums(dquery, partial.data(), n_chunks, width, width);
}

#define ATTNRES_MIX_VARIANT_INSTANTIATE(T)                                                     \
  template void mix_variant_forward<T>(T*, T*, const T*, const T* const*, int64_t, int64_t,     \
                                       int64_t, const MixForm&, T);                             \
  template void mix_variant_backward<T>(T* const*, T*, const T*, const T*, const T* const*,     \
                                        const T*, int64_t, int64_t, int64_t, const MixForm&, T);
ATTNRES_MIX_VARIANT_INSTANTIATE(float)
ATTNRES_MIX_VARIANT_INSTANTIATE(double)
#undef ATTNRES_MIX_VARIANT_INSTANTIATE

}  // namespace attnres::kernels::cpu
