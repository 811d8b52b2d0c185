// attnres sweep SWEEP.json [--jobs N | --slurm [OPTIONS] | --status] [--dry-run | --report |
// --print-config RUN]
//               [--no-plots] [--out_dir=DIR] [--section.key=value ...]
// attnres sweep --finish RUN_DIR EXIT_CODE
//   Scaling-law sweep: trains every run of the grid that is not complete yet
//   (here, or as a Slurm job array), then writes results.csv, fits.json and
//   the plots (docs/sweeps.md).
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "data/shard.h"
#include "kernels/cpu/blas_cores.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/sweep.h"
#include "train/sweep_slurm.h"

namespace attnres::tools {

namespace fs = std::filesystem;

namespace {

const char* kSweepUsage =
    "usage: attnres sweep SWEEP.json [--jobs N | --slurm [SLURM OPTIONS] | --status]\n"
    "                     [--dry-run | --report | --print-config RUN] [--no-plots] [--out_dir=DIR]\n"
    "                     [--section.key=value ...]\n"
    "  Trains the grid sizes x modes x token budgets of SWEEP.json, one run after another\n"
    "  (under mpirun: every run uses all ranks), skipping completed runs and resuming\n"
    "  interrupted ones; then writes <out_dir>/results.csv, fits.json and plots/*.png.\n"
    "  --jobs N     up to N runs at once, the costliest first, each `attnres train\n"
    "               runs/<run>/config.json` in a process of its own with 1/N of the CPUs\n"
    "               (pinned apart) and, on cuda, a GPU per rank (CUDA_VISIBLE_DEVICES);\n"
    "               mpirun for runs with several ranks; its log in runs/<run>/train.log.\n"
    "               Default: a run per CPU when every run is a small (<= 50M parameters)\n"
    "               single-process CPU run, else 1 (one run at a time, in this process)\n"
    "  --slurm      submit the unfinished runs not already queued as one Slurm job array\n"
    "               (a task per run: `attnres train` with resume = auto, through srun\n"
    "               for several ranks) and a job that collects the results after it\n"
    "    --partition P  --account A  --time T      passed to sbatch\n"
    "    --gpus-per-run G   default: one per rank when training.device is cuda, else 0\n"
    "    --ranks-per-run R  must equal the layout's parallel.pipeline * parallel.data\n"
    "    --cpus-per-rank C  CPUs (and OpenMP threads) per rank; default Slurm's (1)\n"
    "    --max-running M    at most M tasks at once\n"
    "    --sbatch OPTION    one more #SBATCH line, e.g. --sbatch --qos=high (repeatable)\n"
    "  --status     every run's state: done, running (step, ETA), queued, failed (with\n"
    "               its log's last error line), not started\n"
    "  --dry-run    validate every run's config and print the plan (with --slurm: the\n"
    "               sbatch scripts); train, submit and write nothing\n"
    "  --report     train nothing: collect the finished runs, fit, write results and plots\n"
    "  --print-config RUN  print run RUN's config (what the sweep writes to\n"
    "               runs/RUN/config.json) and exit: a file for train, inspect memory or\n"
    "               inspect plan (the names: --dry-run's first column)\n"
    "  --no-plots   skip the plotting script\n"
    "  --section.key=value  override a key of the base config of every run\n"
    "                       (e.g. --run.stop_after=100 for time slices; see docs/sweeps.md)\n"
    "  --out_dir=DIR        write into DIR instead of the file's out_dir\n"
    "attnres sweep --finish RUN_DIR EXIT_CODE\n"
    "  The last command of a Slurm task: records how the run's trainer ended\n"
    "  (result.json when it is complete) and exits with EXIT_CODE.\n";

// A whole number >= `min` from a flag's value.
int int_flag(const std::string& flag, const std::string& v, int min) {
  const auto n = to_int(v);
  if (!n || *n < min || *n > INT_MAX)
    fail("sweep: ", flag, " takes a whole number >= ", min, ", got '", v, "'");
  return static_cast<int>(*n);
}

// This binary, for the plot script's `attnres inspect attention` calls.
std::string own_binary() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("attnres") : p.string();
}

}  // namespace

