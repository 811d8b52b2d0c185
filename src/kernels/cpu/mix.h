// CPU AttnRes depth Mix over k sources, each a row-major [N, d] array.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// rstd[n] = 1/sqrt(mean(v[n,:]^2) + eps).
template <typename T>
void mix_source_rstd(T* rstd, const T* v, int64_t N, int64_t d, T eps);

// out [N, d] = sum_j a_j v_j with a = softmax_j(w . v_j[n] * rstd_j[n]);
// probs [N, k] = a. sources / rstds are arrays of k pointers. out must not
// alias a source.
template <typename T>
void mix_forward(T* out, T* probs, const T* w, const T* const* sources, const T* const* rstds,
                 int64_t N, int64_t d, int64_t k);

// dsources[j] += dL/dv_j (through both a_j v_j and rstd_j); dw += dL/dw with
// the row reduction in a fixed order independent of the thread count.
// dsources must not alias dout or a source (they may alias each other: a row
// is updated by one thread, source after source).
template <typename T>
void mix_backward(T* const* dsources, T* dw, const T* dout, const T* w, const T* const* sources,
                  const T* const* rstds, const T* probs, int64_t N, int64_t d, int64_t k);

}  // namespace attnres::kernels::cpu
