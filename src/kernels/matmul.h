// Linear layer without bias: y = x W^T with W in [out, in] layout.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// y [M, N] = x [M, K] W[N, K]^T (+ residual [M, N]). The residual may be y
// itself (accumulate) or another tensor: then on the GPU it is added in the
// GEMM's epilogue (read once, one rounding) instead of by a separate pass.
// On the CPU the product is rounded first and then added to, as by add_.
void matmul_forward(Tensor& y, const Tensor& x, const Tensor& w,
                    const Tensor* residual = nullptr);

// dx [M, K] += dy W (dx_store Set: dx = dy W); dw [N, K] += dy^T x. Either
// gradient may be nullptr.
// w_row_blocks (optional, summing to N): W's rows as stacked matrices, the
// joint [Wq; Wk; Wv] (model.cpp). The GPU computes dx with one GEMM either
// way. The CPU sums dx one block at a time (the first block written or added
// as dx_store says, the others added), which gives the bits of one GEMM per
// projection: what the CPU computed before the projections were joined, and
// what its published results were made with (README, docs/sweeps.md); one
// GEMM over all N rounds differently.
void matmul_backward(Tensor* dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                     Store dx_store = Store::Add, const std::vector<int64_t>& w_row_blocks = {});

}  // namespace attnres::kernels
