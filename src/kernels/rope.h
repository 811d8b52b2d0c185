// Rotary position embedding, Hugging Face "rotate half" layout: for position t
// and i < hd/2, angle = t * theta^(-2i/hd) rotates the pair (x[i], x[i+hd/2]).
#pragma once
#include "core/tensor.h"

namespace attnres::kernels {

// In place on the first n_heads heads of each row of x [B*T, W] (W >=
// n_heads*head_dim: the joint q/k/v rows, whose q and k heads come first and
// take the same rotation; the rest of the row is left alone); row b*T+t has
// position pos0 + t.
void rope_forward(Tensor& x, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                  int64_t pos0 = 0);

// In place: rotates the gradient back (by -angle), the transpose of forward.
void rope_backward(Tensor& dx, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                   int64_t pos0 = 0);

}  // namespace attnres::kernels
