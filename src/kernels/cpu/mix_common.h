// What the CPU depth-Mix kernels share (cpu/mix.cpp, the two-phase AttnRes
// Mix; cpu/mix_variant.cpp, the residual variants' and DenseFormer's): the
// fixed row chunks of their row reductions, their threading threshold, and
// the dot product over a row.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu::mix {

// Rows per partial sum of a reduction over rows (a query's gradient). Fixed
// (not "one chunk per thread") so that the reduction order does not depend
// on the thread count.
constexpr int64_t kRowChunk = 256;
// Below this many multiply-adds, thread start-up costs more than the work.
constexpr int64_t kParallelMin = 1 << 15;

template <typename T>
inline T dot(const T* a, const T* b, int64_t d) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

}  // namespace attnres::kernels::cpu::mix
