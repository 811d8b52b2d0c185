// CPU AttnRes depth Mix (MODEL.md section 2).
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

#include "kernels/math.h"

namespace attnres::kernels::cpu {

namespace {
// Rows per dw partial sum. Fixed (not "one chunk per thread") so that the
// reduction order does not depend on the thread count.
constexpr int64_t kRowChunk = 256;
// Below this many multiply-adds, thread start-up costs more than the work.
constexpr int64_t kParallelMin = 1 << 15;

template <typename T>
T dot(const T* a, const T* b, int64_t d) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}
}  // namespace

template <typename T>
void mix_source_rstd(T* rstd, const T* v, int64_t N, int64_t d, T eps) {
#pragma omp parallel for schedule(static) if (N * d >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* vn = v + n * d;
    rstd[n] = math::rstd_from_sum_sq(dot(vn, vn, d), d, eps);
  }
}

template <typename T>
void mix_forward(T* out, T* probs, const T* w, const T* const* sources, const T* const* rstds,
                 int64_t N, int64_t d, int64_t k) {
#pragma omp parallel if (N * d * k >= kParallelMin)
  {
    std::vector<T> a(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      // logit_j = w . (v_j rstd_j): the key is the RMS-normalised source.
      T m = -INFINITY;
      for (int64_t j = 0; j < k; ++j) {
        a[j] = dot(w, sources[j] + n * d, d) * rstds[j][n];
        m = std::max(m, a[j]);
      }
      // Softmax with max subtraction. With k == 1 this gives a_0 = 1 exactly,
      // so the output is the source bit for bit.
      T l = 0;
      for (int64_t j = 0; j < k; ++j) {
        a[j] = std::exp(a[j] - m);
        l += a[j];
      }
      const T inv = T(1) / l;
      for (int64_t j = 0; j < k; ++j) {
        a[j] *= inv;
        probs[n * k + j] = a[j];
      }
      T* o = out + n * d;
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

// Per row, with x_j = v_j r_j (r_j = rstd_j), logit_j = w . x_j, a = softmax(logit):
//   da_j     = dout . v_j
//   dlogit_j = a_j (da_j - sum_i a_i da_i)                       (softmax backward)
//   dv_j    += a_j dout + dlogit_j r_j (w - x_j (w . x_j) / d)    (dr_j/dv_j = -r_j^3 v_j / d)
//            = a_j dout + (dlogit_j r_j) w - (dlogit_j r_j^3 (w . v_j) / d) v_j
//   dw      += dlogit_j r_j v_j
template <typename T>
void mix_backward(T* const* dsources, T* dw, const T* dout, const T* w, const T* const* sources,
                  const T* const* rstds, const T* probs, int64_t N, int64_t d, int64_t k) {
  const int64_t n_chunks = (N + kRowChunk - 1) / kRowChunk;
  // dw partials in double: dw sums over every token of the batch.
  std::vector<double> partial(static_cast<size_t>(n_chunks * d), 0.0);

#pragma omp parallel if (N * d * k >= kParallelMin)
  {
    std::vector<T> wv(static_cast<size_t>(k)), da(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      double* pc = partial.data() + ch * d;
      const int64_t row_end = std::min(N, (ch + 1) * kRowChunk);
      for (int64_t n = ch * kRowChunk; n < row_end; ++n) {
        const T* dy = dout + n * d;
        const T* a = probs + n * k;
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
          const T g = a[j] * (da[j] - s);        // dlogit_j
          const T aj = a[j];
          const T cw = g * r;                     // coefficient of w
          const T cv = -g * r * r * r * wv[j] / T(d);  // coefficient of v_j
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

  // Combine the chunk partials in chunk order.
  for (int64_t c = 0; c < d; ++c) {
    double t = 0;
    for (int64_t ch = 0; ch < n_chunks; ++ch) t += partial[ch * d + c];
    dw[c] += static_cast<T>(t);
  }
}

template void mix_source_rstd<float>(float*, const float*, int64_t, int64_t, float);
template void mix_source_rstd<double>(double*, const double*, int64_t, int64_t, double);
template void mix_forward<float>(float*, float*, const float*, const float* const*,
                                 const float* const*, int64_t, int64_t, int64_t);
template void mix_forward<double>(double*, double*, const double*, const double* const*,
                                  const double* const*, int64_t, int64_t, int64_t);
template void mix_backward<float>(float* const*, float*, const float*, const float*,
                                  const float* const*, const float* const*, const float*, int64_t,
                                  int64_t, int64_t);
template void mix_backward<double>(double* const*, double*, const double*, const double*,
                                   const double* const*, const double* const*, const double*,
                                   int64_t, int64_t, int64_t);

}  // namespace attnres::kernels::cpu
