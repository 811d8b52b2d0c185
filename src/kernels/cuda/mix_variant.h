// CUDA depth Mix of the residual variants and DenseFormer's averages (see
// kernels/mix_variant.h): sources, out, dout and row queries F32 or BF16;
// weights F32; a shared query's, the scalars' and the weights' gradients in
// grad_dtype (F32 for BF16). The dispatcher (kernels/mix_variant.cpp) has
// checked the arguments.
#pragma once
#include "core/span.h"
#include "core/tensor.h"
#include "kernels/mix_variant.h"

namespace attnres::kernels::cuda {
void mix_variant_forward(Tensor& out, Tensor& weights, const Tensor& query,
                         Span<const Tensor> sources, const MixForm& form, float eps);
void mix_variant_backward(Span<Tensor> dsources, Tensor& dquery, const Tensor& dout,
                          const Tensor& query, Span<const Tensor> sources, const Tensor& weights,
                          const MixForm& form, float eps);
}  // namespace attnres::kernels::cuda
