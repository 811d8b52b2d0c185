// CPU depth Mix of the residual variants (kernels/mix_variant.h for the math).
#pragma once
#include <cstdint>

#include "kernels/mix_variant.h"

namespace attnres::kernels::cpu {

// sources: k pointers to row-major [N, d]; query [d], [N, d] or [k] by
// form.logits; weights [N, H, k].
template <typename T>
void mix_variant_forward(T* out, T* weights, const T* query, const T* const* sources, int64_t N,
                         int64_t d, int64_t k, const MixForm& form, T eps);

template <typename T>
void mix_variant_backward(T* const* dsources, T* dquery, const T* dout, const T* query,
                          const T* const* sources, const T* weights, int64_t N, int64_t d,
                          int64_t k, const MixForm& form, T eps);

}  // namespace attnres::kernels::cpu
