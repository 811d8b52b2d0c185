// Reduction / elementwise dispatchers: argument checks and dtype dispatch.
#include "kernels/reduce.h"

#include "kernels/common.h"
#include "kernels/cpu/reduce.h"

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
  double result = 0;
  dispatch_cpu_float(x, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    result = cpu::sum_squares<T>(x.data<T>(), x.numel());
  });
  return result;
}

void scale_(Tensor& x, double s) {
  dispatch_cpu_float(x, "scale_", [&](auto tag) {
    using T = decltype(tag);
    cpu::scale_<T>(x.data<T>(), x.numel(), static_cast<T>(s));
  });
}

void add_(Tensor& y, const Tensor& x) {
  if (!y.defined()) fail("add_: y is undefined");
  check_like("add_", "x", x, "y", y);
  dispatch_cpu_float(y, "add_", [&](auto tag) {
    using T = decltype(tag);
    cpu::add_<T>(y.data<T>(), x.data<T>(), y.numel());
  });
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  if (!a.defined()) fail("add: a is undefined");
  check_like("add", "b", b, "a", a);
  check_like("add", "out", out, "a", a);
  dispatch_cpu_float(a, "add", [&](auto tag) {
    using T = decltype(tag);
    cpu::add<T>(out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

bool all_finite(const Tensor& x) {
  bool result = true;
  dispatch_cpu_float(x, "all_finite", [&](auto tag) {
    using T = decltype(tag);
    result = cpu::all_finite<T>(x.data<T>(), x.numel());
  });
  return result;
}

}  // namespace attnres::kernels
