// AdamW against the PyTorch formulation written out by hand, for two steps
// (bias correction) with decay on and off; precision and errors.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "adamw_testing.h"
#include "kernels/adamw.h"
#include "kernels/reduce.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

// torch.optim.AdamW's single-tensor step, transcribed:
//   param.mul_(1 - lr * wd)
//   exp_avg.lerp_(grad, 1 - b1); exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
//   denom = (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-lr / bc1)
void torch_adamw(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                 std::vector<double>& v, const kern::AdamWStep& s, bool decay) {
  const double bc1 = 1 - std::pow(s.beta1, s.t), bc2 = 1 - std::pow(s.beta2, s.t);
  for (size_t i = 0; i < p.size(); ++i) {
    if (decay) p[i] *= 1 - s.lr * s.weight_decay;
    m[i] = s.beta1 * m[i] + (1 - s.beta1) * g[i];
    v[i] = s.beta2 * v[i] + (1 - s.beta2) * g[i] * g[i];
    const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + s.eps;
    p[i] -= s.lr / bc1 * m[i] / denom;
  }
}


std::vector<double> values(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = at(t, i);
  return out;
}

}  // namespace

TEST_CASE("adamw matches the PyTorch update over two steps", "[kernels]") {
  const int64_t R = 7, C = 3;
  for (bool decay : {true, false}) {
    Tensor p = randn({R, C}, 1);
    Tensor m = Tensor::zeros({R, C}, DType::F64), v = Tensor::zeros({R, C}, DType::F64);
    std::vector<double> rp = values(p), rm(R * C, 0.0), rv(R * C, 0.0);
    for (int64_t t = 1; t <= 2; ++t) {
      Tensor g = randn({R, C}, 10 + t);
      kern::AdamWStep s{1e-2, 0.9, 0.95, 1e-8, 0.1, t};
      kern::adamw_update(p, g, m, v, s, decay);
      torch_adamw(rp, values(g), rm, rv, s, decay);
      // p and m are differences that can cancel: margins scale with their
      // terms (the old weight plus a step of at most ~lr; m's two terms are
      // at most max(|m|, |g|)). v is a positive sum: relative.
      for (int64_t i = 0; i < p.numel(); ++i) {
        REQUIRE(at(p, i) == approx_terms(rp[i], 1e-14, std::fabs(rp[i]) + 10 * s.lr));
        REQUIRE(at(m, i) == approx_terms(rm[i], 1e-14, std::fabs(rm[i]) + std::fabs(at(g, i))));
        REQUIRE(at(v, i) == Approx(rv[i]).epsilon(1e-14));
      }
    }
  }
}

TEST_CASE("adamw first step moves each weight by about lr against the gradient sign",
          "[kernels]") {
  // At t = 1 the bias-corrected ratio m_hat / sqrt(v_hat) is sign(g) (up to eps).
  Tensor p = Tensor::zeros({5}, DType::F64), m = Tensor::zeros({5}, DType::F64);
  Tensor v = Tensor::zeros({5}, DType::F64);
  Tensor g = Tensor::from_vector(std::vector<double>{1.0, -2.0, 0.5, -0.25, 3.0}, {5});
  kern::adamw_update(p, g, m, v, {0.1, 0.9, 0.95, 1e-8, 0.1, 1}, true);
  for (int64_t i = 0; i < 5; ++i) REQUIRE(at(p, i) == Approx(at(g, i) > 0 ? -0.1 : 0.1).epsilon(1e-6));
  // Decay with a zero gradient only shrinks the weight.
  Tensor p2 = Tensor::from_vector(std::vector<double>{2.0}, {1});
  Tensor g0 = Tensor::zeros({1}, DType::F64), m2 = Tensor::zeros({1}, DType::F64);
  Tensor v2 = Tensor::zeros({1}, DType::F64);
  kern::adamw_update(p2, g0, m2, v2, {0.1, 0.9, 0.95, 1e-8, 0.5, 1}, true);
  REQUIRE(at(p2, 0) == Approx(2.0 * (1 - 0.1 * 0.5)).epsilon(1e-15));
}

TEST_CASE("adamw float32 agrees with float64", "[kernels]") {
  const int64_t n = 1001;
  Tensor p = randn({n}, 20), m = Tensor::zeros({n}, DType::F64), v = Tensor::zeros({n}, DType::F64);
  Tensor p32 = p.to(DType::F32), m32 = m.to(DType::F32), v32 = v.to(DType::F32);
  for (int64_t t = 1; t <= 3; ++t) {
    Tensor g = randn({n}, 20 + t);
    kern::AdamWStep s{1e-3, 0.9, 0.95, 1e-8, 0.1, t};
    kern::adamw_update(p, g, m, v, s, true);
    kern::adamw_update(p32, g.to(DType::F32), m32, v32, s, true);
  }
  REQUIRE(scaled_diff(p32, p) < 1e-6);
  REQUIRE(scaled_diff(m32, m) < 1e-6);
  REQUIRE(max_rel_diff(v32, v, 1e-3) < 1e-5);
}

TEST_CASE("adamw's grad_scale equals scaling the gradient first, bit for bit", "[kernels]") {
  // Gradient clipping folds its factor into the update instead of a scale_
  // pass over the gradients: the two must give the same bits.
  for (DType dt : {DType::F32, DType::F64}) {
    const int64_t n = 1000;
    const Tensor p0 = randn({n}, 40, dt), g0 = randn({n}, 41, dt), m0 = randn({n}, 42, dt, 0.1);
    Tensor v0 = randn({n}, 43, dt, 0.1);
    for (int64_t i = 0; i < n; ++i) set(v0, i, at(v0, i) * at(v0, i));
    kern::AdamWStep s{1e-3, 0.9, 0.95, 1e-8, 0.1, 3};
    s.grad_scale = 0.3711;
    const Tensor p1 = check_grad_scale_folds(p0, g0, m0, v0, s);
    REQUIRE(at(p1, 0) != at(p0, 0));
  }
}

TEST_CASE("adamw rejects mismatched tensors and bad steps", "[kernels]") {
  Tensor p = randn({3, 4}, 30), g = randn({3, 4}, 31);
  Tensor m = Tensor::zeros({3, 4}, DType::F64), v = Tensor::zeros({4, 3}, DType::F64);
  kern::AdamWStep s{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
  REQUIRE_THROWS_AS(kern::adamw_update(p, g, m, v, s, true), Error);
  REQUIRE_THROWS_WITH(kern::adamw_update(p, g, m, v, s, true),
                      Catch::Contains("adamw_update: v has shape [4, 3], expected [3, 4]"));
  Tensor v_ok = Tensor::zeros({3, 4}, DType::F64), g32 = g.to(DType::F32);
  REQUIRE_THROWS_WITH(kern::adamw_update(p, g32, m, v_ok, s, true), Catch::Contains("g is F32, expected F64"));
  kern::AdamWStep s0 = s;
  s0.t = 0;
  REQUIRE_THROWS_WITH(kern::adamw_update(p, g, m, v_ok, s0, true), Catch::Contains("step t must be >= 1"));
}
