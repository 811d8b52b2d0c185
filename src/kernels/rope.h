// Rotary position embedding, Hugging Face "rotate half" layout: for position t
// and i < hd/2, angle = t * theta^(-2i/hd) rotates the pair (x[i], x[i+hd/2]).
#pragma once
#include "core/tensor.h"

namespace attnres::kernels {

// In place on x [B*T, n_heads*head_dim]; row b*T+t has position pos0 + t.
void rope_forward(Tensor& x, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                  int64_t pos0 = 0);

// In place: rotates the gradient back (by -angle), the transpose of forward.
void rope_backward(Tensor& dx, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                   int64_t pos0 = 0);

}  // namespace attnres::kernels
