// AdamW dispatcher: argument and hyper-parameter checks, dtype dispatch.
#include "kernels/adamw.h"

#include <cmath>

#include "kernels/common.h"
#include "kernels/cpu/adamw.h"
#include "kernels/reduce.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/adamw.h"
#endif

namespace attnres::kernels {

void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& step,
                  bool decay, Tensor* p_lowp) {
  const char* op = "adamw_update";
  if (!p.defined()) fail(op, ": p is undefined");
  check_arg(op, "g", g, p, p.shape());
  check_arg(op, "m", m, p, p.shape());
  check_arg(op, "v", v, p, p.shape());
  if (step.t < 1) fail(op, ": step t must be >= 1 (bias correction), got ", step.t);
  if (!(step.beta1 >= 0 && step.beta1 < 1)) fail(op, ": beta1 must be in [0, 1), got ", step.beta1);
  if (!(step.beta2 >= 0 && step.beta2 < 1)) fail(op, ": beta2 must be in [0, 1), got ", step.beta2);
  if (!(step.lr >= 0)) fail(op, ": lr must be >= 0, got ", step.lr);
  if (!(step.eps >= 0)) fail(op, ": eps must be >= 0, got ", step.eps);
  if (!(step.weight_decay >= 0)) fail(op, ": weight_decay must be >= 0, got ", step.weight_decay);
  if (!std::isfinite(step.grad_scale)) fail(op, ": grad_scale must be finite, got ", step.grad_scale);
  if (p_lowp) check_arg(op, "p_lowp", *p_lowp, p.device(), DType::BF16, p.shape());

  // Per-step scalars in double, rounded once to the tensor's type.
  const double bc1 = 1.0 - std::pow(step.beta1, static_cast<double>(step.t));
  const double bc2 = 1.0 - std::pow(step.beta2, static_cast<double>(step.t));
  const double decay_factor = decay ? 1.0 - step.lr * step.weight_decay : 1.0;
  ATTNRES_CUDA_DISPATCH(p, op, cuda::adamw_update(p, g, m, v, step.lr, step.beta1, step.beta2,
                                                  step.eps, decay_factor, bc1, bc2,
                                                  step.grad_scale, p_lowp));
  dispatch_cpu_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::adamw_update<T>(p.data<T>(), g.data<T>(), m.data<T>(), v.data<T>(), p.numel(),
                         static_cast<T>(step.lr), static_cast<T>(step.beta1),
                         static_cast<T>(step.beta2), static_cast<T>(step.eps),
                         static_cast<T>(decay_factor), static_cast<T>(bc1), static_cast<T>(bc2),
                         static_cast<T>(step.grad_scale));
  });
  if (p_lowp) convert(*p_lowp, p);
}

}  // namespace attnres::kernels
