// Reduction / elementwise dispatchers: argument checks and dtype dispatch.
#include "kernels/reduce.h"

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/cpu/reduce.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/reduce.h"
#endif

namespace attnres::kernels {

namespace {

// `t` must be defined, live where `ref` lives, have `ref`'s dtype and shape.
void check_like(const char* op, const char* name, const Tensor& t, const char* ref_name,
                const Tensor& ref) {
  if (!t.defined()) fail(op, ": ", name, " is undefined");
  if (t.device() != ref.device())
    fail(op, ": ", name, " is on ", device_name(t.device()), ", ", ref_name, " on ",
         device_name(ref.device()));
  if (t.dtype() != ref.dtype())
    fail(op, ": ", name, " is ", dtype_name(t.dtype()), ", ", ref_name, " is ",
         dtype_name(ref.dtype()));
  if (t.shape() != ref.shape())
    fail(op, ": ", name, " has shape ", shape_str(t.shape()), ", ", ref_name, " has ",
         shape_str(ref.shape()));
}

}  // namespace

double sum_squares(const Tensor& x) {
  if (!x.defined()) fail("sum_squares: x is undefined");
  ATTNRES_CUDA_DISPATCH(x, "sum_squares", cuda::sum_squares(x));
  double result = 0;
  dispatch_cpu_float(x, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    result = cpu::sum_squares<T>(x.data<T>(), x.numel());
  });
  return result;
}

std::vector<double> sum_squares_each(Span<const Tensor> xs) {
  const char* op = "sum_squares_each";
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].defined()) fail(op, ": tensor ", i, " is undefined");
    if (xs[i].device() != xs[0].device()) fail(op, ": tensors on different devices");
  }
  if (!xs.empty()) ATTNRES_CUDA_DISPATCH(xs[0], op, cuda::sum_squares_each(xs));
  std::vector<double> out;
  for (const Tensor& x : xs) out.push_back(sum_squares(x));
  return out;
}

void scale_(Tensor& x, double s) {
  if (!x.defined()) fail("scale_: x is undefined");
  ATTNRES_CUDA_DISPATCH(x, "scale_", cuda::scale_(x, s));
  dispatch_cpu_float(x, "scale_", [&](auto tag) {
    using T = decltype(tag);
    cpu::scale_<T>(x.data<T>(), x.numel(), static_cast<T>(s));
  });
}

void add_(Tensor& y, const Tensor& x) {
  if (!y.defined()) fail("add_: y is undefined");
  check_like("add_", "x", x, "y", y);
  ATTNRES_CUDA_DISPATCH(y, "add_", cuda::add_(y, x));
  dispatch_cpu_float(y, "add_", [&](auto tag) {
    using T = decltype(tag);
    cpu::add_<T>(y.data<T>(), x.data<T>(), y.numel());
  });
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  if (!a.defined()) fail("add: a is undefined");
  check_like("add", "b", b, "a", a);
  check_like("add", "out", out, "a", a);
  ATTNRES_CUDA_DISPATCH(a, "add", cuda::add(out, a, b));
  dispatch_cpu_float(a, "add", [&](auto tag) {
    using T = decltype(tag);
    cpu::add<T>(out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

bool all_finite(const Tensor& x) {
  if (!x.defined()) fail("all_finite: x is undefined");
  ATTNRES_CUDA_DISPATCH(x, "all_finite", cuda::all_finite(x));
  bool result = true;
  dispatch_cpu_float(x, "all_finite", [&](auto tag) {
    using T = decltype(tag);
    result = cpu::all_finite<T>(x.data<T>(), x.numel());
  });
  return result;
}

void convert(Tensor& dst, const Tensor& src) {
  const char* op = "convert";
  if (!src.defined()) fail(op, ": src is undefined");
  check_arg(op, "dst", dst, src.device(), dst.dtype(), src.shape());
  if (dst.dtype() == src.dtype()) {
    dst.copy_from(src);
    return;
  }
  ATTNRES_CUDA_DISPATCH(src, op, cuda::convert(dst, src));
  dst.copy_from(src.to(dst.dtype()));
}

}  // namespace attnres::kernels
