// CPU SwiGLU activation over N rows of F values (kernels/swiglu.h): gu rows
// hold gate | up, 2F values each.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// h[n, f] = silu(gate) * up
template <typename T>
void swiglu_forward(T* h, const T* gu, int64_t N, int64_t F);

// dgate += dh * up * silu'(gate); dup += dh * silu(gate), into dgu's halves
template <typename T>
void swiglu_backward(T* dgu, const T* dh, const T* gu, int64_t N, int64_t F,
                     bool accumulate = true);

}  // namespace attnres::kernels::cpu
