// Scaling-law sweeps (docs/sweeps.md): a grid of model sizes x residual modes
// x token budgets, each point a normal training run with its own run and
// checkpoint directories, then results.csv, power-law fits per mode
// (fits.json) and the compute multipliers of the AttnRes modes over the
// baseline.
//
// Layout of a sweep's output directory:
//   <out_dir>/runs/<run>/config.json     the run's resolved config (attnres train can rerun it)
//   <out_dir>/runs/<run>/metrics.jsonl   written by the trainer (run.dir)
//   <out_dir>/runs/<run>/ckpt/           its checkpoints (checkpoint.dir)
//   <out_dir>/runs/<run>/result.json     written when the run is complete: it is skipped next time
//   <out_dir>/results.csv, fits.json, plots/*.png
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"
#include "train/fit.h"

namespace attnres::train {

// 1 PFLOP/s-day in FLOPs (the paper's compute unit).
constexpr double kFlopsPerPflopsDay = 1e15 * 86400.0;

// One run: a point of the grid (size x mode x budget) trained with one seed.
struct SweepRun {
  std::string name;         // <point>, or <point>_s<seed> with "seeds"; the directory name
  std::string point;        // <size>_<mode>_<tokens>: the runs of its seeds are replicates
  std::string size, mode;   // names from the sweep file
  int64_t seed = 0;         // training.seed
  std::string dir;          // <out_dir>/runs/<name>
  Config config;            // resolved and validated
  int64_t budget = 0;       // tokens asked for
  int64_t steps = 0;        // training.steps = round(budget / tokens per step)
  int64_t tokens = 0;       // tokens trained: steps * tokens per step
  int64_t params = 0;       // non-embedding parameters N
  int64_t params_total = 0;
  double flops = 0;         // C = 6 N D
};

struct SweepPlan {
  std::string source;                // the sweep file, for messages
  std::string out_dir;
  std::vector<SweepRun> runs;        // sizes x modes x budgets x seeds, in that nesting order
  std::vector<int64_t> seeds;        // "seeds", or the base config's training.seed alone
  int bootstrap = 2000;              // bootstrap replicates for the multipliers' intervals
  std::vector<std::string> modes;    // mode names in file order
  std::string baseline_mode;         // the mode the multipliers are relative to ("" = none)
  std::string fit_loss = "val";      // "val" or "train": which final loss the fits use
  std::string python = "/usr/bin/python3", plot_script = "scripts/plot_sweep.py";
};

// Parses and validates a sweep file (see docs/sweeps.md for its keys);
// `overrides` (--section.key=value) apply to the base config of every run,
// except --out_dir=DIR, which replaces the sweep's out_dir. Nothing is
// written. Errors name the file, the key and the reason.
SweepPlan load_sweep(const std::string& path, const std::vector<std::string>& overrides = {});
SweepPlan parse_sweep(const nlohmann::json& j, const std::string& source,
                      const std::vector<std::string>& overrides = {});

// What a run's files say about it.
struct RunOutcome {
  std::string status;          // "done", "diverged", "partial" (checkpoints, not finished) or "new"
  int64_t step = 0;            // last step in metrics.jsonl
  double train_loss = NAN;     // loss of the final step
  double train_loss_avg = NAN; // mean loss over the last 10% of the steps (at least one)
  double val_loss = NAN;       // val loss after the final step (NAN if none was logged)
  double wall_sec = 0;         // training-loop time summed over the invocations that trained it
};
// Reads <run>/result.json if present, else the run's metrics and checkpoints.
RunOutcome read_outcome(const SweepRun& run);
// The outcome from metrics.jsonl alone (exposed for tests).
RunOutcome outcome_from_metrics(const std::string& metrics_path, int64_t steps);

// fits.json: per mode, the points' mean losses over their completed seeds
// (with standard errors) and the power law through them; the multipliers of
// each AttnRes mode over the baseline with bootstrap intervals over seeds
// (fit.h), and per mode whether the interval excludes 1.
nlohmann::json fit_sweep(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);
// fits.json rendered as the table `attnres sweep` prints.
std::string fits_table(const nlohmann::json& fits);

// results.csv: one row per run (docs/sweeps.md lists the columns).
std::string results_csv(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);
// The plan as a table (attnres sweep --dry-run).
std::string plan_table(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);

// A run whose stored config (runs/<run>/config.json or result.json) differs
// from the one the sweep file now gives it, outside the bookkeeping keys:
// a message naming the run, the key and both values; "" when it agrees or
// has not started.
std::string changed_config(const SweepRun& run);
// changed_config of every run of the plan, the non-empty ones. `attnres
// sweep` checks them all before it trains anything and refuses the sweep
// (naming every such run) if there is one; --dry-run reports them too.
std::vector<std::string> changed_configs(const SweepPlan& plan);

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
