#include "kernels/cpu/adamw.h"

#include "kernels/math.h"

namespace attnres::kernels::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
}

template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T b1, T b2, T eps,
                  T decay_factor, T bc1, T bc2, T grad_scale) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    math::adamw_element(p[i], g[i] * grad_scale, m[i], v[i], lr, b1, b2, eps, decay_factor, bc1,
                        bc2);
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, float, float,
                                  float, float, float, float, float, float);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, double,
                                   double, double, double, double, double, double, double);

}  // namespace attnres::kernels::cpu
