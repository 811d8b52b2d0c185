// RMSNorm dispatcher: argument checks and dtype dispatch.
#include "kernels/rmsnorm.h"

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/cpu/rmsnorm.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/rmsnorm.h"
#endif

namespace attnres::kernels {

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor* gain, float eps) {
  const char* op = "rmsnorm_forward";
  check_2d(op, "x", x);
  const int64_t N = x.dim(0), d = x.dim(1);
  check_arg(op, "y", y, x, {N, d});
  check_arg(op, "rstd", rstd, x.device(), stat_dtype(x.dtype()), {N});
  if (gain) check_arg(op, "gain", *gain, x, {d});
  if (!(eps >= 0)) fail(op, ": eps must be >= 0, got ", eps);
  ATTNRES_CUDA_DISPATCH(x, op, cuda::rmsnorm_forward(y, rstd, x, gain, eps));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_forward<T>(y.data<T>(), rstd.data<T>(), x.data<T>(),
                            gain ? gain->data<T>() : nullptr, N, d, static_cast<T>(eps));
  });
}

void rmsnorm_backward(Tensor& dx, Tensor* dgain, const Tensor& dy, const Tensor& x,
                      const Tensor& rstd, const Tensor* gain, Store dx_store) {
  const char* op = "rmsnorm_backward";
  check_2d(op, "x", x);
  const int64_t N = x.dim(0), d = x.dim(1);
  check_arg(op, "dx", dx, x, {N, d});
  check_arg(op, "dy", dy, x, {N, d});
  check_arg(op, "rstd", rstd, x.device(), stat_dtype(x.dtype()), {N});
  if (gain) check_arg(op, "gain", *gain, x, {d});
  // Without a gain there is no dL/dgain to produce (see the header).
  const bool want_dgain = gain && dgain;
  if (want_dgain) check_arg(op, "dgain", *dgain, x.device(), grad_dtype(x.dtype()), {d});
  ATTNRES_CUDA_DISPATCH(x, op, cuda::rmsnorm_backward(dx, want_dgain ? dgain : nullptr, dy, x, rstd, gain, dx_store));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_backward<T>(dx.data<T>(), want_dgain ? dgain->data<T>() : nullptr, dy.data<T>(),
                             x.data<T>(), rstd.data<T>(), gain ? gain->data<T>() : nullptr, N, d,
                             dx_store == Store::Add);
  });
}

}  // namespace attnres::kernels
