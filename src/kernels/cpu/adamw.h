// CPU AdamW update over n elements (docs/model.md section 4, PyTorch semantics).
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// Per element: math::adamw_element. bc1 = 1 - b1^t, bc2 = 1 - b2^t and
// decay_factor = 1 - lr*wd (or 1) are computed once by the caller.
template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T b1, T b2, T eps,
                  T decay_factor, T bc1, T bc2, T grad_scale);

}  // namespace attnres::kernels::cpu
