// CPU rotary position embedding, Hugging Face "rotate half" layout.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// In place on the first n_heads heads of each row of x [B*T, ld] (ld >=
// n_heads*head_dim); row b*T+t has position pos0 + t. For i < head_dim/2 the
// pair (x[i], x[i + head_dim/2]) of every head is rotated by angle
// (pos0+t) * theta^(-2i/head_dim); `inverse` rotates by minus that angle (the
// transpose, used for the backward pass).
template <typename T>
void rope_rotate(T* x, int64_t ld, int64_t B, int64_t T_, int64_t n_heads, int64_t head_dim,
                 double theta, int64_t pos0, bool inverse);

}  // namespace attnres::kernels::cpu
