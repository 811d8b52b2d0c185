// CUDA RoPE (see kernels/rope.h), in place; inverse = rotate by -angle.
#pragma once
#include "core/tensor.h"

namespace attnres::kernels::cuda {
// x [B*T, W], W = x.dim(1) >= n_heads * head_dim (the row stride): rotates the
// first n_heads heads of each row and leaves the rest of the row alone (the
// joint qkv: n_heads = H + Hkv rotates q and k, not v). Shapes are checked by
// the dispatcher (kernels/rope.cpp).
void rope_rotate(Tensor& x, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                 int64_t pos0, bool inverse);
}  // namespace attnres::kernels::cuda
