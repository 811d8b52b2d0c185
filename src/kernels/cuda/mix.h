// CUDA AttnRes depth Mix (see kernels/mix.h): sources, out, w F32 or BF16;
// rstds and probs F32; dw F32 for BF16 weights. Statistics and sums in fp32.
#pragma once
#include "core/span.h"
#include "core/tensor.h"

namespace attnres::kernels::cuda {
void mix_source_rstd(Tensor& rstd, const Tensor& v, float eps);
void mix_forward(Tensor& out, Tensor& probs, const Tensor& w, Span<const Tensor> sources,
                 Span<const Tensor> rstds);
void mix_backward(Span<Tensor> dsources, Tensor& dw, const Tensor& dout, const Tensor& w,
                  Span<const Tensor> sources, Span<const Tensor> rstds, const Tensor& probs);
}  // namespace attnres::kernels::cuda
