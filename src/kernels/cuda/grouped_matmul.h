// CUDA grouped linear layers (see kernels/grouped_matmul.h): every group in
// one cublasGemmGroupedBatchedEx, fp32 accumulation, where the type mix allows.
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
// Whether A/B of type `ab` with C of type `c` run as one grouped call (else a
// GEMM per group): decided on the first ask, fixed for the process, said on
// stderr (grouped_matmul.cu's class Blas).
bool uses_grouped_gemm(DType ab, DType c);
}  // namespace attnres::kernels::cuda
