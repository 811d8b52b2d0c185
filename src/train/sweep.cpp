#include "train/sweep.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "parallel/mpi.h"
#include "train/trainer.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Single-quoted for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// What to do with a run. Rank 0 decides from the run's files; every rank follows.
enum class RunAction : int32_t { Train, Skip };
RunAction decide(const SweepRun& run, bool train) {
  // A result.json means complete (done or diverged); --report trains nothing.
  return train && !fs::exists(run.result_file()) ? RunAction::Train : RunAction::Skip;
}

void write_outputs(const SweepPlan& plan, const SweepOptions& opt) {
  std::vector<RunOutcome> outcomes;
  for (const auto& r : plan.runs) outcomes.push_back(read_outcome(r));
  fs::create_directories(plan.out_dir);
  const std::string csv = (fs::path(plan.out_dir) / "results.csv").string();
  const std::string fits_path = (fs::path(plan.out_dir) / "fits.json").string();
  write_text_file_atomic(csv, results_csv(plan, outcomes));
  const json fits = fit_sweep(plan, outcomes);
  write_text_file_atomic(fits_path, fits.dump(2) + "\n");
  const auto done = std::count_if(outcomes.begin(), outcomes.end(),
                                  [](const RunOutcome& o) { return o.status == "done"; });
  spdlog::info("sweep: {} of {} runs complete; wrote {} and {}", done, plan.runs.size(), csv, fits_path);
  std::printf("%s", fits_table(fits).c_str());
  std::fflush(stdout);
  if (!opt.plots || done == 0) return;
  if (!fs::exists(plan.plot_script)) {
    spdlog::warn("plots skipped: {} not found (run the sweep from the repository root or set "
                 "\"plots\": {{\"script\": ...}} in the sweep file)", plan.plot_script);
    return;
  }
  std::string cmd = shell_quote(plan.python) + " " + shell_quote(plan.plot_script) + " " +
                    shell_quote(plan.out_dir);
  if (!opt.attnres_bin.empty()) cmd += " --attnres " + shell_quote(opt.attnres_bin);
  spdlog::info("plotting: {}", cmd);
  const int rc = std::system(cmd.c_str());
  if (rc != 0)
    spdlog::warn("plots: `{}` failed (status {}); results.csv and fits.json are written", cmd, rc);
  else
    spdlog::info("plots written to {}", (fs::path(plan.out_dir) / "plots").string());
}

}  // namespace

int run_sweep(const SweepPlan& plan, const SweepOptions& opt) {
  // Under mpirun every rank runs every run together (each train() call is one
  // parallel job). MPI can be initialised only once per process, so the
  // sweep holds the session for its whole life; train() adopts it.
  const int launched = parallel::launcher_world_size();
  std::unique_ptr<parallel::MpiSession> mpi;
  if (launched > 1) {
    for (const auto& r : plan.runs)
      if (opt.train && r.config.parallel.pipeline * r.config.parallel.data != launched)
        fail(plan.source, " (run ", r.name, "): parallel.pipeline * parallel.data = ",
             r.config.parallel.pipeline * r.config.parallel.data, " but mpirun started ", launched,
             " processes; every run of a sweep uses the same layout");
    mpi = std::make_unique<parallel::MpiSession>();
    init_logging(mpi->world_rank());
  }
  const bool root = !mpi || mpi->world_rank() == 0;
  // Rank 0 decides from the files; everyone follows.
  auto agree = [&](std::string s) {
    if (mpi) parallel::Comm::world().bcast(s, 0);
    return s;
  };
  auto agree_action = [&](RunAction a) {
    if (mpi) parallel::Comm::world().bcast(&a, sizeof a, 0);
    return a;
  };

  // A started run whose config the file now changes: refuse the whole sweep
  // before anything trains (a changed sweep is never mixed with the old one).
  std::string refused;
  if (root) {
    try {
      for (const std::string& c : changed_configs(plan)) refused += (refused.empty() ? "" : "\n") + c;
    } catch (const std::exception& e) {  // e.g. an unreadable stored config: still agree
      refused = e.what();
    }
  }
  refused = agree(refused);
  if (!refused.empty()) fail(refused);

  int rc = 0;
  int64_t trained = 0, skipped = 0, paused = 0;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const SweepRun& run = plan.runs[i];
    const RunAction action = agree_action(root ? decide(run, opt.train) : RunAction::Skip);
    if (action == RunAction::Skip) {
      if (opt.train && root) spdlog::info("[{}/{}] {}: complete, skipped", i + 1, plan.runs.size(), run.name);
      ++skipped;
      continue;
    }
    if (root) {
      fs::create_directories(run.dir);
      if (!fs::exists(run.config_file()))
        write_text_file_atomic(run.config_file(), run.config.to_json().dump(2) + "\n");
      spdlog::info("[{}/{}] {}: {} residual, {} non-embedding params, {} steps = {} tokens, "
                   "C = {:.3e} FLOPs", i + 1, plan.runs.size(), run.name,
                   model::residual_mode_name(run.config.model.mode), run.params, run.steps,
                   run.tokens, run.flops);
    }
    if (mpi) parallel::Comm::world().barrier();  // config.json exists before anyone trains
    const int code = train(run.config);
    ++trained;
    if (code == kExitNonFinite) {
      if (root) {
        RunOutcome o = outcome_from_metrics(run.metrics_file(), run.steps);
        o.status = "diverged";
        write_result(run, o);
        spdlog::warn("{}: non-finite loss or gradient; recorded as diverged (delete {} to retry)",
                     run.name, run.dir);
      }
      continue;
    }
    if (code != 0) {
      if (root)
        spdlog::warn("sweep stopped during {} (exit code {}); its checkpoint is kept: run the same "
                     "command again to resume", run.name, code);
      rc = code;
      break;
    }
    if (root) {
      const RunOutcome o = outcome_from_metrics(run.metrics_file(), run.steps);
      if (o.status == "done") {
        write_result(run, o);
        spdlog::info("{}: done, train loss {:.4f}, val loss {:.4f}, {:.1f} s", run.name,
                     o.train_loss, o.val_loss, o.wall_sec);
      } else {
        // run.stop_after ended this invocation early: the next one resumes.
        ++paused;
        spdlog::info("{}: stopped at step {} of {} (run.stop_after); run the sweep again to continue",
                     run.name, o.step, run.steps);
      }
    }
  }
  if (root) {
    if (opt.train)
      spdlog::info("sweep: {} runs trained or resumed this time, {} already complete{}", trained,
                   skipped, paused ? fmt::format(", {} paused by run.stop_after", paused) : "");
    write_outputs(plan, opt);
  }
  if (mpi) parallel::Comm::world().barrier();
  return rc;
}

}  // namespace attnres::train
