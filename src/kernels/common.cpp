#include "kernels/common.h"

namespace attnres::kernels {

void check_arg(const char* op, const char* name, const Tensor& t, Device device, DType dtype,
               const Shape& shape) {
  if (!t.defined()) fail(op, ": ", name, " is undefined");
  if (t.device() != device)
    fail(op, ": ", name, " is on ", device_name(t.device()), ", expected ", device_name(device));
  if (t.dtype() != dtype)
    fail(op, ": ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(dtype));
  if (t.shape() != shape)
    fail(op, ": ", name, " has shape ", shape_str(t.shape()), ", expected ", shape_str(shape));
}

void check_2d(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail(op, ": ", name, " is undefined");
  if (t.ndim() != 2) fail(op, ": ", name, " must be 2-D, got ", shape_str(t.shape()));
}

void fail_no_cuda(const char* op) {
  fail(op, ": CUDA tensor, but this build has no CUDA backend");
}

}  // namespace attnres::kernels
