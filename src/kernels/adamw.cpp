// AdamW dispatcher: argument and hyper-parameter checks, dtype dispatch.
#include "kernels/adamw.h"

#include <cmath>

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/cpu/adamw.h"
#include "kernels/reduce.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/adamw.h"
#endif

namespace attnres::kernels {

namespace {

void check_step(const char* op, const AdamWStep& step) {
  if (step.t < 1) fail(op, ": step t must be >= 1 (bias correction), got ", step.t);
  if (!(step.beta1 >= 0 && step.beta1 < 1)) fail(op, ": beta1 must be in [0, 1), got ", step.beta1);
  if (!(step.beta2 >= 0 && step.beta2 < 1)) fail(op, ": beta2 must be in [0, 1), got ", step.beta2);
  if (!(step.lr >= 0)) fail(op, ": lr must be >= 0, got ", step.lr);
  if (!(step.eps >= 0)) fail(op, ": eps must be >= 0, got ", step.eps);
  if (!(step.weight_decay >= 0)) fail(op, ": weight_decay must be >= 0, got ", step.weight_decay);
  if (!std::isfinite(step.grad_scale)) fail(op, ": grad_scale must be finite, got ", step.grad_scale);
}

void check_tensors(const char* op, const AdamWTensors& t) {
  if (!t.p || !t.p->defined()) fail(op, ": p is undefined");
  if (!t.g || !t.m || !t.v) fail(op, ": g, m and v are required");
  check_arg(op, "g", *t.g, *t.p, t.p->shape());
  check_arg(op, "m", *t.m, *t.p, t.p->shape());
  check_arg(op, "v", *t.v, *t.p, t.p->shape());
  if (t.p_lowp) check_arg(op, "p_lowp", *t.p_lowp, t.p->device(), DType::BF16, t.p->shape());
}

AdamWScalars adamw_scalars(const AdamWStep& step) {
  // Per-step scalars in double, rounded once to the tensor's type by the kernels.
  const double t = static_cast<double>(step.t);
  return {{step.lr, step.beta1, 1.0 - step.beta1, step.beta2, 1.0 - step.beta2, step.eps,
           1.0 - std::pow(step.beta1, t), 1.0 - std::pow(step.beta2, t)},
          1.0 - step.lr * step.weight_decay};
}

}  // namespace

void adamw_update_each(Span<const AdamWTensors> params, const AdamWStep& step) {
  const char* op = "adamw_update";
  check_step(op, step);
  for (const AdamWTensors& t : params) {
    check_tensors(op, t);
    if (t.p->device() != params[0].p->device()) fail(op, ": parameters on different devices");
  }
  if (params.empty()) return;
  const AdamWScalars sc = adamw_scalars(step);
  ATTNRES_CUDA_DISPATCH(*params[0].p, op, cuda::adamw_update_each(params, step, sc));
  for (const AdamWTensors& t : params) {
    dispatch_cpu_float(*t.p, op, [&](auto tag) {
      using T = decltype(tag);
      cpu::adamw_update<T>(t.p->data<T>(), t.g->data<T>(), t.m->data<T>(), t.v->data<T>(),
                           t.p->numel(), sc.as<T>(),
                           static_cast<T>(t.decay ? sc.decay_factor : 1.0),
                           static_cast<T>(step.grad_scale));
    });
    if (t.p_lowp) convert(*t.p_lowp, *t.p);
  }
}

void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& step,
                  bool decay, Tensor* p_lowp) {
  const AdamWTensors t{&p, &g, &m, &v, decay, p_lowp};
  adamw_update_each(Span<const AdamWTensors>(&t, 1), step);
}

}  // namespace attnres::kernels
