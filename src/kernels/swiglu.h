// SwiGLU activation on the MLP's joint gate/up projection.
//
// gu [N, 2F] holds each row's gate values in columns [0, F) and its up values
// in [F, 2F): the output of one GEMM with the gate and up weights stacked
// (the model keeps them in one allocation, model/params.h). Then
//   h[n, f] = silu(gu[n, f]) * gu[n, F + f],   silu(x) = x * sigmoid(x).
#pragma once
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

void swiglu_forward(Tensor& h, const Tensor& gu);  // h [N, F], gu [N, 2F]

// dgu[:, :F] += dh * up * silu'(gate); dgu[:, F:] += dh * silu(gate)
// (store Set: =), with gate, up the halves of gu.
void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, Store store = Store::Add);

}  // namespace attnres::kernels
