// CPU AttnRes depth Mix (docs/model.md section 2).
//
// Every token row is independent except for dw, which sums over all rows; so
// rows are split across threads and dw is reduced through per-chunk partials
// over fixed row ranges, combined in chunk order (bits independent of the
// thread count). k is small (the number of depth sources, ~2..20), so the
// per-row work is k dot products and k axpys over d.
#include "kernels/cpu/mix.h"

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

template <typename T>
void mix_source_rstd(T* rstd, const T* v, int64_t N, int64_t d, T eps) {
#pragma omp parallel for schedule(static) if (N * d >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* vn = v + n * d;
    rstd[n] = math::rstd_from_sum_sq(dot(vn, vn, d), d, eps);
  }
}

template <typename T>
void mix_forward(T* const* outs, T* probs, T* lse, const T* const* ws, int64_t Q,
                 const T* const* sources, const T* const* rstds, int64_t N, int64_t d, int64_t k) {
#pragma omp parallel if (N * d * k * Q >= kParallelMin)
  {
    std::vector<T> a(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t q = 0; q < Q; ++q) {  // queries one after another: each as if alone
        const T* w = ws[q];
        // logit_j = w . (v_j rstd_j): the key is the RMS-normalised source.
        T m = -INFINITY;
        for (int64_t j = 0; j < k; ++j) {
          a[j] = dot(w, sources[j] + n * d, d) * rstds[j][n];
          m = std::max(m, a[j]);
        }
        // Softmax with max subtraction. With k == 1 this gives a_0 = 1
        // exactly, so the output is the source bit for bit.
        T l = 0;
        for (int64_t j = 0; j < k; ++j) {
          a[j] = std::exp(a[j] - m);
          l += a[j];
        }
        if (lse) lse[q * N + n] = m + std::log(l);
        const T inv = T(1) / l;
        T* pr = probs + (q * N + n) * k;
        for (int64_t j = 0; j < k; ++j) {
          a[j] *= inv;
          pr[j] = a[j];
        }
        T* o = outs[q] + n * d;
        const T* v0 = sources[0] + n * d;
        const T a0 = a[0];
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) o[c] = a0 * v0[c];
        for (int64_t j = 1; j < k; ++j) {
          const T* vj = sources[j] + n * d;
          const T aj = a[j];
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) o[c] += aj * vj[c];
        }
      }
  }
}

// Per row and query, with x_j = v_j r_j (r_j = rstd_j), logit_j = w . x_j,
// a = softmax(logit), and dlse the gradient of lse = log sum_j exp(logit_j)
// (d lse / d logit_j = a_j):
//   da_j     = dout . v_j
//   dlogit_j = a_j (da_j - sum_i a_i da_i + dlse)                (softmax backward)
//   dv_j    += a_j dout + dlogit_j r_j (w - x_j (w . x_j) / d)    (dr_j/dv_j = -r_j^3 v_j / d)
//            = a_j dout + (dlogit_j r_j) w - (dlogit_j r_j^3 (w . v_j) / d) v_j
//   dw      += dlogit_j r_j v_j
template <typename T>
void mix_backward(T* const* dsources, T* const* dws, const T* const* douts, const T* dlse,
                  const T* const* ws, int64_t Q, const T* const* sources, const T* const* rstds,
                  const T* probs, int64_t N, int64_t d, int64_t k) {
  const int64_t n_chunks = (N + kRowChunk - 1) / kRowChunk;
  // dw partials in double, per query and row chunk: dw sums over every token.
  std::vector<double> partial(static_cast<size_t>(Q * n_chunks * d), 0.0);

#pragma omp parallel if (N * d * k * Q >= kParallelMin)
  {
    std::vector<T> wv(static_cast<size_t>(k)), da(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      const int64_t row_end = std::min(N, (ch + 1) * kRowChunk);
      for (int64_t n = ch * kRowChunk; n < row_end; ++n)
        for (int64_t q = Q - 1; q >= 0; --q) {  // descending: see kernels/mix.h
          const T* w = ws[q];
          const T* dy = douts[q] + n * d;
          const T* a = probs + (q * N + n) * k;
          const T dl = dlse ? dlse[q * N + n] : T(0);
          double* pc = partial.data() + (q * n_chunks + ch) * d;
          // All reads of dout and the sources for this row happen before any
          // write to dsources, so dsources may alias each other.
          T s = 0;  // sum_i a_i da_i
          for (int64_t j = 0; j < k; ++j) {
            const T* vj = sources[j] + n * d;
            T x = 0, y = 0;
#pragma omp simd reduction(+ : x, y)
            for (int64_t c = 0; c < d; ++c) {
              x += w[c] * vj[c];
              y += dy[c] * vj[c];
            }
            wv[j] = x;
            da[j] = y;
            s += a[j] * y;
          }
          for (int64_t j = 0; j < k; ++j) {
            const T* vj = sources[j] + n * d;
            T* dvj = dsources[j] + n * d;
            const T r = rstds[j][n];
            const T aj = a[j];
            const T g = aj * (da[j] - s + dl);  // dlogit_j
            const auto [cw, cv] = math::mix_backward_coefs(g, r, wv[j], T(d));
            // One pass over v_j for both its gradient and dw's partial.
#pragma omp simd
            for (int64_t c = 0; c < d; ++c) {
              const T v = vj[c];
              dvj[c] += aj * dy[c] + cw * w[c] + cv * v;
              pc[c] += static_cast<double>(cw * v);
            }
          }
        }
    }
  }

  // Combine each query's chunk partials in chunk order.
  for (int64_t q = 0; q < Q; ++q)
    add_chunk_sums(dws[q], partial.data() + q * n_chunks * d, n_chunks, d, d);
}

