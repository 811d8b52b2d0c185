// RMSNorm: forward vs a direct formula, gradients vs finite differences,
// accumulation, precision agreement and a thread-count independent dgain.
#include <omp.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/rmsnorm.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

constexpr float kEps = 1e-5f;


// y = rmsnorm(x; gain) for a scalar loss.
Tensor rms(const Tensor& x, const Tensor* gain) {
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  Tensor r = Tensor::empty({x.dim(0)}, x.dtype());
  kern::rmsnorm_forward(y, r, x, gain, kEps);
  return y;
}

}  // namespace

TEST_CASE("rmsnorm forward matches the formula", "[kernels]") {
  const int64_t N = 7, d = 12;
  Tensor x = randn({N, d}, 1), g = randn({d}, 2);
  for (bool with_gain : {true, false}) {
    Tensor y = Tensor::empty({N, d}, DType::F64), r = Tensor::empty({N}, DType::F64);
    kern::rmsnorm_forward(y, r, x, with_gain ? &g : nullptr, kEps);
    for (int64_t i = 0; i < N; ++i) {
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += at(x, i * d + j) * at(x, i * d + j);
      const double rs = 1.0 / std::sqrt(ss / d + static_cast<double>(kEps));
      REQUIRE(at(r, i) == Approx(rs).epsilon(1e-14));
      for (int64_t j = 0; j < d; ++j)
        REQUIRE(at(y, i * d + j) ==
                Approx(at(x, i * d + j) * rs * (with_gain ? at(g, j) : 1.0)).epsilon(1e-14));
    }
  }
}

TEST_CASE("rmsnorm backward matches finite differences", "[kernels]") {
  const int64_t N = 7, d = 12;
  Tensor x = randn({N, d}, 3), g = randn({d}, 4), w = randn({N, d}, 5);
  for (bool with_gain : {true, false}) {
    const Tensor* gp = with_gain ? &g : nullptr;
    auto loss = [&] { return weighted_sum(rms(x, gp), w); };
    Tensor y = Tensor::empty({N, d}, DType::F64), r = Tensor::empty({N}, DType::F64);
    kern::rmsnorm_forward(y, r, x, gp, kEps);
    Tensor dx = Tensor::zeros({N, d}, DType::F64), dg = Tensor::zeros({d}, DType::F64);
    kern::rmsnorm_backward(dx, with_gain ? &dg : nullptr, w, x, r, gp);
    REQUIRE(fd_check(x, dx, loss) < 1e-6);
    if (with_gain) REQUIRE(fd_check(g, dg, loss) < 1e-6);
  }
}

TEST_CASE("rmsnorm backward accumulates, and float32 agrees with float64", "[kernels]") {
  const int64_t N = 7, d = 12;
  Tensor x = randn({N, d}, 6), g = randn({d}, 7), dy = randn({N, d}, 8);
  Tensor y = Tensor::empty({N, d}, DType::F64), r = Tensor::empty({N}, DType::F64);
  kern::rmsnorm_forward(y, r, x, &g, kEps);
  Tensor dx = Tensor::zeros({N, d}, DType::F64), dg = Tensor::zeros({d}, DType::F64);
  kern::rmsnorm_backward(dx, &dg, dy, x, r, &g);
  Tensor dx1 = dx.clone(), dg1 = dg.clone();
  kern::rmsnorm_backward(dx, &dg, dy, x, r, &g);
  for (int64_t i = 0; i < dx.numel(); ++i) REQUIRE(at(dx, i) == Approx(2 * at(dx1, i)).epsilon(1e-14));
  for (int64_t i = 0; i < d; ++i) REQUIRE(at(dg, i) == Approx(2 * at(dg1, i)).epsilon(1e-14));

  Tensor x32 = x.to(DType::F32), g32 = g.to(DType::F32), dy32 = dy.to(DType::F32);
  Tensor y32 = Tensor::empty({N, d}, DType::F32), r32 = Tensor::empty({N}, DType::F32);
  kern::rmsnorm_forward(y32, r32, x32, &g32, kEps);
  REQUIRE(max_rel_diff(y32, y, 1e-3) < 1e-5);
  REQUIRE(max_rel_diff(r32, r, 1e-3) < 1e-5);
  Tensor dx32 = Tensor::zeros({N, d}, DType::F32), dg32 = Tensor::zeros({d}, DType::F32);
  kern::rmsnorm_backward(dx32, &dg32, dy32, x32, r32, &g32);
  REQUIRE(scaled_diff(dx32, dx1) < 1e-6);
  REQUIRE(scaled_diff(dg32, dg1) < 1e-6);
}

