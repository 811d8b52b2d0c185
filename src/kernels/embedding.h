// Token embedding lookup.
#pragma once
#include "core/tensor.h"

namespace attnres::kernels {

// out[i, :] = weight[tokens[i], :]            out [N, d], weight [V, d], tokens I32 [N]
// Throws (naming the position and id) if a token is outside [0, V).
void embedding_forward(Tensor& out, const Tensor& weight, const Tensor& tokens);

// dweight[tokens[i], :] += dout[i, :]        deterministic: fixed summation order
void embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens);

}  // namespace attnres::kernels
