// Scaling-law fits for the sweeps (docs/sweeps.md): L = A * C^-alpha by least
// squares in log-log space, and the compute multiplier of a residual mode over
// the baseline (the paper's "1.25x compute advantage" of Block AttnRes).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace attnres::train {

// A fitted power law L = A * C^-alpha.
struct PowerLawFit {
  double A = 0, alpha = 0;
  // Fit quality in log space: R^2 of ln L, the residuals ln L_i - ln(A C_i^-alpha)
  // in input order and their root mean square. With two points the line
  // passes through both (R^2 = 1, no degrees of freedom left).
  double r2 = 0, rmse = 0;
  std::vector<double> residuals;
  int64_t n = 0;

  double predict(double C) const;
  // The compute at which the fitted line reaches `loss`: (loss / A)^(-1/alpha).
  // Throws attnres::Error unless alpha > 0 (a line that does not fall with
  // compute never reaches a lower loss) and loss > 0.
  double compute_for_loss(double loss) const;
};

// Least squares of ln L = ln A - alpha ln C over the points (C_i, L_i).
// Throws attnres::Error, naming `what` (e.g. "mode full"), when there are
// fewer than two points, the vectors differ in length, a value is not a
// finite positive number, or every C is the same (no slope to fit).
PowerLawFit fit_power_law(const std::vector<double>& C, const std::vector<double>& L,
                          const std::string& what);

// How much more compute the baseline needs for the same loss: the baseline
// fit's compute for `loss`, divided by `compute` (what the other mode used).
// > 1 means the other mode is ahead. Throws like compute_for_loss.
double compute_multiplier(const PowerLawFit& baseline, double loss, double compute);

// ---------------------------------------------------------------------------
// Several seeds per point: means, and an interval for the multiplier
// ---------------------------------------------------------------------------

// One grid point (a size and token budget of one mode): its compute and the
// final loss of each seed that completed.
struct SeedLosses {
  double compute = 0;
  std::vector<double> losses;
  double mean() const;
  // Standard error of the mean, sd / sqrt(n) with the n - 1 sd; NAN below 2 seeds.
  double standard_error() const;
};

// The power law through the points' mean losses.
PowerLawFit fit_means(const std::vector<SeedLosses>& points, const std::string& what);

// The mode's compute multiplier over the baseline as the sweep reports it:
// per point, the baseline line's compute for the point's mean loss over the
// point's compute, and their geometric mean over the mode's points.
struct MultiplierEstimate {
  std::vector<double> per_point;
  double geomean = NAN;
};
MultiplierEstimate estimate_multiplier(const PowerLawFit& baseline,
                                       const std::vector<SeedLosses>& mode);

// A two-sided percentile interval.
struct Interval {
  double lo = NAN, hi = NAN;
  bool excludes(double x) const { return lo > x || hi < x; }
};
struct MultiplierInterval {
  Interval geomean;
  std::vector<Interval> per_point;
  int replicates = 0;  // bootstrap replicates drawn
  int failed = 0;      // replicates whose baseline fit had no falling line (left out)
};

// Bootstrap over seeds (docs/sweeps.md, "How the interval is computed"). The seed-to-
// seed scatter of a point's loss is modelled as relative noise of one size
// everywhere: the residuals ln(L_s / mean L) of every point in `pool_from`
// (the sweep passes every mode's points) with two or more seeds, each scaled
// by sqrt(n / (n - 1)) to undo the shrinkage of residuals around their own
// mean, form one pool. A replicate draws, for every point of the baseline and
// of the mode, as many residuals as the point has seeds, with replacement,
// takes the mean of L * exp(residual) as the point's mean loss, refits the
// baseline line and recomputes the multipliers. The interval is the
// (1 - level)/2 and (1 + level)/2 quantiles of `replicates` replicates, drawn
// from a generator seeded with `rng_seed` (the same numbers give the same
// interval). Pooling gives many more residuals than one point's 2-5 seeds, so
// the interval keeps its stated coverage with few seeds (94-95% for a 95%
// interval on synthetic sweeps with 3 or 5 seeds, where resampling each
// point's own seeds covered 85% and 90%: tests/train/test_fit.cpp); the price
// is the assumption that relative seed noise is similar across sizes and modes.
// Returns no interval (NANs) when no point has two seeds.
MultiplierInterval bootstrap_multiplier(const std::vector<SeedLosses>& baseline,
                                        const std::vector<SeedLosses>& mode,
                                        const std::vector<std::vector<SeedLosses>>& pool_from,
                                        int replicates, uint64_t rng_seed, double level = 0.95);

}  // namespace attnres::train
