#include "kernels/cpu/reduce.h"

#include <cstddef>
#include <vector>

namespace attnres::kernels::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
}

template <typename T>
double sum_squares(const T* x, int64_t n) {
  const int64_t n_blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> block_sum(static_cast<size_t>(n_blocks));
  // Each block is owned by one thread and summed the same way every time;
  // which thread runs it does not change its bits.
#pragma omp parallel for schedule(static) if (n_blocks > 1)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t end = (b + 1) * kSumBlock < n ? (b + 1) * kSumBlock : n;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b * kSumBlock; i < end; ++i) {
      const double xi = static_cast<double>(x[i]);
      s += xi * xi;
    }
    block_sum[b] = s;
  }
  double total = 0;
  for (int64_t b = 0; b < n_blocks; ++b) total += block_sum[b];  // serial, in order
  return total;
}

template <typename T>
void scale_(T* x, int64_t n, T s) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

template <typename T>
void add_(T* y, const T* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

template <typename T>
void add(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
bool all_finite(const T* x, int64_t n) {
  // x * 0 is 0 for finite x and NaN for +-inf or NaN, so the sum of x * 0 is
  // 0 exactly when every element is finite. Branch-free, so it vectorises.
  // (Without -ffast-math the compiler may not fold x * 0 to 0.)
  T acc = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : acc) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) acc += x[i] * T(0);
  return acc == T(0);
}

template <typename T>
void add_chunk_sums(T* out, const double* partial, int64_t n_chunks, int64_t stride, int64_t d) {
  // One column per iteration, so the threads do not change the order.
#pragma omp parallel for schedule(static) if (n_chunks * d >= kParallelMin)
  for (int64_t c = 0; c < d; ++c) {
    double s = 0;
    for (int64_t ch = 0; ch < n_chunks; ++ch) s += partial[ch * stride + c];
    out[c] += static_cast<T>(s);
  }
}

#define ATTNRES_INSTANTIATE(T)                                  \
  template double sum_squares<T>(const T*, int64_t);            \
  template void scale_<T>(T*, int64_t, T);                      \
  template void add_<T>(T*, const T*, int64_t);                 \
  template void add<T>(T*, const T*, const T*, int64_t);        \
  template bool all_finite<T>(const T*, int64_t);               \
  template void add_chunk_sums<T>(T*, const double*, int64_t, int64_t, int64_t);
ATTNRES_INSTANTIATE(float)
ATTNRES_INSTANTIATE(double)
#undef ATTNRES_INSTANTIATE

}  // namespace attnres::kernels::cpu
