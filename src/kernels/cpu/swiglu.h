// CPU SwiGLU activation, elementwise over n values.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// h = silu(gate) * up
template <typename T>
void swiglu_forward(T* h, const T* gate, const T* up, int64_t n);

// dgate += dh * up * silu'(gate); dup += dh * silu(gate)
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t n,
                     bool accumulate = true);

}  // namespace attnres::kernels::cpu
