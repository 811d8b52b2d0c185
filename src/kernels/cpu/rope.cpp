#include "kernels/cpu/rope.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace attnres::kernels::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
}

template <typename T>
void rope_rotate(T* x, int64_t ld, int64_t B, int64_t T_, int64_t n_heads, int64_t head_dim,
                 double theta, int64_t pos0, bool inverse) {
  const int64_t half = head_dim / 2;
  const int64_t width = n_heads * head_dim;  // rotated columns of each row
  if (B == 0 || T_ == 0 || half == 0) return;

  // cos/sin table [T, half], computed in double and rounded once, so that the
  // float and double paths see the same angles (up to the final rounding) and
  // large positions do not lose precision in t * inv_freq.
  std::vector<T> cos_t(static_cast<size_t>(T_ * half)), sin_t(static_cast<size_t>(T_ * half));
  const double sign = inverse ? -1.0 : 1.0;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
#pragma omp parallel for schedule(static) if (T_ * half >= 4096)
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos0 + t) * inv_freq[i];
      cos_t[t * half + i] = static_cast<T>(std::cos(angle));
      sin_t[t * half + i] = static_cast<T>(sign * std::sin(angle));
    }
  }

  // Rotating by -angle only flips the sign of sin, which we folded into the
  // table, so forward and backward share this loop:
  //   x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin.
  const int64_t rows = B * T_;
#pragma omp parallel for schedule(static) if (rows * width >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* c = cos_t.data() + (r % T_) * half;
    const T* s = sin_t.data() + (r % T_) * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      T* x1 = x + r * ld + h * head_dim;
      T* x2 = x1 + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
      }
    }
  }
}

template void rope_rotate<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                                 int64_t, bool);
template void rope_rotate<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                                  int64_t, bool);

}  // namespace attnres::kernels::cpu
