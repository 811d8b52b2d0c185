// A sweep file (docs/sweeps.md) read into its plan: the grid of model sizes x
// residual modes x token budgets x seeds, each point a resolved, validated
// training config with its own run and checkpoint directories.
//
// Layout of a sweep's output directory:
//   <out_dir>/runs/<run>/config.json     the run's resolved config (attnres train can rerun it)
//   <out_dir>/runs/<run>/metrics.jsonl   written by the trainer (run.dir)
//   <out_dir>/runs/<run>/ckpt/           its checkpoints (checkpoint.dir)
//   <out_dir>/runs/<run>/result.json     written when the run is complete: it is skipped next time
//   <out_dir>/results.csv, fits.json, plots/*.png
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"

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

  // Its files in `dir` (the layout above).
  std::string config_file() const;
  std::string metrics_file() const;
  std::string result_file() const;
};

struct SweepPlan {
  std::string source;                // the sweep file, for messages
  std::string out_dir;
  std::vector<SweepRun> runs;        // sizes x modes x budgets x seeds, in that nesting order
  std::vector<int64_t> seeds;        // "seeds", or the base config's training.seed alone
  int bootstrap = 2000;              // bootstrap replicates for the multipliers' intervals
  std::vector<std::string> modes;    // mode names in file order
  std::string baseline_mode;         // the mode the multipliers are relative to ("" = none)
  // An ablation sweep ("ablation": {"reference": MODE}): the report's table
  // of each mode's loss and its differences from the reference and the
  // baseline mode (sweep_report.h, ablation_table), with each mode's
  // published loss ("paper") beside it.
  std::string ablation_reference;
  std::map<std::string, double> paper;
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

}  // namespace attnres::train
