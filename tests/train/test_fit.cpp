// Power-law fits L = A * C^-alpha and compute multipliers (src/train/fit.h),
// on synthetic data with known A and alpha.
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "train/fit.h"

using namespace attnres;
using namespace attnres::train;
using Catch::Contains;

namespace {

// Points on L = A * C^-alpha at C spread over `decades` decades from c0.
void law(double A, double alpha, double c0, double decades, int n, std::vector<double>& C,
         std::vector<double>& L) {
  C.clear();
  L.clear();
  for (int i = 0; i < n; ++i) {
    C.push_back(c0 * std::pow(10.0, decades * i / (n - 1)));
    L.push_back(A * std::pow(C.back(), -alpha));
  }
}

}  // namespace

TEST_CASE("power-law fit recovers A and alpha exactly from points on the line", "[fit]") {
  std::vector<double> C, L;
  // The paper's Block AttnRes line, over the paper's compute range (PFLOP/s-days) ...
  law(1.870, 0.058, 0.3, 1.5, 5, C, L);
  PowerLawFit f = fit_power_law(C, L, "paper block");
  CHECK(f.A == Approx(1.870).epsilon(1e-12));
  CHECK(f.alpha == Approx(0.058).epsilon(1e-12));
  CHECK(f.r2 == Approx(1.0).epsilon(1e-12));
  CHECK(f.rmse < 1e-12);
  CHECK(f.n == 5);
  REQUIRE(f.residuals.size() == 5);
  for (double r : f.residuals) CHECK(std::fabs(r) < 1e-12);
  CHECK(f.predict(C[2]) == Approx(L[2]).epsilon(1e-12));

  // ... and a steep line at tiny compute (a CPU sweep: ~1e-9 PFLOP/s-days),
  // where ln C is far from 0 and a naive normal-equation fit loses digits.
  law(4.2, 0.31, 2e-9, 2.0, 4, C, L);
  f = fit_power_law(C, L, "cpu");
  CHECK(f.A == Approx(4.2).epsilon(1e-9));
  CHECK(f.alpha == Approx(0.31).epsilon(1e-10));

  // Point order does not matter; two points define the line exactly.
  std::vector<double> C2 = {C[3], C[0]}, L2 = {L[3], L[0]};
  f = fit_power_law(C2, L2, "two points");
  CHECK(f.alpha == Approx(0.31).epsilon(1e-10));
  CHECK(f.r2 == Approx(1.0));
}

TEST_CASE("power-law fit with noise: close to the truth, R^2 and residuals report the noise",
          "[fit]") {
  std::vector<double> C, L;
  law(2.5, 0.08, 1e-3, 3.0, 40, C, L);
  // Multiplicative noise of 0.3% (ln L perturbed by +-0.003, deterministic).
  std::vector<double> noise;
  for (size_t i = 0; i < L.size(); ++i) {
    noise.push_back(0.003 * random_normal(11, 3, i));
    L[i] *= std::exp(noise.back());
  }
  const PowerLawFit f = fit_power_law(C, L, "noisy");
  CHECK(f.alpha == Approx(0.08).margin(0.004));
  CHECK(f.A == Approx(2.5).epsilon(0.03));
  CHECK(f.r2 > 0.9);
  CHECK(f.r2 < 1.0);
  CHECK(f.rmse == Approx(0.003).epsilon(0.35));  // about the noise level
  // The residuals are ln L minus the fitted line: they sum to zero (least
  // squares with an intercept) and follow the injected noise.
  double sum = 0, agree = 0;
  for (size_t i = 0; i < f.residuals.size(); ++i) {
    sum += f.residuals[i];
    CHECK(f.residuals[i] == Approx(std::log(L[i]) - std::log(f.predict(C[i]))).margin(1e-12));
    agree += f.residuals[i] * noise[i];
  }
  CHECK(std::fabs(sum) < 1e-10);
  CHECK(agree > 0);

  // Noise-free data fits better than noisy data: R^2 compares them.
  std::vector<double> Cn, Ln;
  law(2.5, 0.08, 1e-3, 3.0, 40, Cn, Ln);
  CHECK(fit_power_law(Cn, Ln, "clean").r2 > f.r2);
}

