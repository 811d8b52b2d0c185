// AdamW with PyTorch semantics (docs/model.md section 4): one tensor (adamw_update)
// or a list of them (adamw_update_each).
#pragma once
#include <cstdint>

#include "core/span.h"
#include "core/tensor.h"
#include "kernels/math.h"

namespace attnres::kernels {

struct AdamWStep {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t t;  // 1-based step number, for bias correction
  // g is used as g * grad_scale (the factor rounded to the tensor's type, as
  // scale_ would round it): gradient clipping without a pass of its own.
  double grad_scale = 1.0;
};

// p *= (1 - lr*wd) if decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). p, g, m, v same shape
// and dtype. Mixed precision: p is the fp32 master copy and `p_lowp`, if given,
// receives p rounded to bf16 (the weights the model computes with) in the
// same pass.
void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& step,
                  bool decay, Tensor* p_lowp = nullptr);

// The per-step scalars of an update, in double (the kernels round them once to
// their type, math::AdamWCoeffs): lr, the betas and 1 - beta, eps, the bias
// corrections 1 - beta^t, and the decay factor 1 - lr wd.
struct AdamWScalars {
  math::AdamWCoeffs<double> k;
  double decay_factor;
  // Rounded to T, each once.
  template <typename T>
  math::AdamWCoeffs<T> as() const {
    return {T(k.lr), T(k.b1), T(k.c1), T(k.b2), T(k.c2), T(k.eps), T(k.bc1), T(k.bc2)};
  }
};

// One parameter's tensors for adamw_update_each (p_lowp may be null).
struct AdamWTensors {
  Tensor* p;
  const Tensor* g;
  Tensor* m;
  Tensor* v;
  bool decay;
  Tensor* p_lowp;
};

// adamw_update for every entry, the same results as one call each; on a GPU
// many small parameters share a launch (an optimizer step updates ~100
// tensors, most of them tiny 1-D gains and queries).
void adamw_update_each(Span<const AdamWTensors> params, const AdamWStep& step);

}  // namespace attnres::kernels
