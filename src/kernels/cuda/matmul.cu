// CUDA linear layer: y = x W^T and its two gradients, each one cuBLASLt GEMM
// (kernels/cuda/gemm.cu: column-major mapping, plan cache, fp32 compute).
//
// No custom kernel: a tensor-core GEMM is compute-bound at these shapes and
// cuBLASLt is at the hardware's roofline; writing our own would only lose.
// The work is 2 M N K FLOPs per GEMM (forward; dx and dw each the same), and
// the bytes are the three operands once (plus C_in, the residual or y itself,
// read once when the epilogue adds it).
//
// Dtypes: F32 tensors compute in true fp32 (no TF32), matching the CPU to
// ~1e-6. BF16 tensors use bf16 tensor cores with fp32 accumulation; dw is F32
// (kernels::grad_dtype) and accumulated by the GEMM epilogue (beta = 1), so
// summing over micro-batches never rounds to bf16.
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/matmul.h"

namespace attnres::kernels::cuda {

void matmul_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* residual) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  // y[M, N] = x[M, K] w[N, K]^T + residual, the residual read by the epilogue
  // (K == 0: y = 0, or the residual)
  gemm(false, true, M, N, K, x.dtype(), x.raw(), K, w.raw(), K, residual ? 1.0f : 0.0f,
       y.dtype(), y.raw(), N, residual ? residual->raw() : nullptr);
}

void matmul_backward(Tensor* dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                     Store dx_store) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  // M or K == 0: the gradients are empty tensors (gemm returns early on empty
  // outputs). N == 0: they are empty sums, so dw += 0 is nothing to do, while
  // dx = 0 is the K == 0 case of gemm (it zeroes C when beta == 0).
  // dx[M, K] (+)= dy[M, N] w[N, K]
  if (dx) gemm(false, false, M, K, N, x.dtype(), dy.raw(), N, w.raw(), K,
               dx_store == Store::Add ? 1.0f : 0.0f, dx->dtype(), dx->raw(), K);
  if (N == 0) return;
  // dw[N, K] += dy[M, N]^T x[M, K]   (F32 for BF16 x/w)
  if (dw) gemm(true, false, N, K, M, x.dtype(), dy.raw(), N, x.raw(), K, 1.0f, dw->dtype(),
               dw->raw(), K);
}

}  // namespace attnres::kernels::cuda
