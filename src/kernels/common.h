// Helpers shared by the kernel dispatchers.
#pragma once
#include "core/tensor.h"

namespace attnres::kernels {

// Run `fn` with the C++ scalar type matching the tensor's floating dtype
// (float or double). Throws for other dtypes and for non-CPU tensors until the
// CUDA backend lands.
template <typename Fn>
void dispatch_cpu_float(const Tensor& t, const char* op, Fn&& fn) {
  ATTNRES_CHECK(t.defined(), op, ": undefined tensor");
  if (!t.is_cpu()) fail(op, ": no ", device_name(t.device()), " implementation in this build");
  switch (t.dtype()) {
    case DType::F32: fn(float{}); return;
    case DType::F64: fn(double{}); return;
    default: fail(op, ": unsupported dtype ", dtype_name(t.dtype()));
  }
}

}  // namespace attnres::kernels
