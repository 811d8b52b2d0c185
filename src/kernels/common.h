// Helpers shared by the kernel dispatchers (the <op>.cpp files): argument
// checks, the dtype conventions of mixed precision, and device dispatch.
//
// Every op's public function checks its arguments once, here on the host,
// then runs cpu::<op> (float / double) or, for CUDA tensors, cuda::<op>
// (float / bf16) with the same signature.
#pragma once
#include "core/tensor.h"

namespace attnres::kernels {

// Dtype conventions (docs/model.md section 4, mixed precision):
// - statistics saved for backward (RMS rstd, Mix softmax weights, attention
//   log-sum-exp) are fp32 for fp32 and bf16 activations (fp64 in fp64 tests);
// - parameter gradients are fp32 when the weights are bf16 (they are summed
//   over microbatches and fed to the fp32 optimizer), else the weights' dtype.
inline DType stat_dtype(DType activations) {
  return activations == DType::F64 ? DType::F64 : DType::F32;
}
inline DType grad_dtype(DType weights) { return weights == DType::BF16 ? DType::F32 : weights; }

// `t` must be defined, on `device`, of `dtype` and `shape`; the error names
// the op and the argument.
void check_arg(const char* op, const char* name, const Tensor& t, Device device, DType dtype,
               const Shape& shape);
// Same, with device and dtype taken from `ref`.
inline void check_arg(const char* op, const char* name, const Tensor& t, const Tensor& ref,
                      const Shape& shape) {
  check_arg(op, name, t, ref.device(), ref.dtype(), shape);
}
// `t` must be defined and 2-D.
void check_2d(const char* op, const char* name, const Tensor& t);

[[noreturn]] void fail_no_cuda(const char* op);

// Run `fn` with the C++ scalar type matching a CPU tensor's floating dtype
// (float or double).
template <typename Fn>
void dispatch_cpu_float(const Tensor& t, const char* op, Fn&& fn) {
  ATTNRES_CHECK(t.defined(), op, ": undefined tensor");
  if (!t.is_cpu()) fail(op, ": ", device_name(t.device()), " tensor reached the CPU kernel");
  switch (t.dtype()) {
    case DType::F32: fn(float{}); return;
    case DType::F64: fn(double{}); return;
    default: fail(op, ": the CPU kernels take F32 or F64, got ", dtype_name(t.dtype()));
  }
}

}  // namespace attnres::kernels
