// CPU AttnRes depth Mix over k sources, each a row-major [N, d] array (see
// kernels/mix.h for the math and the two-phase form).
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// rstd[n] = 1/sqrt(mean(v[n,:]^2) + eps).
template <typename T>
void mix_source_rstd(T* rstd, const T* v, int64_t N, int64_t d, T eps);

// Phase 1 for Q queries ws[i] [d]: outs[i] [N, d] = sum_j a_ij v_j with
// a_i = softmax_j(ws[i] . v_j[n] * rstd_j[n]); probs [Q, N, k] = a; lse [Q, N]
// (or null) = log sum_j exp(logit_ij). sources / rstds are arrays of k
// pointers. Outputs must not alias a source.
template <typename T>
void mix_forward(T* const* outs, T* probs, T* lse, const T* const* ws, int64_t Q,
                 const T* const* sources, const T* const* rstds, int64_t N, int64_t d, int64_t k);

// dsources[j] += dL/dv_j (through both a_ij v_j and rstd_j), query by query in
// descending order; dws[i] += dL/dw_i with the row reduction in a fixed order
// independent of the thread count. dlse [Q, N] may be null (no lse gradient).
// dsources must not alias a dout or a source (they may alias each other: a
// row is updated by one thread, source after source).
template <typename T>
void mix_backward(T* const* dsources, T* const* dws, const T* const* douts, const T* dlse,
                  const T* const* ws, int64_t Q, const T* const* sources, const T* const* rstds,
                  const T* probs, int64_t N, int64_t d, int64_t k);

// Phase 2 fused with RMSNorm over the m recent sources e_j: (a_0..a_m) =
// softmax(lse, w . e_j rstd_j), x = a_0 o + sum_j a_j e_j, u = RMSNorm(x;
// gain); stats [N, 2m + 2] = {a_0..a_m, rstd_1..rstd_m, rstd_x}.
template <typename T>
void mix_merge_norm_forward(T* u, T* stats, const T* w, const T* o, const T* lse,
                            const T* const* recent, int64_t m, const T* gain, int64_t N, int64_t d,
                            T eps);

// d_o, dlse written; drecent (may alias each other), dw, dgain accumulated.
template <typename T>
void mix_merge_norm_backward(T* d_o, T* dlse, T* const* drecent, T* dw, T* dgain, const T* du,
                             const T* w, const T* o, const T* const* recent, int64_t m,
                             const T* gain, const T* stats, int64_t N, int64_t d);

}  // namespace attnres::kernels::cpu
