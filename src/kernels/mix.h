// AttnRes depth Mix: the softmax over depth sources that replaces the residual
// stream (MODEL.md section 2). For each token row n:
//
//   logit_j = w . (v_j[n] * rstd_j[n])        keys are RMS-normalised, no gain
//   a_j     = softmax_j(logit_j)              statistics and sums in fp32 (or wider)
//   out[n]  = sum_j a_j v_j[n]
//
// rstd_j[n] = 1/sqrt(mean(v_j[n]^2) + eps). A completed block is a source of
// many sublayers, so its rstd is computed once (mix_source_rstd) and passed in.
#pragma once
#include "core/span.h"
#include "core/tensor.h"

namespace attnres::kernels {

// rstd [N] of a source v [N, d].
void mix_source_rstd(Tensor& rstd, const Tensor& v, float eps);

// out [N, d]; probs [N, k] (softmax weights, saved for backward); w [d];
// sources: k tensors [N, d]; rstds: k tensors [N]. k >= 1.
void mix_forward(Tensor& out, Tensor& probs, const Tensor& w, Span<const Tensor> sources,
                 Span<const Tensor> rstds);

// dsources[j] += dL/dv_j (including the path through rstd_j), dw += dL/dw.
void mix_backward(Span<Tensor> dsources, Tensor& dw, const Tensor& dout, const Tensor& w,
                  Span<const Tensor> sources, Span<const Tensor> rstds, const Tensor& probs);

}  // namespace attnres::kernels
