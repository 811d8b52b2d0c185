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

// softplus(x) = log(1 + exp(x)), without overflow for large x (past 20 it is
// x to the last bit of a double's 1 + exp(-x)); its derivative is sigmoid(x).
template <typename T>
ATTNRES_HD T softplus(T x) { return x > T(20) ? x : log1p(exp(x)); }

// A MoE token's router scores from its E logits r (kernels/moe.h): sigmoid(r_e),
// or the softmax over the E (its max and sum taken first), one expert at a
// time, so that a GPU thread needs no per-expert storage. The CPU and CUDA
// routings both go through it (and moe_top_k): one choice rule.
template <typename T>
struct MoeScores {
  const T* r;
  bool sigmoid_router;
  T m = T(0), sum = T(1);
  ATTNRES_HD MoeScores(const T* logits, long long E, bool sigmoid_scores)
      : r(logits), sigmoid_router(sigmoid_scores) {
    if (sigmoid_router) return;
    m = r[0];
    for (long long e = 1; e < E; ++e) m = r[e] > m ? r[e] : m;
    sum = T(0);
    for (long long e = 0; e < E; ++e) sum += exp(r[e] - m);
  }
  ATTNRES_HD T operator()(long long e) const {
    return sigmoid_router ? sigmoid(r[e]) : exp(r[e] - m) / sum;
  }
};

// The K experts with the largest score(e) + bias[e] (bias may be null), ties
// to the lower index, written in ascending index to idx[0..K) with their
// scores in chosen[0..K); key: K values of scratch. One pass over the E
// experts keeping the best K sorted by key (then index): an expert enters
// only above the K-th key, so an equal key leaves the lower index in.
template <typename T, typename Scores>
ATTNRES_HD void moe_top_k(const Scores& score, const T* bias, long long E, int K, int* idx,
                          T* chosen, T* key) {
  int n = 0;
  for (long long e = 0; e < E; ++e) {
    const T s = score(e), k = s + (bias ? bias[e] : T(0));
    if (n == K && !(k > key[K - 1])) continue;
    int p = n < K ? n++ : K - 1;  // the end, or the evicted K-th's place
    for (; p > 0 && k > key[p - 1]; --p) {
      key[p] = key[p - 1];
      idx[p] = idx[p - 1];
      chosen[p] = chosen[p - 1];
    }
    key[p] = k;
    idx[p] = static_cast<int>(e);
    chosen[p] = s;
  }
  for (int i = 1; i < K; ++i)  // ascending index: the order the outputs are added in
    for (int p = i; p > 0 && idx[p] < idx[p - 1]; --p) {
      const int ti = idx[p];
      idx[p] = idx[p - 1], idx[p - 1] = ti;
      const T ts = chosen[p];
      chosen[p] = chosen[p - 1], chosen[p - 1] = ts;
    }
}

// A MoE token's gate weights g_j = scale s_j / sum_i s_i over its K chosen
// experts' scores s (kernels/moe.h), in the order given.
template <typename T>
ATTNRES_HD void moe_gates(const T* s, int K, T scale, T* g) {
  T sum = T(0);
  for (int j = 0; j < K; ++j) sum += s[j];
  for (int j = 0; j < K; ++j) g[j] = scale * s[j] / sum;
}

// Their backward: from dL/dg to
// dL/dr_j, r the router logits. Sigmoid scores: ds_j = scale / sum (dg_j -
// sum_i dg_i s_i / sum), times s_j (1 - s_j). Softmax scores renormalised
// over the chosen are a softmax over the chosen logits, g = scale q: dr_j =
// g_j (dg_j - sum_i dg_i s_i / sum). Nothing reaches an unchosen logit.
template <typename T>
ATTNRES_HD void moe_gate_backward(const T* s, const T* dg, int K, T scale, bool sigmoid_router,
                                  T* dr) {
  T sum = T(0), dot = T(0);
  for (int j = 0; j < K; ++j) sum += s[j];
  for (int j = 0; j < K; ++j) dot += dg[j] * s[j];
  const T mean = dot / sum;
  for (int j = 0; j < K; ++j) {
    const T c = dg[j] - mean;
    dr[j] = sigmoid_router ? scale / sum * c * s[j] * (T(1) - s[j]) : scale * s[j] / sum * c;
  }
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

// The backward of a depth Mix through one source's logit (docs/model.md
// section 2; kernels/cpu/mix.cpp derives it), as coefficients of the rows it
// combines: with dlogit the gradient of the logit (r_j w . v_j), r the source's
// key rstd, wv = w . v and d the row width, the source's gradient gets
// a dout + cw w + cv v and the query's dw gets cw v, where cw = dlogit r and
// cv = -dlogit r^3 wv / d (the last through r = rstd(v)).
template <typename T>
struct MixBackwardCoefs {
  T cw, cv;
};
template <typename T>
ATTNRES_HD MixBackwardCoefs<T> mix_backward_coefs(T dlogit, T r, T wv, T d) {
  return {dlogit * r, -dlogit * r * r * r * wv / d};
}

// The per-step constants of an AdamW update, each computed in double and
// rounded once to the element type (kernels/adamw.cpp): c1 = 1 - b1,
// c2 = 1 - b2, bc1 = 1 - b1^t, bc2 = 1 - b2^t. (1 - b2 formed in float from b2
// already rounded to float errs by up to 2^-25 / (1 - b2) relative: 1.7e-5 at
// b2 = 0.999, where PyTorch, which rounds the double once, is within 2^-24.)
template <typename C>
struct AdamWCoeffs {
  C lr, b1, c1, b2, c2, eps, bc1, bc2;
};

// One AdamW element update (docs/model.md section 4), in the arithmetic of T
// (the CUDA kernel's T rounds every operation explicitly, as the CPU's does).
template <typename T, typename C>
ATTNRES_HD void adamw_element(T& p, T g, T& m, T& v, const AdamWCoeffs<C>& k, T decay_factor) {
  p *= decay_factor;
  m = T(k.b1) * m + T(k.c1) * g;
  v = T(k.b2) * v + T(k.c2) * g * g;
  p -= T(k.lr) * (m / T(k.bc1)) / (sqrt(v / T(k.bc2)) + T(k.eps));
}

}  // namespace attnres::kernels::math
