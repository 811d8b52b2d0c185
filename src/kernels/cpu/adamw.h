// CPU AdamW update over n elements (docs/model.md section 4, PyTorch semantics).
#pragma once
#include <cstdint>

#include "kernels/math.h"

namespace attnres::kernels::cpu {

// Per element: math::adamw_element. The coefficients and decay_factor =
// 1 - lr*wd (or 1) are computed once by the caller.
template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const math::AdamWCoeffs<T>& k,
                  T decay_factor, T grad_scale);

}  // namespace attnres::kernels::cpu