TEST_CASE("power-law fit rejects degenerate input with a clear error", "[fit]") {
  REQUIRE_THROWS_WITH(fit_power_law({1.0}, {2.0}, "mode full"),
                      Contains("mode full") && Contains("at least 2 points, got 1"));
  REQUIRE_THROWS_WITH(fit_power_law({}, {}, "mode full"), Contains("at least 2 points, got 0"));
  REQUIRE_THROWS_WITH(fit_power_law({1.0, 2.0}, {2.0}, "m"), Contains("2 compute values but 1 losses"));
  REQUIRE_THROWS_WITH(fit_power_law({1e-6, 1e-6, 1e-6}, {3.0, 2.9, 3.1}, "mode block"),
                      Contains("mode block") && Contains("same compute") &&
                          Contains("at least two compute budgets"));
  REQUIRE_THROWS_WITH(fit_power_law({1.0, 0.0}, {2.0, 1.0}, "m"),
                      Contains("compute of point 1") && Contains("finite positive"));
  REQUIRE_THROWS_WITH(fit_power_law({1.0, -2.0}, {2.0, 1.0}, "m"), Contains("compute of point 1"));
  REQUIRE_THROWS_WITH(fit_power_law({1.0, 2.0}, {2.0, NAN}, "m"),
                      Contains("loss of point 1") && Contains("finite positive"));
  REQUIRE_THROWS_WITH(fit_power_law({1.0, INFINITY}, {2.0, 1.0}, "m"), Contains("compute of point 1"));
  REQUIRE_THROWS_WITH(fit_power_law({1.0, 2.0}, {0.0, 1.0}, "m"), Contains("loss of point 0"));

  // Flat data fits exactly with alpha = 0, but then no compute reaches a lower loss.
  const PowerLawFit flat = fit_power_law({1.0, 10.0, 100.0}, {2.0, 2.0, 2.0}, "flat");
  CHECK(flat.alpha == Approx(0.0).margin(1e-15));
  CHECK(flat.r2 == 1.0);
  REQUIRE_THROWS_WITH(compute_multiplier(flat, 1.9, 10.0), Contains("alpha = ") && Contains("does not fall"));
}

TEST_CASE("compute multiplier: baseline compute for the same loss over the compute used", "[fit]") {
  // The paper's fits (C in PFLOP/s-days): Baseline 1.891 C^-0.057, Block 1.870 C^-0.058.
  // At 5.6 PFLOP/s-days Block reaches 1.692 and the baseline needs ~1.25x the compute.
  std::vector<double> C, L;
  law(1.891, 0.057, 0.5, 1.2, 5, C, L);
  const PowerLawFit base = fit_power_law(C, L, "baseline");
  const double block_loss = 1.870 * std::pow(5.6, -0.058);
  CHECK(block_loss == Approx(1.692).margin(5e-4));
  const double x = compute_multiplier(base, block_loss, 5.6);
  CHECK(x == Approx(1.25).margin(0.01));
  // By construction: the baseline at x * C reaches exactly that loss.
  CHECK(base.predict(x * 5.6) == Approx(block_loss).epsilon(1e-12));
  // The baseline's own loss gives 1; a worse loss gives < 1.
  CHECK(compute_multiplier(base, base.predict(3.0), 3.0) == Approx(1.0).epsilon(1e-12));
  CHECK(compute_multiplier(base, base.predict(3.0) * 1.01, 3.0) < 1.0);
  // Known closed form for equal alphas: (A_base / A_other)^(1/alpha).
  law(1.891 * 0.98, 0.057, 0.5, 1.2, 5, C, L);
  const PowerLawFit other = fit_power_law(C, L, "other");
  CHECK(compute_multiplier(base, other.predict(2.0), 2.0) ==
        Approx(std::pow(1.0 / 0.98, 1.0 / 0.057)).epsilon(1e-9));
  REQUIRE_THROWS_WITH(compute_multiplier(base, 1.7, 0.0), Contains("compute must be"));
  REQUIRE_THROWS_WITH(compute_multiplier(base, -1.0, 1.0), Contains("loss must be"));
}
