// SwiGLU dispatcher: argument checks and dtype dispatch.
#include "kernels/swiglu.h"

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/cpu/swiglu.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/swiglu.h"
#endif

namespace attnres::kernels {

namespace {
// gu must be [N, 2F]; returns F.
int64_t half_width(const char* op, const Tensor& gu) {
  check_2d(op, "gu", gu);
  if (gu.dim(1) % 2 != 0)
    fail(op, ": gu has shape ", shape_str(gu.shape()), ", expected [N, 2F] (gate | up)");
  return gu.dim(1) / 2;
}
}  // namespace

void swiglu_forward(Tensor& h, const Tensor& gu) {
  const char* op = "swiglu_forward";
  const int64_t F = half_width(op, gu), N = gu.dim(0);
  check_arg(op, "h", h, gu, {N, F});
  ATTNRES_CUDA_DISPATCH(gu, op, cuda::swiglu_forward(h, gu));
  dispatch_cpu_float(gu, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_forward<T>(h.data<T>(), gu.data<T>(), N, F);
  });
}

void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, Store store) {
  const char* op = "swiglu_backward";
  const int64_t F = half_width(op, gu), N = gu.dim(0);
  check_arg(op, "dh", dh, gu, {N, F});
  check_arg(op, "dgu", dgu, gu, gu.shape());
  ATTNRES_CUDA_DISPATCH(gu, op, cuda::swiglu_backward(dgu, dh, gu, store));
  dispatch_cpu_float(gu, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_backward<T>(dgu.data<T>(), dh.data<T>(), gu.data<T>(), N, F, store == Store::Add);
  });
}

}  // namespace attnres::kernels
