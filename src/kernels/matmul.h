// Linear layer without bias: y = x W^T with W in [out, in] layout.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// w_row_blocks (optional, summing to W's N rows): W's rows as stacked
// matrices, e.g. the joint [Wq; Wk; Wv] (model/attention.cpp). The GPU runs one GEMM per
// product either way. The CPU runs one per block, into y's (dy's) column
// block and W's (dw's) row block, with dx summed block after block (the
// first block written or added as dx_store says, the others added): the bits
// of one GEMM per projection, as the CPU computed before the projections were
// joined and as its published results were made (README, docs/sweeps.md).
// One GEMM over all of W rounds differently (dx sums N terms at once) and,
// with some of OpenBLAS's kernels, even y and dw do (other tile edges).

// y [M, N] = x [M, K] W[N, K]^T (+ residual [M, N]). The residual may be y
// itself (accumulate) or another tensor: then on the GPU it is added in the
// GEMM's epilogue (read once, one rounding) instead of by a separate pass.
// On the CPU the product is rounded first and then added to, as by add_.
void matmul_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* residual = nullptr,
                    const std::vector<int64_t>& w_row_blocks = {});

// dx [M, K] += dy W (dx_store Set: dx = dy W); dw [N, K] += dy^T x. Either
// gradient may be nullptr.
void matmul_backward(Tensor* dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                     Store dx_store = Store::Add, const std::vector<int64_t>& w_row_blocks = {});

}  // namespace attnres::kernels
