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

// Parameters outside the embedding matrix and the LM head (the N of C = 6 N D):
// attention and MLP matrices, norm gains and the AttnRes queries.
int64_t non_embedding_params(const model::ModelConfig& m);
// Every parameter (embedding and LM head included).
int64_t total_params(const model::ModelConfig& m);

// One point of the grid.
struct SweepRun {
  std::string name;         // <size>_<mode>_<tokens>, also the directory name
  std::string size, mode;   // names from the sweep file
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
  std::vector<SweepRun> runs;        // sizes x modes x budgets, in that nesting order
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

// Which (mode, compute, loss) points the fits use: completed runs only.
nlohmann::json fit_sweep(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);
// fits.json rendered as the table `attnres sweep` prints.
std::string fits_table(const nlohmann::json& fits);

// results.csv: one row per run (docs/sweeps.md lists the columns).
std::string results_csv(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);
// The plan as a table (attnres sweep --dry-run).
std::string plan_table(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes);

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