TEST_CASE("rmsnorm dgain is bitwise independent of the thread count", "[kernels]") {
  const int64_t N = 1001, d = 64;  // several row chunks, parallel path
  Tensor x = randn({N, d}, 9, DType::F32), g = randn({d}, 10, DType::F32);
  Tensor dy = randn({N, d}, 11, DType::F32);
  Tensor y = Tensor::empty({N, d}, DType::F32), r = Tensor::empty({N}, DType::F32);
  kern::rmsnorm_forward(y, r, x, &g, kEps);
  const int saved = omp_get_max_threads();
  Tensor dx[2], dg[2];
  for (int t = 0; t < 2; ++t) {
    omp_set_num_threads(t + 1);
    dx[t] = Tensor::zeros({N, d}, DType::F32);
    dg[t] = Tensor::zeros({d}, DType::F32);
    kern::rmsnorm_backward(dx[t], &dg[t], dy, x, r, &g);
  }
  omp_set_num_threads(saved);
  REQUIRE(std::memcmp(dg[0].raw(), dg[1].raw(), dg[0].nbytes()) == 0);
  REQUIRE(std::memcmp(dx[0].raw(), dx[1].raw(), dx[0].nbytes()) == 0);
}

TEST_CASE("rmsnorm rejects bad shapes and dtypes", "[kernels]") {
  const int64_t N = 3, d = 4;
  Tensor x = randn({N, d}, 12), g = randn({d}, 13);
  Tensor y = Tensor::empty({N, d}, DType::F64), r = Tensor::empty({N}, DType::F64);
  Tensor bad_r = Tensor::empty({N + 1}, DType::F64);
  REQUIRE_THROWS_AS(kern::rmsnorm_forward(y, bad_r, x, &g, kEps), Error);
  REQUIRE_THROWS_WITH(kern::rmsnorm_forward(y, bad_r, x, &g, kEps),
                      Catch::Contains("rmsnorm_forward: rstd has shape [4], expected [3]"));
  Tensor bad_g = randn({d + 1}, 14);
  REQUIRE_THROWS_WITH(kern::rmsnorm_forward(y, r, x, &bad_g, kEps), Catch::Contains("gain has shape"));
  Tensor y32 = Tensor::empty({N, d}, DType::F32);
  REQUIRE_THROWS_WITH(kern::rmsnorm_forward(y32, r, x, &g, kEps), Catch::Contains("y is F32, expected F64"));
  Tensor x1 = randn({N * d}, 15);
  REQUIRE_THROWS_WITH(kern::rmsnorm_forward(y, r, x1, &g, kEps), Catch::Contains("x must be 2-D"));
  Tensor dx = Tensor::zeros({N, d}, DType::F64), dg = Tensor::zeros({d}, DType::F64);
  Tensor bad_dy = randn({N, d + 1}, 16);
  REQUIRE_THROWS_WITH(kern::rmsnorm_backward(dx, &dg, bad_dy, x, r, &g),
                      Catch::Contains("rmsnorm_backward: dy has shape"));
  Tensor bad_dg = Tensor::zeros({d - 1}, DType::F64);
  REQUIRE_THROWS_WITH(kern::rmsnorm_backward(dx, &bad_dg, y, x, r, &g), Catch::Contains("dgain has shape"));
}
