// CUDA AttnRes depth Mix (see kernels/mix.h): sources, outs, ws F32 or BF16;
// rstds, probs, lse and merge stats F32; dws F32 for BF16 weights. Statistics
// and sums in fp32.
#pragma once
#include "core/span.h"
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels::cuda {
void mix_source_rstd(Tensor& rstd, const Tensor& v, float eps);
void mix_forward(Span<Tensor> outs, Tensor& probs, Tensor* lse, Span<const Tensor> ws,
                 Span<const Tensor> sources, Span<const Tensor> rstds);
void mix_backward(Span<Tensor> dsources, Span<Tensor> dws, Span<const Tensor> douts,
                  const Tensor* dlse, Span<const Tensor> ws, Span<const Tensor> sources,
                  Span<const Tensor> rstds, const Tensor& probs, Store store);
void mix_merge_norm_forward(Tensor& u, Tensor& stats, const Tensor& w, const Tensor& o,
                            const Tensor& lse, Span<const Tensor> recent, const Tensor& gain,
                            float eps);
void mix_merge_norm_backward(Tensor& d_o, Tensor& dlse, Span<Tensor> drecent, Tensor& dw,
                             Tensor& dgain, const Tensor& du, const Tensor& w, const Tensor& o,
                             Span<const Tensor> recent, const Tensor& gain, const Tensor& stats,
                             Store drecent_store);
}  // namespace attnres::kernels::cuda
