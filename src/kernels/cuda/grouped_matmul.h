// CUDA grouped linear layers (see kernels/grouped_matmul.h): every group in
// one cublasGemmGroupedBatchedEx, fp32 accumulation.
#pragma once
#include <cstdint>
#include <vector>

#include "core/span.h"
#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels::cuda {
void grouped_matmul_forward(Tensor& y, const Tensor& x, Span<const Tensor> w,
                            const std::vector<int64_t>& offsets);
void grouped_matmul_backward(Tensor* dx, Span<Tensor> dw, const Tensor& dy, const Tensor& x,
                             Span<const Tensor> w, const std::vector<int64_t>& offsets,
                             Store dx_store);
}  // namespace attnres::kernels::cuda