int cmd_sweep(const Args& args) {
  if (args.empty() || args[0] == "--help") {
    std::fputs(kSweepUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--finish") {
    if (args.size() != 3) fail("sweep: --finish takes RUN_DIR EXIT_CODE (see attnres sweep --help)");
    return train::finish_task(args[1], int_flag("--finish", args[2], 0));
  }
  bool dry_run = false, report = false, plots = true, slurm = false, status = false;
  std::string print_config;  // --print-config RUN
  int jobs = 0;  // the default: train::SweepOptions::jobs
  train::SlurmOptions sl;
  std::vector<std::string> overrides;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) fail("sweep: ", a, " needs a value (see attnres sweep --help)");
      return args[++i];
    };
    if (a == "--jobs") jobs = int_flag(a, value(), 1);
    else if (a == "--dry-run") dry_run = true;
    else if (a == "--report") report = true;
    else if (a == "--no-plots") plots = false;
    else if (a == "--slurm") slurm = true;
    else if (a == "--status") status = true;
    else if (a == "--print-config") print_config = value();
    else if (a == "--partition") sl.partition = value();
    else if (a == "--account") sl.account = value();
    else if (a == "--time") sl.time = value();
    else if (a == "--gpus-per-run") sl.gpus_per_run = int_flag(a, value(), 0);
    else if (a == "--ranks-per-run") sl.ranks_per_run = int_flag(a, value(), 1);
    else if (a == "--cpus-per-rank") sl.cpus_per_rank = int_flag(a, value(), 1);
    else if (a == "--max-running") sl.max_running = int_flag(a, value(), 1);
    else if (a == "--sbatch") sl.sbatch_options.push_back(value());
    else if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) overrides.push_back(a);
    else fail("sweep: unexpected argument '", a, "' (see attnres sweep --help)");
  }
  const bool slurm_flags = !sl.partition.empty() || !sl.account.empty() || !sl.time.empty() ||
                           sl.gpus_per_run >= 0 || sl.ranks_per_run > 0 || sl.cpus_per_rank > 0 ||
                           sl.max_running > 0 || !sl.sbatch_options.empty();
  if (slurm_flags && !slurm) fail("sweep: the Slurm options need --slurm (see attnres sweep --help)");
  if (slurm && (report || jobs > 0 || status))
    fail("sweep: --slurm excludes --report, --jobs and --status");
  if (status && (dry_run || report || jobs > 0)) fail("sweep: --status excludes the other modes");
  if (dry_run && report) fail("sweep: --dry-run and --report exclude each other");

  if (!print_config.empty() && (dry_run || report || slurm || status || jobs > 0))
    fail("sweep: --print-config excludes the other modes");

  const train::SweepPlan plan = train::load_sweep(args[0], overrides);
  if (status) return train::print_status(plan);
  if (!print_config.empty()) {
    // One run's config, as the sweep writes it to RUN/config.json: what
    // train, inspect memory and inspect plan take.
    for (const auto& r : plan.runs)
      if (r.name == print_config) {
        std::printf("%s\n", r.config.to_json().dump(2).c_str());
        return 0;
      }
    std::string names;
    for (const auto& r : plan.runs) names += (names.empty() ? "" : ", ") + r.name;
    fail("sweep: --print-config: ", args[0], " has no run '", print_config, "'; its runs: ", names);
  }
  if (slurm) {
    sl.dry_run = dry_run;
    sl.attnres_bin = own_binary();
    sl.sweep_file = fs::absolute(args[0]).lexically_normal().string();
    sl.workdir = fs::current_path().string();
    sl.overrides = overrides;
    const char* path = std::getenv("PATH");
    const char* ld = std::getenv("LD_LIBRARY_PATH");
    sl.path = path ? path : "/usr/local/bin:/usr/bin:/bin";
    sl.ld_library_path = ld ? ld : "";
    sl.blas_env = kernels::cpu::user_blas_environment();
    return train::submit_sweep(plan, sl);
  }
  if (dry_run) {
    std::vector<train::RunOutcome> outcomes;
    for (const auto& r : plan.runs) outcomes.push_back(train::read_outcome(r));
    std::printf("sweep %s: %zu runs into %s\n", args[0].c_str(), plan.runs.size(),
                plan.out_dir.c_str());
    std::printf("%s", train::plan_table(plan, outcomes).c_str());
    // A started run whose config the file now changes: the real run would
    // refuse the sweep, so the dry run does too, naming every such run.
    const std::vector<std::string> changed = train::changed_configs(plan);
    if (!changed.empty()) {
      for (const auto& c : changed) std::fprintf(stderr, "error: %s\n", c.c_str());
      std::fprintf(stderr, "error: %zu started run(s) would be refused: the sweep cannot run as it is\n",
                   changed.size());
      return 2;
    }
    std::printf("every run config validated%s\n",
                std::any_of(outcomes.begin(), outcomes.end(),
                            [](const train::RunOutcome& o) { return o.status != "new"; })
                    ? "; the started runs match their stored configs"
                    : "");
    // The data is only opened when a run starts; say now if it is missing.
    const auto& data = plan.runs.front().config.data;
    for (const auto& [key, spec] : {std::pair<const char*, std::string>{"data.train", data.train},
                                    {"data.val", data.val}}) {
      if (spec.empty()) continue;
      try {
        std::printf("%s: %zu shard(s) at %s\n", key, data::resolve_data_spec(spec, key).size(),
                    spec.c_str());
      } catch (const Error& e) {
        std::printf("warning: %s\n", e.what());
      }
    }
    return 0;
  }
  train::SweepOptions opt;
  opt.train = !report;
  opt.plots = plots;
  opt.attnres_bin = own_binary();
  opt.jobs = jobs;
  return train::run_sweep(plan, opt);
}

}  // namespace attnres::tools
