// AdamW tests' shared check (tests/kernels/test_adamw.cpp on the CPU,
// tests/gpu/test_adamw.cpp on the GPU): a step's grad_scale is the same as
// scaling the gradient first.
#pragma once
#include <catch2/catch.hpp>

#include "core/tensor.h"
#include "kernels/adamw.h"
#include "kernels/reduce.h"
#include "testing.h"

namespace attnres::testing {

// Gradient clipping folds its factor into the update (s.grad_scale) instead
// of a scale_ pass over the gradients: both must give the same bits of p, m
// and v. p0, g0, m0, v0 (v0 >= 0) on one device, left as they are: the
// updates run on copies. Returns p after the update.
inline Tensor check_grad_scale_folds(const Tensor& p0, const Tensor& g0, const Tensor& m0,
                                     const Tensor& v0, const kernels::AdamWStep& s) {
  Tensor p1 = p0.clone(), m1 = m0.clone(), v1 = v0.clone();
  kernels::adamw_update(p1, g0, m1, v1, s, true);
  Tensor p2 = p0.clone(), m2 = m0.clone(), v2 = v0.clone(), g2 = g0.clone();
  kernels::scale_(g2, s.grad_scale);
  kernels::AdamWStep s2 = s;
  s2.grad_scale = 1.0;
  kernels::adamw_update(p2, g2, m2, v2, s2, true);
  REQUIRE(same_bits(p1, p2));
  REQUIRE(same_bits(m1, m2));
  REQUIRE(same_bits(v1, v2));
  return p1;
}

}  // namespace attnres::testing
