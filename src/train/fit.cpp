#include "train/fit.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

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

double SeedLosses::mean() const {
  double s = 0;
  for (double l : losses) s += l;
  return losses.empty() ? NAN : s / static_cast<double>(losses.size());
}

double SeedLosses::standard_error() const {
  const size_t n = losses.size();
  if (n < 2) return NAN;
  const double m = mean();
  double ss = 0;
  for (double l : losses) ss += (l - m) * (l - m);
  return std::sqrt(ss / static_cast<double>(n - 1) / static_cast<double>(n));
}

PowerLawFit fit_means(const std::vector<SeedLosses>& points, const std::string& what) {
  std::vector<double> C, L;
  for (const auto& p : points) {
    C.push_back(p.compute);
    L.push_back(p.mean());
  }
  return fit_power_law(C, L, what);
}

MultiplierEstimate estimate_multiplier(const PowerLawFit& baseline,
                                       const std::vector<SeedLosses>& mode) {
  MultiplierEstimate e;
  double log_sum = 0;
  for (const auto& p : mode) {
    e.per_point.push_back(compute_multiplier(baseline, p.mean(), p.compute));
    log_sum += std::log(e.per_point.back());
  }
  if (!mode.empty()) e.geomean = std::exp(log_sum / static_cast<double>(mode.size()));
  return e;
}

namespace {

// The q-quantile of sorted values, interpolating between neighbours.
double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (pos - static_cast<double>(i)) * (sorted[i + 1] - sorted[i]);
}

Interval percentile_interval(std::vector<double> values, double level) {
  if (values.empty()) return Interval{};
  std::sort(values.begin(), values.end());
  return {quantile(values, (1 - level) / 2), quantile(values, (1 + level) / 2)};
}

}  // namespace

MultiplierInterval bootstrap_multiplier(const std::vector<SeedLosses>& baseline,
                                        const std::vector<SeedLosses>& mode,
                                        const std::vector<std::vector<SeedLosses>>& pool_from,
                                        int replicates, uint64_t rng_seed, double level) {
  MultiplierInterval out;
  out.per_point.resize(mode.size());
  std::vector<double> pool;
  for (const auto& points : pool_from)
    for (const auto& p : points) {
      const size_t n = p.losses.size();
      if (n < 2) continue;
      const double m = p.mean(), inflate = std::sqrt(static_cast<double>(n) / (n - 1));
      for (double l : p.losses) pool.push_back(inflate * std::log(l / m));
    }
  if (pool.empty()) return out;

  // Stream r of the generator is replicate r; its draws are numbered in the
  // order the points are visited, so a replicate does not depend on others.
  uint64_t draw = 0;
  auto resampled = [&](const SeedLosses& p, uint64_t r) {
    SeedLosses q{p.compute, {}};
    const double m = p.mean();
    for (size_t s = 0; s < p.losses.size(); ++s)
      q.losses.push_back(m * std::exp(pool[random_u64(rng_seed, r, draw++) % pool.size()]));
    return q;
  };
  std::vector<double> geo;
  std::vector<std::vector<double>> per(mode.size());
  for (int r = 0; r < replicates; ++r) {
    draw = 0;
    std::vector<SeedLosses> b, m;
    for (const auto& p : baseline) b.push_back(resampled(p, static_cast<uint64_t>(r)));
    for (const auto& p : mode) m.push_back(resampled(p, static_cast<uint64_t>(r)));
    ++out.replicates;
    try {
      const MultiplierEstimate e = estimate_multiplier(fit_means(b, "bootstrap baseline"), m);
      geo.push_back(e.geomean);
      for (size_t i = 0; i < mode.size(); ++i) per[i].push_back(e.per_point[i]);
    } catch (const Error&) {
      ++out.failed;  // this replicate's baseline line does not fall with compute
    }
  }
  out.geomean = percentile_interval(geo, level);
  for (size_t i = 0; i < mode.size(); ++i) out.per_point[i] = percentile_interval(per[i], level);
  return out;
}

}  // namespace attnres::train
