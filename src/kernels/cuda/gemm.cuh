// One row-major GEMM through cuBLASLt, shared by the CUDA matmul and the fused
// LM-head cross-entropy (kernels/cuda/matmul.cu, cross_entropy.cu).
//
//   C[m, n] = op(A) op(B) + beta * C_in     op(X) = X, or X^T when trans_x
//
// C_in is C itself (accumulate in place) unless c_in is given: then the GEMM
// reads C_in (same dtype and layout as C) and writes C, e.g. a residual added
// in the epilogue, y = x W^T + r, without a separate pass.
// A is stored row-major as [m, k] (or [k, m] when trans_a) with row stride
// lda, B as [k, n] (or [n, k] when trans_b) with row stride ldb, C as [m, n]
// with row stride ldc; strides are in elements. A and B share one dtype (F32
// or BF16); C is that dtype or F32 (BF16 inputs, fp32 gradients). Arithmetic
// is always fp32 (CUBLAS_COMPUTE_32F: for F32 inputs this is true fp32, never
// TF32). beta is 0 (overwrite) or 1 (accumulate). Runs on the compute stream,
// deterministically (fixed algorithm per shape; split-K reductions, if any,
// go through the library's own workspace in a fixed order).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace attnres::kernels::cuda {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab_type,
          const void* a, int64_t lda, const void* b, int64_t ldb, float beta, DType c_type,
          void* c, int64_t ldc, const void* c_in = nullptr);

}  // namespace attnres::kernels::cuda
