// CUDA RoPE (see kernels/rope.h), in place; inverse = rotate by -angle.
#pragma once
#include "core/tensor.h"

namespace attnres::kernels::cuda {
void rope_rotate(Tensor& x, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                 int64_t pos0, bool inverse);
}  // namespace attnres::kernels::cuda
