// attnres sweep SWEEP.json [--jobs N] [--dry-run | --report] [--no-plots] [--out_dir=DIR]
//               [--section.key=value ...]
//   Scaling-law sweep: trains every run of the grid that is not complete yet,
//   then writes results.csv, fits.json and the plots (docs/sweeps.md).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "data/shard.h"
#include "tools/commands.h"
#include "train/sweep.h"

namespace attnres::tools {

namespace fs = std::filesystem;

namespace {

const char* kSweepUsage =
    "usage: attnres sweep SWEEP.json [--jobs N] [--dry-run | --report] [--no-plots]\n"
    "                     [--out_dir=DIR] [--section.key=value ...]\n"
    "  Trains the grid sizes x modes x token budgets of SWEEP.json, one run after another\n"
    "  (under mpirun: every run uses all ranks), skipping completed runs and resuming\n"
    "  interrupted ones; then writes <out_dir>/results.csv, fits.json and plots/*.png.\n"
    "  --jobs N     up to N runs at once, each `attnres train runs/<run>/config.json` in a\n"
    "               process of its own with 1/N of the CPUs (pinned apart; mpirun for runs\n"
    "               with several ranks), its log in runs/<run>/train.log\n"
    "  --dry-run    validate every run's config and print the plan; train and write nothing\n"
    "  --report     train nothing: collect the finished runs, fit, write results and plots\n"
    "  --no-plots   skip the plotting script\n"
    "  --section.key=value  override a key of the base config of every run\n"
    "                       (e.g. --run.stop_after=100 for time slices; see docs/sweeps.md)\n"
    "  --out_dir=DIR        write into DIR instead of the file's out_dir\n";

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
  bool dry_run = false, report = false, plots = true;
  int jobs = 1;
  std::vector<std::string> overrides;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--jobs") {
      const std::string v = i + 1 < args.size() ? args[++i] : "";
      size_t used = 0;
      try {
        jobs = std::stoi(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != v.size() || jobs < 1) fail("sweep: --jobs takes a number >= 1, got '", v, "'");
    } else if (a == "--dry-run") dry_run = true;
    else if (a == "--report") report = true;
    else if (a == "--no-plots") plots = false;
    else if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) overrides.push_back(a);
    else fail("sweep: unexpected argument '", a, "' (see attnres sweep --help)");
  }
  if (dry_run && report) fail("sweep: --dry-run and --report exclude each other");

  const train::SweepPlan plan = train::load_sweep(args[0], overrides);
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
