#include "kernels/cpu/adamw.h"

#include "kernels/math.h"

namespace attnres::kernels::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
}

template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const math::AdamWCoeffs<T>& k,
                  T decay_factor, T grad_scale) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    math::adamw_element(p[i], g[i] * grad_scale, m[i], v[i], k, decay_factor);
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t,
                                  const math::AdamWCoeffs<float>&, float, float);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const math::AdamWCoeffs<double>&, double, double);

}  // namespace attnres::kernels::cpu
