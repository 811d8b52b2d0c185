#include "kernels/cpu/embedding.h"

#include <cstddef>
#include <cstring>
#include <vector>

namespace attnres::kernels::cpu {

template <typename T>
void embedding_forward(T* out, const T* weight, const int32_t* tokens, int64_t N, int64_t d) {
  // A pure gather: one row copy per token. Only worth threads for big batches.
#pragma omp parallel for schedule(static) if (N * d >= (1 << 16))
  for (int64_t i = 0; i < N; ++i)
    std::memcpy(out + i * d, weight + static_cast<int64_t>(tokens[i]) * d, sizeof(T) * d);
}

template <typename T>
void embedding_backward(T* dweight, const T* dout, const int32_t* tokens, int64_t N, int64_t V,
                        int64_t d) {
  // Several positions can hold the same token, so a plain parallel loop over
  // positions would race on dweight (and atomics would make the float sum
  // order, hence the bits, depend on scheduling). Instead we bucket positions
  // by token with a stable counting sort; each vocabulary row is then owned by
  // one thread, which adds its positions in increasing order -- exactly the
  // order of the serial loop, for any thread count.
  std::vector<int64_t> start(static_cast<size_t>(V) + 1, 0);
  for (int64_t i = 0; i < N; ++i) ++start[tokens[i] + 1];
  for (int64_t v = 0; v < V; ++v) start[v + 1] += start[v];
  std::vector<int64_t> order(static_cast<size_t>(N));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < N; ++i) order[fill[tokens[i]]++] = i;
  }

  // Dynamic schedule: token frequencies are very skewed (a few ids are in
  // most positions), and most vocabulary rows have no work at all.
#pragma omp parallel for schedule(dynamic, 64) if (N * d >= (1 << 16))
  for (int64_t v = 0; v < V; ++v) {
    T* dst = dweight + v * d;
    for (int64_t k = start[v]; k < start[v + 1]; ++k) {
      const T* src = dout + order[k] * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
    }
  }
}

template void embedding_forward<float>(float*, const float*, const int32_t*, int64_t, int64_t);
template void embedding_forward<double>(double*, const double*, const int32_t*, int64_t, int64_t);
template void embedding_backward<float>(float*, const float*, const int32_t*, int64_t, int64_t,
                                        int64_t);
template void embedding_backward<double>(double*, const double*, const int32_t*, int64_t, int64_t,
                                         int64_t);

}  // namespace attnres::kernels::cpu