// The merge is the online softmax of math::OnlineSoftmax started from
// phase 1's state (max lse, sum 1, accumulator o), the same recurrence as the
// CUDA kernel.
template <typename T>
void mix_merge_norm_forward(T* u, T* stats, const T* w, const T* o, const T* lse,
                            const T* const* recent, int64_t m, const T* gain, int64_t N, int64_t d,
                            T eps) {
  const int64_t ns = 2 * m + 2;  // stats per row
#pragma omp parallel if (N * d * (m + 1) >= kParallelMin)
  {
    std::vector<T> x(static_cast<size_t>(d)), z(static_cast<size_t>(m));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* on = o + n * d;
      T* un = u + n * d;
      T* st = stats + n * ns;
      math::OnlineSoftmax<T> sm;
      T weight;
      sm.push(lse[n], weight);  // weight 1: the accumulator starts as o
      std::copy(on, on + d, x.begin());
      for (int64_t j = 0; j < m; ++j) {
        const T* e = recent[j] + n * d;
        const T r = math::rstd_from_sum_sq(dot(e, e, d), d, eps);
        z[j] = dot(w, e, d) * r;
        st[m + 1 + j] = r;
        const T scale = sm.push(z[j], weight);
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) x[c] = x[c] * scale + weight * e[c];
      }
      const T inv = T(1) / sm.l;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) x[c] *= inv;
      const T rx = math::rstd_from_sum_sq(dot(x.data(), x.data(), d), d, eps);
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) un[c] = x[c] * rx * gain[c];
      st[0] = std::exp(lse[n] - sm.m) * inv;
      for (int64_t j = 0; j < m; ++j) st[1 + j] = std::exp(z[j] - sm.m) * inv;
      st[ns - 1] = rx;
    }
  }
}

