// SwiGLU dispatcher: argument checks and dtype dispatch.
#include "kernels/swiglu.h"

#include "kernels/common.h"
#include "kernels/cpu/swiglu.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/swiglu.h"
#endif

namespace attnres::kernels {

namespace {

// `t` must be defined, live where `ref` lives, have `ref`'s dtype and shape.
void check_like(const char* op, const char* name, const Tensor& t, const Tensor& ref) {
  if (!t.defined()) fail(op, ": ", name, " is undefined");
  if (t.device() != ref.device())
    fail(op, ": ", name, " is on ", device_name(t.device()), ", expected ", device_name(ref.device()));
  if (t.dtype() != ref.dtype())
    fail(op, ": ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(ref.dtype()));
  if (t.shape() != ref.shape())
    fail(op, ": ", name, " has shape ", shape_str(t.shape()), ", expected ", shape_str(ref.shape()),
         " (the shape of gate)");
}

}  // namespace

void swiglu_forward(Tensor& h, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  if (!gate.defined()) fail(op, ": gate is undefined");
  check_like(op, "up", up, gate);
  check_like(op, "h", h, gate);
  ATTNRES_CUDA_DISPATCH(gate, op, cuda::swiglu_forward(h, gate, up));
  dispatch_cpu_float(gate, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_forward<T>(h.data<T>(), gate.data<T>(), up.data<T>(), gate.numel());
  });
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dh, const Tensor& gate,
                     const Tensor& up) {
  const char* op = "swiglu_backward";
  if (!gate.defined()) fail(op, ": gate is undefined");
  check_like(op, "up", up, gate);
  check_like(op, "dh", dh, gate);
  check_like(op, "dgate", dgate, gate);
  check_like(op, "dup", dup, gate);
  ATTNRES_CUDA_DISPATCH(gate, op, cuda::swiglu_backward(dgate, dup, dh, gate, up));
  dispatch_cpu_float(gate, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_backward<T>(dgate.data<T>(), dup.data<T>(), dh.data<T>(), gate.data<T>(),
                            up.data<T>(), gate.numel());
  });
}

}  // namespace attnres::kernels
