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
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t n,
                     bool accumulate) {
  // The old values are read only when accumulating: with Store::Set the
  // buffers may hold anything (NaN included).
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i], d = dh[i];
    const T dg = d * up[i] * math::silu_grad(g), du = d * math::silu(g);
    dgate[i] = accumulate ? dgate[i] + dg : dg;
    dup[i] = accumulate ? dup[i] + du : du;
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t);
template void swiglu_forward<double>(double*, const double*, const double*, int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t, bool);
template void swiglu_backward<double>(double*, double*, const double*, const double*,
                                      const double*, int64_t, bool);

}  // namespace attnres::kernels::cpu