// Per row, with x = a_0 o + sum_j a_j e_j recomputed, r = rstd_x, r_j = rstd_j:
//   RMSNorm:  dx      = r g du - x r^3 (sum_c du_c g_c x_c) / d,   dgain += du x r
//   merge:    s_0 = dx . o, s_j = dx . e_j, s = sum_{i=0..m} a_i s_i (= dx . x)
//             d_o     = a_0 dx,   dlse = a_0 (s_0 - s)        (softmax backward)
//             dz_j    = a_j (s_j - s)
//             de_j   += a_j dx + dz_j r_j w - dz_j r_j^3 (w . e_j) e_j / d
//             dw     += dz_j r_j e_j
template <typename T>
void mix_merge_norm_backward(T* d_o, T* dlse, T* const* drecent, T* dw, T* dgain, const T* du,
                             const T* w, const T* o, const T* const* recent, int64_t m,
                             const T* gain, const T* stats, int64_t N, int64_t d) {
  const int64_t n_chunks = (N + kRowChunk - 1) / kRowChunk, ns = 2 * m + 2;
  // Per chunk: a row of dw partials, then a row of dgain partials (double).
  std::vector<double> partial(static_cast<size_t>(n_chunks * 2 * d), 0.0);
#pragma omp parallel if (N * d * (m + 1) >= kParallelMin)
  {
    std::vector<T> x(static_cast<size_t>(d)), dx(static_cast<size_t>(d));
    std::vector<T> sj(static_cast<size_t>(m)), we(static_cast<size_t>(m));
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      double* pw = partial.data() + ch * 2 * d;
      double* pg = pw + d;
      const int64_t row_end = std::min(N, (ch + 1) * kRowChunk);
      for (int64_t n = ch * kRowChunk; n < row_end; ++n) {
        const T* dun = du + n * d;
        const T* on = o + n * d;
        const T* st = stats + n * ns;
        const T a0 = st[0], r = st[ns - 1];
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) x[c] = a0 * on[c];
        for (int64_t j = 0; j < m; ++j) {
          const T* e = recent[j] + n * d;
          const T aj = st[1 + j];
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) x[c] += aj * e[c];
        }
        T gdot = 0;  // sum_c du_c g_c x_c
#pragma omp simd reduction(+ : gdot)
        for (int64_t c = 0; c < d; ++c) gdot += dun[c] * gain[c] * x[c];
        const T c3 = r * r * r * gdot / T(d);
        T s0 = 0;
#pragma omp simd reduction(+ : s0)
        for (int64_t c = 0; c < d; ++c) {
          dx[c] = r * gain[c] * dun[c] - c3 * x[c];
          pg[c] += static_cast<double>(dun[c] * x[c] * r);
          s0 += dx[c] * on[c];
        }
        T s = a0 * s0;
        for (int64_t j = 0; j < m; ++j) {
          const T* e = recent[j] + n * d;
          sj[j] = dot(dx.data(), e, d);
          we[j] = dot(w, e, d);
          s += st[1 + j] * sj[j];
        }
        dlse[n] = a0 * (s0 - s);
        T* don = d_o + n * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) don[c] = a0 * dx[c];
        for (int64_t j = 0; j < m; ++j) {
          const T* e = recent[j] + n * d;
          T* de = drecent[j] + n * d;
          const T aj = st[1 + j], rj = st[m + 1 + j];
          const T dz = aj * (sj[j] - s);  // dlogit_j
          const auto [cw, ce] = math::mix_backward_coefs(dz, rj, we[j], T(d));
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) {
            de[c] += aj * dx[c] + cw * w[c] + ce * e[c];
            pw[c] += static_cast<double>(cw * e[c]);
          }
        }
      }
    }
  }
  add_chunk_sums(dw, partial.data(), n_chunks, 2 * d, d);
  add_chunk_sums(dgain, partial.data() + d, n_chunks, 2 * d, d);
}

#define ATTNRES_MIX_INSTANTIATE(T)                                                           \
  template void mix_source_rstd<T>(T*, const T*, int64_t, int64_t, T);                          \
  template void mix_forward<T>(T* const*, T*, T*, const T* const*, int64_t, const T* const*,   \
                               const T* const*, int64_t, int64_t, int64_t);                    \
  template void mix_backward<T>(T* const*, T* const*, const T* const*, const T*,               \
                                const T* const*, int64_t, const T* const*, const T* const*,    \
                                const T*, int64_t, int64_t, int64_t);                          \
  template void mix_merge_norm_forward<T>(T*, T*, const T*, const T*, const T*,               \
                                          const T* const*, int64_t, const T*, int64_t, int64_t, \
                                          T);                                                  \
  template void mix_merge_norm_backward<T>(T*, T*, T* const*, T*, T*, const T*, const T*,       \
                                           const T*, const T* const*, int64_t, const T*,        \
                                           const T*, int64_t, int64_t);
ATTNRES_MIX_INSTANTIATE(float)
ATTNRES_MIX_INSTANTIATE(double)
#undef ATTNRES_MIX_INSTANTIATE

}  // namespace attnres::kernels::cpu
