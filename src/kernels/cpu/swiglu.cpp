#include "kernels/cpu/swiglu.h"

#include "kernels/math.h"

namespace attnres::kernels::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
}

template <typename T>
void swiglu_forward(T* h, const T* gu, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = gu + n * 2 * F;
    const T* up = gate + F;
    T* hn = h + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) hn[f] = math::silu(gate[f]) * up[f];
  }
}

template <typename T>
void swiglu_backward(T* dgu, const T* dh, const T* gu, int64_t N, int64_t F, bool accumulate) {
  // The old values are read only when accumulating: with Store::Set the
  // buffer may hold anything (NaN included).
#pragma omp parallel for schedule(static) if (N * F >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = gu + n * 2 * F;
    const T* up = gate + F;
    const T* d = dh + n * F;
    T* dgate = dgu + n * 2 * F;
    T* dup = dgate + F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const T g = gate[f];
      const T dg = d[f] * up[f] * math::silu_grad(g), du = d[f] * math::silu(g);
      dgate[f] = accumulate ? dgate[f] + dg : dg;
      dup[f] = accumulate ? dup[f] + du : du;
    }
  }
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t);
template void swiglu_forward<double>(double*, const double*, int64_t, int64_t);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int64_t, bool);
template void swiglu_backward<double>(double*, const double*, const double*, int64_t, int64_t,
                                      bool);

}  // namespace attnres::kernels::cpu
