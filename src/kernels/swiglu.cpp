// SwiGLU dispatcher: argument checks and dtype dispatch.
#include "kernels/swiglu.h"

#include "kernels/common.h"
#include "kernels/cpu/swiglu.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/swiglu.h"
#endif

namespace attnres::kernels {

void swiglu_forward(Tensor& h, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  if (!gate.defined()) fail(op, ": gate is undefined");
  check_arg(op, "up", up, gate, gate.shape());
  check_arg(op, "h", h, gate, gate.shape());
  ATTNRES_CUDA_DISPATCH(gate, op, cuda::swiglu_forward(h, gate, up));
  dispatch_cpu_float(gate, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_forward<T>(h.data<T>(), gate.data<T>(), up.data<T>(), gate.numel());
  });
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dh, const Tensor& gate,
                     const Tensor& up, Store store) {
  const char* op = "swiglu_backward";
  if (!gate.defined()) fail(op, ": gate is undefined");
  check_arg(op, "up", up, gate, gate.shape());
  check_arg(op, "dh", dh, gate, gate.shape());
  check_arg(op, "dgate", dgate, gate, gate.shape());
  check_arg(op, "dup", dup, gate, gate.shape());
  ATTNRES_CUDA_DISPATCH(gate, op, cuda::swiglu_backward(dgate, dup, dh, gate, up, store));
  dispatch_cpu_float(gate, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_backward<T>(dgate.data<T>(), dup.data<T>(), dh.data<T>(), gate.data<T>(),
                            up.data<T>(), gate.numel(), store == Store::Add);
  });
}

}  // namespace attnres::kernels
