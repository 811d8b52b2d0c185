// CPU LM head fused with softmax cross-entropy.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// h [N, d], w [V, d], targets [N] (already checked to lie in [0, V)).
// Returns sum_n (logsumexp(l_n) - l_n[t_n]) with l_n = h_n W^T. If dh / dw are
// non-null, accumulates grad_scale * (softmax(l_n) - onehot(t_n)) W into dh
// and its transpose times h into dw.
template <typename T>
double lm_head_cross_entropy(const T* h, const T* w, const int32_t* targets, T* dh, T* dw,
                             int64_t N, int64_t V, int64_t d, double grad_scale,
                             bool accumulate_dh = true);

}  // namespace attnres::kernels::cpu
