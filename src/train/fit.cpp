#include "train/fit.h"

#include <cmath>

#include "core/error.h"

namespace attnres::train {

double PowerLawFit::predict(double C) const { return A * std::pow(C, -alpha); }

double PowerLawFit::compute_for_loss(double loss) const {
  if (!(alpha > 0))
    fail("compute multiplier: the baseline fit has alpha = ", alpha,
         " (loss does not fall with compute), so no compute reaches a lower loss");
  if (!(loss > 0) || !std::isfinite(loss))
    fail("compute multiplier: loss must be a finite positive number, got ", loss);
  // ln C = (ln A - ln L) / alpha, in logs to stay finite for tiny C.
  return std::exp((std::log(A) - std::log(loss)) / alpha);
}

PowerLawFit fit_power_law(const std::vector<double>& C, const std::vector<double>& L,
                          const std::string& what) {
  if (C.size() != L.size())
    fail("power-law fit of ", what, ": ", C.size(), " compute values but ", L.size(), " losses");
  if (C.size() < 2)
    fail("power-law fit of ", what, ": needs at least 2 points, got ", C.size());
  const size_t n = C.size();
  std::vector<double> x(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    if (!(C[i] > 0) || !std::isfinite(C[i]))
      fail("power-law fit of ", what, ": compute of point ", i, " must be a finite positive number, got ", C[i]);
    if (!(L[i] > 0) || !std::isfinite(L[i]))
      fail("power-law fit of ", what, ": loss of point ", i, " must be a finite positive number, got ", L[i]);
    x[i] = std::log(C[i]);
    y[i] = std::log(L[i]);
  }
  // Ordinary least squares on centred data (better conditioned than the raw
  // normal equations when ln C is far from 0, as it is in FLOPs).
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) mx += x[i] / n, my += y[i] / n;
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
  }
  // Relative to the spread of ln C itself, so equal C values that differ only
  // by rounding still count as equal.
  if (!(sxx > 1e-24 * (1 + mx * mx) * n))
    fail("power-law fit of ", what, ": every point has the same compute (", C[0],
         "), so there is no slope to fit; the sweep needs at least two compute budgets");
  const double slope = sxy / sxx;
  PowerLawFit f;
  f.n = static_cast<int64_t>(n);
  f.alpha = -slope;
  f.A = std::exp(my - slope * mx);
  double ss_res = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = y[i] - (my + slope * (x[i] - mx));
    f.residuals.push_back(r);
    ss_res += r * r;
  }
  f.rmse = std::sqrt(ss_res / n);
  // Flat data (syy = 0) is fitted exactly by a flat line.
  f.r2 = syy > 0 ? 1.0 - ss_res / syy : 1.0;
  return f;
}

double compute_multiplier(const PowerLawFit& baseline, double loss, double compute) {
  if (!(compute > 0) || !std::isfinite(compute))
    fail("compute multiplier: compute must be a finite positive number, got ", compute);
  return baseline.compute_for_loss(loss) / compute;
}

}  // namespace attnres::train
