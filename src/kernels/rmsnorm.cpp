// RMSNorm dispatcher: argument checks and dtype dispatch.
#include "kernels/rmsnorm.h"

#include "kernels/common.h"
#include "kernels/cpu/rmsnorm.h"

namespace attnres::kernels {

namespace {

// `t` must be defined, live where `ref` lives, have `ref`'s dtype and `shape`.
void check_arg(const char* op, const char* name, const Tensor& t, const Tensor& ref,
               const Shape& shape) {
  if (!t.defined()) fail(op, ": ", name, " is undefined");
  if (t.device() != ref.device())
    fail(op, ": ", name, " is on ", device_name(t.device()), ", expected ", device_name(ref.device()));
  if (t.dtype() != ref.dtype())
    fail(op, ": ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(ref.dtype()));
  if (t.shape() != shape)
    fail(op, ": ", name, " has shape ", shape_str(t.shape()), ", expected ", shape_str(shape));
}

void check_2d(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail(op, ": ", name, " is undefined");
  if (t.ndim() != 2) fail(op, ": ", name, " must be 2-D [N, d], got ", shape_str(t.shape()));
}

}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor* gain, float eps) {
  const char* op = "rmsnorm_forward";
  check_2d(op, "x", x);
  const int64_t N = x.dim(0), d = x.dim(1);
  check_arg(op, "y", y, x, {N, d});
  check_arg(op, "rstd", rstd, x, {N});
  if (gain) check_arg(op, "gain", *gain, x, {d});
  if (!(eps >= 0)) fail(op, ": eps must be >= 0, got ", eps);
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_forward<T>(y.data<T>(), rstd.data<T>(), x.data<T>(),
                            gain ? gain->data<T>() : nullptr, N, d, static_cast<T>(eps));
  });
}

void rmsnorm_backward(Tensor& dx, Tensor* dgain, const Tensor& dy, const Tensor& x,
                      const Tensor& rstd, const Tensor* gain) {
  const char* op = "rmsnorm_backward";
  check_2d(op, "x", x);
  const int64_t N = x.dim(0), d = x.dim(1);
  check_arg(op, "dx", dx, x, {N, d});
  check_arg(op, "dy", dy, x, {N, d});
  check_arg(op, "rstd", rstd, x, {N});
  if (gain) check_arg(op, "gain", *gain, x, {d});
  // Without a gain there is no dL/dgain to produce (see the header).
  const bool want_dgain = gain && dgain;
  if (want_dgain) check_arg(op, "dgain", *dgain, x, {d});
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_backward<T>(dx.data<T>(), want_dgain ? dgain->data<T>() : nullptr, dy.data<T>(),
                             x.data<T>(), rstd.data<T>(), gain ? gain->data<T>() : nullptr, N, d);
  });
}

}  // namespace attnres::kernels
