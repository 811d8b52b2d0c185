// Scaling-law fits for the sweeps (docs/sweeps.md): L = A * C^-alpha by least
// squares in log-log space, and the compute multiplier of a residual mode over
// the baseline (the paper's "1.25x compute advantage" of Block AttnRes).
#pragma once
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

}  // namespace attnres::train
