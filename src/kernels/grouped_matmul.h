// Grouped linear layers: G weight matrices, each applied to its own
// consecutive rows of x (a MoE layer's routed experts, model/moe.cpp). Group g
// is rows [offsets[g], offsets[g + 1]) of x, y, dx and dy, and W_g its
// weight [N, K]; every W_g has the same shape.
//
// The CPU runs one matmul per group (kernels/matmul.h; so a MoE layer's
// numbers are those of the per-expert GEMMs). CUDA runs all groups as one
// grouped GEMM (cuBLAS's cublasGemmGroupedBatchedEx: one launch for the
// layer instead of one per expert, and no per-shape plan, while a dropless
// layer's group sizes change every step), falling back to a GEMM per group
// where cuBLAS does not take the grouped call (see kernels/cuda/grouped_matmul.cu).
// Empty groups are skipped.
#pragma once
#include <cstdint>
#include <vector>

#include "core/span.h"
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// y [M, N]: group g's rows = x's rows W_g^T (x [M, K]).
void grouped_matmul_forward(Tensor& y, const Tensor& x, Span<const Tensor> w,
                            const std::vector<int64_t>& offsets);

// dx [M, K]: group g's rows = dy's rows W_g (dx_store Set) or += (Add);
// dw[g] [N, K] += dy's rows^T x's rows. dx or dw (all of them) may be absent
// (nullptr, empty span).
void grouped_matmul_backward(Tensor* dx, Span<Tensor> dw, const Tensor& dy, const Tensor& x,
                             Span<const Tensor> w, const std::vector<int64_t>& offsets,
                             Store dx_store);

}  // namespace attnres::kernels
