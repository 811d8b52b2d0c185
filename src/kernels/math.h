// Scalar math shared by the CPU and CUDA backends (ATTNRES_HD = __host__
// __device__ under nvcc). Keep these tiny and branch-light.
#pragma once
#include <cmath>

#include "core/hostdevice.h"

namespace attnres::kernels::math {

// 1/sqrt(mean(x^2) + eps) from a row's sum of squares.
template <typename T>
ATTNRES_HD T rstd_from_sum_sq(T sum_sq, long long d, T eps) {
  return T(1) / sqrt(sum_sq / T(d) + eps);
}

template <typename T>
ATTNRES_HD T sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }

template <typename T>
ATTNRES_HD T silu(T x) { return x * sigmoid(x); }

// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)
template <typename T>
ATTNRES_HD T silu_grad(T x) {
  T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

// Running softmax statistics: max m and sum l of exp(x - m). Merging two
// partial states is exact; this is the core of flash attention and of Block
// AttnRes's two-phase Mix (inter-block pass, then merge with the partial sum).
template <typename T>
struct OnlineSoftmax {
  T m = -INFINITY;
  T l = T(0);
  // Add one logit; returns the factor by which earlier accumulators must be
  // rescaled (exp(old_m - new_m)), and sets `weight` to exp(x - new_m).
  ATTNRES_HD T push(T x, T& weight) {
    T new_m = x > m ? x : m;
    T scale = exp(m - new_m);
    weight = exp(x - new_m);
    l = l * scale + weight;
    m = new_m;
    return scale;
  }
  // Merge another state; returns {scale for ours, scale for theirs}.
  ATTNRES_HD void merge(const OnlineSoftmax& o, T& scale_self, T& scale_other) {
    T new_m = o.m > m ? o.m : m;
    scale_self = exp(m - new_m);
    scale_other = exp(o.m - new_m);
    l = l * scale_self + o.l * scale_other;
    m = new_m;
  }
};

// One AdamW element update (docs/model.md section 4). bc1 = 1 - b1^t, bc2 = 1 - b2^t.
template <typename T>
ATTNRES_HD void adamw_element(T& p, T g, T& m, T& v, T lr, T b1, T b2, T eps, T decay_factor,
                              T bc1, T bc2) {
  p *= decay_factor;
  m = b1 * m + (T(1) - b1) * g;
  v = b2 * v + (T(1) - b2) * g * g;
  p -= lr * (m / bc1) / (sqrt(v / bc2) + eps);
}

}  // namespace attnres::kernels::math
