#include "kernels/cpu/swiglu.h"

#include "kernels/math.h"

namespace attnres::kernels::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
}

template <typename T>
void swiglu_forward(T* h, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) h[i] = math::silu(gate[i]) * up[i];
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i], d = dh[i];
    dgate[i] += d * up[i] * math::silu_grad(g);
    dup[i] += d * math::silu(g);
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t);
template void swiglu_forward<double>(double*, const double*, const double*, int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*,
                                      const double*, int64_t);

}  // namespace attnres::kernels::cpu
