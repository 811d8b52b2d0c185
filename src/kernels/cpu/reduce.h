// CPU reductions and elementwise helpers over n contiguous values.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// sum(x^2) in double, in a fixed order: blocks of kSumBlock elements are each
// summed (in parallel), then the block sums are added serially in order.
// The result is therefore the same for every thread count.
constexpr int64_t kSumBlock = int64_t(1) << 14;
template <typename T>
double sum_squares(const T* x, int64_t n);

template <typename T>
void scale_(T* x, int64_t n, T s);  // x *= s
template <typename T>
void add_(T* y, const T* x, int64_t n);  // y += x
template <typename T>
void add(T* out, const T* a, const T* b, int64_t n);  // out = a + b
template <typename T>
bool all_finite(const T* x, int64_t n);

// out[c] += sum over ch = 0..n_chunks-1, in that order, of partial[ch * stride + c]
// (c < d), the sum in double and rounded once to T: the combine of per-chunk
// partials that makes a row reduction independent of the thread count.
template <typename T>
void add_chunk_sums(T* out, const double* partial, int64_t n_chunks, int64_t stride, int64_t d);

}  // namespace attnres::kernels::cpu
