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

// "Small" for the default of --jobs: up to this many parameters a run.
constexpr int64_t kSmallModelParams = 50'000'000;

struct SweepOptions {
  bool train = true;        // false: only collect results, fits and plots (--report)
  bool plots = true;        // run plot_script at the end
  std::string attnres_bin;  // this binary: the plot script's `inspect attention` calls, --jobs
  int jobs = 0;             // runs at once (each its own process); 1: in this process;
                            // 0: a run per CPU when every run is a single-process CPU run of
                            // at most kSmallModelParams parameters (not under mpirun), else 1
};
// Trains every run not yet complete, then writes results.csv, fits.json and
// the plots. jobs = 1: in this process, one after another (under mpirun every
// rank runs every run with the base config's layout). jobs = N > 1: up to N
// runs at once, each `attnres train runs/<run>/config.json` in a process of
// its own (through mpirun when its layout has several ranks) with its share
// of this process's CPUs (OMP_NUM_THREADS and the CPU set: cores split
// evenly, pinned apart), on cuda a GPU per rank (CUDA_VISIBLE_DEVICES), and
// its output in runs/<run>/train.log; the costliest runs first; a progress
// line every 10 s. Returns the process exit code: 0, or the code of the
// first run that failed or was stopped by a signal (128+N).
int run_sweep(const SweepPlan& plan, const SweepOptions& opt);

// The pieces run_sweep shares with the Slurm submission (sweep_slurm.h).
// Before run i trains: its directory and stored config.json, and a line.
void prepare_run(const SweepPlan& plan, size_t i);
// How a run's training ended.
enum class RunEnd { Done, Paused, Diverged, Failed };
// After a run's trainer exited with `code`: its result.json when it is
// complete (done, or diverged with code kExitNonFinite), and a line.
RunEnd finish_run(const SweepRun& run, int code);
// `attnres sweep --finish RUN_DIR CODE`, the last command of a Slurm task:
// finish_run for the run stored in RUN_DIR (its config.json). Returns `code`.
int finish_task(const std::string& run_dir, int code);
// Why a run's last process ended early: the last line of its train.log that
// says "error" or that `--finish` wrote ("the task ended with ..."), without
// the log's "[time] level " prefix; "" when there is none.
std::string last_reason_line(const SweepRun& run);
// "step K/N, ETA 3m02s" from a run's metrics (best effort: "" when none).
std::string progress_text(const SweepRun& run);

}  // namespace attnres::train
