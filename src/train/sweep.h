// Scaling-law sweeps (docs/sweeps.md): a grid of model sizes x residual modes
// x token budgets, each point a normal training run with its own run and
// checkpoint directories, then results.csv, power-law fits per mode
// (fits.json) and the compute multipliers of the AttnRes modes over the
// baseline. The sweep file and its plan: sweep_spec.h; what a run's files
// say: sweep_outcome.h; the fits, CSV and tables: sweep_report.h; here, the
// loop that trains the runs and writes the reports.
#pragma once
#include <string>

#include "train/sweep_outcome.h"
#include "train/sweep_report.h"
#include "train/sweep_spec.h"

namespace attnres::train {

struct SweepOptions {
  bool train = true;        // false: only collect results, fits and plots (--report)
  bool plots = true;        // run plot_script at the end
  std::string attnres_bin;  // this binary, for the plot script's `inspect attention` calls
};
// Trains every run not yet complete (in-process, one after another; under
// mpirun every rank runs every run with the base config's layout), then writes
// results.csv, fits.json and the plots. Returns the process exit code: 0, or
// the trainer's code when a run was stopped by a signal (128+N).
int run_sweep(const SweepPlan& plan, const SweepOptions& opt);

}  // namespace attnres::train
