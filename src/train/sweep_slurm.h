// A sweep on a Slurm cluster (docs/sweeps.md, "On a Slurm cluster"):
// `attnres sweep FILE --slurm` writes and submits one job array, a task per
// unfinished run, and a collect job that runs `attnres sweep FILE --report`
// when the array ends (afterany); `--status` tells every run's state from its
// run directory and the queue.
//
// A task's script holds everything it needs (the binary, the working
// directory, PATH and LD_LIBRARY_PATH as they were at submission, the runs'
// names): it is submitted with --export=NONE. Task i trains runs[i] with
// `attnres train runs/<run>/config.json` (resume = auto, so a requeued or
// resubmitted task continues from the run's newest checkpoint; through srun
// when the run has several ranks), then `attnres sweep --finish` records the
// run's end (result.json when complete). A SIGTERM (scancel, preemption) is
// passed to the trainer, which saves a checkpoint and stops; SIGUSR1, which
// Slurm sends 5 minutes before --time runs out, does the same and then
// requeues the task, so a run longer than the partition's time limit goes on
// by itself.
//
// Submissions are recorded in <out_dir>/slurm/submissions.json (the job ids
// and which run each task trains), the scripts beside it, each task's Slurm
// output in <out_dir>/slurm/<array>_<task>.out and its trainer's output in
// runs/<run>/train.log.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "train/sweep_spec.h"

namespace attnres::train {

struct SlurmOptions {
  std::string partition, account, time;   // sbatch's, when set
  int gpus_per_run = -1;    // -1: one per rank when training.device is cuda, else none
  int ranks_per_run = 0;    // 0: the runs' layout; else it must equal parallel.pipeline * data
  int cpus_per_rank = 0;    // 0: Slurm's default (1 CPU); OMP_NUM_THREADS follows it
  int max_running = 0;      // 0: no limit; else at most this many tasks at once (--array=...%M)
  std::vector<std::string> sbatch_options;  // more #SBATCH lines (e.g. --qos=high)
  bool dry_run = false;     // print the scripts; submit and write nothing
  // Written into the scripts, so that a task needs nothing from the submitting
  // shell: this binary, the sweep file, the directory relative paths are
  // resolved from, the sweep's --section.key=value arguments, the search paths.
  std::string attnres_bin, sweep_file, workdir;
  std::vector<std::string> overrides;
  std::string path, ld_library_path;
  // The submitting user's OpenBLAS settings (kernels/cpu/blas_cores.h,
  // user_blas_environment()), exported to the tasks: the same kernels as a
  // local run. A kernel choice attnres made is not carried (a task's node
  // chooses for itself).
  std::vector<std::pair<std::string, std::string>> blas_env;
};

// The job array's script for plan.runs[runs[0..]] (task i trains runs[i]),
// every run with `ranks` ranks.
std::string array_script(const SweepPlan& plan, const std::vector<size_t>& runs, int64_t ranks,
                         const SlurmOptions& opt);
// The collect job's script: `attnres sweep FILE --report`.
std::string collect_script(const SweepPlan& plan, const SlurmOptions& opt);

// Submits every run that is neither complete nor queued or running in Slurm
// (one array per rank count, and a collect job after every array of the
// sweep still in the queue). Returns the exit code (0, or 1 when there is
// nothing to submit because a run cannot start); errors (sbatch refused the
// job, ...) are thrown.
int submit_sweep(const SweepPlan& plan, const SlurmOptions& opt);

// One run's state as --status prints it.
struct RunState {
  std::string state;   // done, diverged, running, queued, failed, started, not started, or
                       // another Slurm state in lower case (completing, requeued, ...)
  std::string detail;  // losses, step and ETA, job id, the failure's last line
};
// Every run's state, from its directory and, when the sweep was submitted to
// Slurm, the queue (squeue). `queue_note` says whether the queue was read.
std::vector<RunState> sweep_states(const SweepPlan& plan, std::string& queue_note);
// `attnres sweep FILE --status`: the states as a table and their counts.
int print_status(const SweepPlan& plan);

// Slurm's queue: "<array job>_<task>" -> state (PENDING, RUNNING, ...), for
// the jobs of this user. Throws when squeue cannot be run or fails.
std::map<std::string, std::string> slurm_queue();

}  // namespace attnres::train
