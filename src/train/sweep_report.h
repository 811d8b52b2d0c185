// What a sweep reports from its runs' outcomes (docs/sweeps.md): the
// power-law fits per mode and the AttnRes modes' compute multipliers over
// the baseline (fits.json, fit.h), results.csv, and the tables `attnres
// sweep` prints.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/sweep_outcome.h"
#include "train/sweep_spec.h"

namespace attnres::train {

// fits.json: per mode, the points' mean losses over their completed seeds
// (with standard errors) and the power law through them; the multipliers of
// each AttnRes mode over the baseline with bootstrap intervals over seeds
// (fit.h), and per mode whether the interval excludes 1.
nlohmann::json fit_sweep(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);
// fits.json rendered as the table `attnres sweep` prints.
std::string fits_table(const nlohmann::json& fits);

// An ablation sweep (SweepPlan::ablation_reference; docs/sweeps.md, "The
// ablation table"): per mode in file order, its final loss's mean over its
// completed seeds with a 95% Student-t interval, and its differences from the
// reference mode and from the baseline, paired by seed (the same seed: the
// same initial draw and data order), each with a 95% t-interval and a
// verdict (ahead: lower loss; behind; not distinguishable), with the row's
// published loss and the published differences beside them.
nlohmann::json ablation_sweep(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);
// The same as the table `attnres sweep` prints (the paper's Table 4 layout).
std::string ablation_table(const nlohmann::json& ablation);

// results.csv: one row per run (docs/sweeps.md lists the columns).
std::string results_csv(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);
// The plan as a table (attnres sweep --dry-run).
std::string plan_table(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);

}  // namespace attnres::train
