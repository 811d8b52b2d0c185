#include "kernels/cpu/rmsnorm.h"

#include <cstddef>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "kernels/math.h"

namespace attnres::kernels::cpu {

namespace {
// Rows per dgain partial sum. A fixed size (not "one chunk per thread") makes
// the reduction order, and so the result bits, independent of the thread count.
constexpr int64_t kRowChunk = 256;
// Below this many elements, thread start-up costs more than the work.
constexpr int64_t kParallelMin = 1 << 15;
}  // namespace

template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gain, int64_t N, int64_t d, T eps) {
#pragma omp parallel for schedule(static) if (N * d >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * d;
    T* yi = y + i * d;
    // `omp simd reduction` lets the compiler vectorise the sum (it reorders
    // the additions, but the same way on every call).
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < d; ++j) ss += xi[j] * xi[j];
    const T r = math::rstd_from_sum_sq(ss, d, eps);
    rstd[i] = r;
    if (gain) {
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] * r * gain[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] * r;
    }
  }
}

// With u = x*r (normalised input), y = u*g and r = (mean(x^2)+eps)^-1/2:
//   dr/dx_j = -r^3 x_j / d, so
//   dx_j   = r g_j dy_j - x_j * (r^3 / d) * sum_k dy_k g_k x_k
//   dg_j   = sum_rows dy_j x_j r
// (with no gain, g_j = 1).
template <typename T>
void rmsnorm_backward(T* dx, T* dgain, const T* dy, const T* x, const T* rstd, const T* gain,
                      int64_t N, int64_t d, bool accumulate_dx) {
  const int64_t n_chunks = (N + kRowChunk - 1) / kRowChunk;
  // One row of dgain partials per chunk, accumulated in double: dgain sums
  // over every token of the batch, where fp32 rounding would add up.
  std::vector<double> partial(dgain ? static_cast<size_t>(n_chunks * d) : 0, 0.0);

#pragma omp parallel for schedule(static) if (N * d >= kParallelMin)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t row_end = (c + 1) * kRowChunk < N ? (c + 1) * kRowChunk : N;
    double* pc = dgain ? partial.data() + c * d : nullptr;
    for (int64_t i = c * kRowChunk; i < row_end; ++i) {
      const T* xi = x + i * d;
      const T* dyi = dy + i * d;
      T* dxi = dx + i * d;
      const T r = rstd[i];
      T dot = 0;  // sum_k dy_k g_k x_k
      if (gain) {
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < d; ++j) dot += dyi[j] * gain[j] * xi[j];
      } else {
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < d; ++j) dot += dyi[j] * xi[j];
      }
      const T c3 = r * r * r * dot / T(d);
      if (pc) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) pc[j] += static_cast<double>(dyi[j] * xi[j] * r);
      }
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) {
        const T g = r * (gain ? gain[j] : T(1)) * dyi[j] - c3 * xi[j];
        dxi[j] = accumulate_dx ? dxi[j] + g : g;
      }
    }
  }

  if (dgain) add_chunk_sums(dgain, partial.data(), n_chunks, d, d);  // in chunk order
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t,
                                     float);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int64_t,
                                      int64_t, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int64_t, int64_t, bool);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int64_t, int64_t, bool);

}  // namespace attnres::kernels::cpu
