// What a sweep run's files (sweep_spec.h's layout) say about it: how far it
// trained and its final losses, and whether the config it was started with is
// still the one the sweep file gives it.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/sweep_spec.h"

namespace attnres::train {

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
// Writes <run>/result.json: the outcome and the run's config. From then on
// read_outcome reads it, and the sweep skips the run.
void write_result(const SweepRun& run, const RunOutcome& outcome);

// A loss as JSON: the number, or null where it is not finite (JSON has no NaN).
nlohmann::json finite_or_null(double v);

// A run whose stored config (runs/<run>/config.json or result.json) differs
// from the one the sweep file now gives it, outside the bookkeeping keys:
// a message naming the run, the key and both values; "" when it agrees or
// has not started.
std::string changed_config(const SweepRun& run);
// changed_config of every run of the plan, the non-empty ones. `attnres
// sweep` checks them all before it trains anything and refuses the sweep
// (naming every such run) if there is one; --dry-run reports them too.
std::vector<std::string> changed_configs(const SweepPlan& plan);

}  // namespace attnres::train
