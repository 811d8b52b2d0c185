// SwiGLU h = silu(gate) * up on the joint gate | up rows: forward vs formula,
// gradients vs finite differences, accumulation, precision, errors.
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/swiglu.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {
// gu [N, 2F] with gate values of scale 3 (both sides of silu's bend) and up of scale 1.
Tensor gate_up(int64_t N, int64_t F, uint64_t seed) {
  Tensor g = randn({N, F}, seed, DType::F64, 3.0), u = randn({N, F}, seed + 1);
  Tensor gu = Tensor::empty({N, 2 * F}, DType::F64);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      set(gu, n * 2 * F + f, at(g, n * F + f));
      set(gu, n * 2 * F + F + f, at(u, n * F + f));
    }
  return gu;
}
}  // namespace

TEST_CASE("swiglu forward matches the formula on gate | up rows", "[kernels]") {
  const int64_t N = 7, F = 12;
  const Tensor gu = gate_up(N, F, 1);
  Tensor h = Tensor::empty({N, F}, DType::F64);
  kern::swiglu_forward(h, gu);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double x = at(gu, n * 2 * F + f), up = at(gu, n * 2 * F + F + f);
      REQUIRE(at(h, n * F + f) == Approx(x / (1.0 + std::exp(-x)) * up).epsilon(1e-14));
    }
}

TEST_CASE("swiglu backward matches finite differences and accumulates", "[kernels]") {
  const int64_t N = 7, F = 12;
  Tensor gu = gate_up(N, F, 3), w = randn({N, F}, 5);
  auto loss = [&] {
    Tensor h = Tensor::empty({N, F}, DType::F64);
    kern::swiglu_forward(h, gu);
    return weighted_sum(h, w);
  };
  Tensor dgu = Tensor::zeros({N, 2 * F}, DType::F64);
  kern::swiglu_backward(dgu, w, gu);
  // silu' crosses zero near gate = -1.28, where the gradient is tiny and the
  // central difference is mostly rounding noise (~1e-15 |loss| / h): a larger
  // step and an absolute floor keep the check about the formula, not the noise.
  REQUIRE(fd_check(gu, dgu, loss, 1e-5, 1e-4) < 1e-6);

  Tensor dgu1 = dgu.clone();
  kern::swiglu_backward(dgu, w, gu);
  for (int64_t i = 0; i < dgu.numel(); ++i) REQUIRE(at(dgu, i) == Approx(2 * at(dgu1, i)).epsilon(1e-14));
}

TEST_CASE("swiglu float32 agrees with float64", "[kernels]") {
  const int64_t N = 33, F = 37;  // odd widths
  Tensor gu = gate_up(N, F, 6), dh = randn({N, F}, 8);
  Tensor h = Tensor::empty({N, F}, DType::F64), h32 = Tensor::empty({N, F}, DType::F32);
  Tensor gu32 = gu.to(DType::F32), dh32 = dh.to(DType::F32);
  kern::swiglu_forward(h, gu);
  kern::swiglu_forward(h32, gu32);
  REQUIRE(max_rel_diff(h32, h, 1e-3) < 1e-5);
  Tensor dgu = Tensor::zeros({N, 2 * F}, DType::F64), dgu32 = Tensor::zeros({N, 2 * F}, DType::F32);
  kern::swiglu_backward(dgu, dh, gu);
  kern::swiglu_backward(dgu32, dh32, gu32);
  REQUIRE(max_rel_diff(dgu32, dgu, 1e-3) < 1e-5);
}

TEST_CASE("swiglu rejects mismatched shapes and dtypes", "[kernels]") {
  Tensor gu = randn({3, 8}, 9), h = Tensor::empty({3, 4}, DType::F64);
  Tensor odd = randn({3, 7}, 10);
  REQUIRE_THROWS_AS(kern::swiglu_forward(h, odd), Error);
  REQUIRE_THROWS_WITH(kern::swiglu_forward(h, odd),
                      Catch::Contains("swiglu_forward: gu has shape [3, 7], expected [N, 2F]"));
  Tensor h5 = Tensor::empty({3, 5}, DType::F64), h32 = Tensor::empty({3, 4}, DType::F32);
  REQUIRE_THROWS_WITH(kern::swiglu_forward(h5, gu),
                      Catch::Contains("swiglu_forward: h has shape [3, 5], expected [3, 4]"));
  REQUIRE_THROWS_WITH(kern::swiglu_forward(h32, gu), Catch::Contains("h is F32, expected F64"));
  Tensor dgu = Tensor::zeros({4, 8}, DType::F64);
  REQUIRE_THROWS_WITH(kern::swiglu_backward(dgu, h, gu),
                      Catch::Contains("swiglu_backward: dgu has shape [4, 8]"));
}
