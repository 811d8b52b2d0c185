// SwiGLU h = silu(gate) * up: forward vs formula, gradients vs finite
// differences, accumulation, precision, errors.
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/swiglu.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

TEST_CASE("swiglu forward matches the formula", "[kernels]") {
  const int64_t N = 7, F = 12;
  Tensor g = randn({N, F}, 1, DType::F64, 3.0), u = randn({N, F}, 2);
  Tensor h = Tensor::empty({N, F}, DType::F64);
  kern::swiglu_forward(h, g, u);
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double x = at(g, i);
    REQUIRE(at(h, i) == Approx(x / (1.0 + std::exp(-x)) * at(u, i)).epsilon(1e-14));
  }
}

TEST_CASE("swiglu backward matches finite differences and accumulates", "[kernels]") {
  const int64_t N = 7, F = 12;
  Tensor g = randn({N, F}, 3, DType::F64, 3.0), u = randn({N, F}, 4), w = randn({N, F}, 5);
  auto loss = [&] {
    Tensor h = Tensor::empty({N, F}, DType::F64);
    kern::swiglu_forward(h, g, u);
    return weighted_sum(h, w);
  };
  Tensor dg = Tensor::zeros({N, F}, DType::F64), du = Tensor::zeros({N, F}, DType::F64);
  kern::swiglu_backward(dg, du, w, g, u);
  // silu' crosses zero near gate = -1.28, where the gradient is tiny and the
  // central difference is mostly rounding noise (~1e-15 |loss| / h): a larger
  // step and an absolute floor keep the check about the formula, not the noise.
  REQUIRE(fd_check(g, dg, loss, 1e-5, 1e-4) < 1e-6);
  REQUIRE(fd_check(u, du, loss) < 1e-6);

  Tensor dg1 = dg.clone(), du1 = du.clone();
  kern::swiglu_backward(dg, du, w, g, u);
  for (int64_t i = 0; i < dg.numel(); ++i) {
    REQUIRE(at(dg, i) == Approx(2 * at(dg1, i)).epsilon(1e-14));
    REQUIRE(at(du, i) == Approx(2 * at(du1, i)).epsilon(1e-14));
  }
}

TEST_CASE("swiglu float32 agrees with float64", "[kernels]") {
  const int64_t N = 33, F = 37;  // 1221 elements: vector tails
  Tensor g = randn({N, F}, 6, DType::F64, 3.0), u = randn({N, F}, 7), dh = randn({N, F}, 8);
  Tensor h = Tensor::empty({N, F}, DType::F64), h32 = Tensor::empty({N, F}, DType::F32);
  Tensor g32 = g.to(DType::F32), u32 = u.to(DType::F32), dh32 = dh.to(DType::F32);
  kern::swiglu_forward(h, g, u);
  kern::swiglu_forward(h32, g32, u32);
  REQUIRE(max_rel_diff(h32, h, 1e-3) < 1e-5);
  Tensor dg = Tensor::zeros({N, F}, DType::F64), du = Tensor::zeros({N, F}, DType::F64);
  Tensor dg32 = Tensor::zeros({N, F}, DType::F32), du32 = Tensor::zeros({N, F}, DType::F32);
  kern::swiglu_backward(dg, du, dh, g, u);
  kern::swiglu_backward(dg32, du32, dh32, g32, u32);
  REQUIRE(max_rel_diff(dg32, dg, 1e-3) < 1e-5);
  REQUIRE(max_rel_diff(du32, du, 1e-3) < 1e-5);
}

TEST_CASE("swiglu rejects mismatched shapes and dtypes", "[kernels]") {
  Tensor g = randn({3, 4}, 9), u = randn({3, 5}, 10), h = Tensor::empty({3, 4}, DType::F64);
  REQUIRE_THROWS_AS(kern::swiglu_forward(h, g, u), Error);
  REQUIRE_THROWS_WITH(kern::swiglu_forward(h, g, u),
                      Catch::Contains("swiglu_forward: up has shape [3, 5], expected [3, 4]"));
  Tensor u_ok = randn({3, 4}, 11), h32 = Tensor::empty({3, 4}, DType::F32);
  REQUIRE_THROWS_WITH(kern::swiglu_forward(h32, g, u_ok), Catch::Contains("h is F32, expected F64"));
  Tensor dg = Tensor::zeros({3, 4}, DType::F64), du = Tensor::zeros({4, 3}, DType::F64);
  REQUIRE_THROWS_WITH(kern::swiglu_backward(dg, du, h, g, u_ok),
                      Catch::Contains("swiglu_backward: dup has shape [4, 3]"));
}
