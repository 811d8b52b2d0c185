#include "train/sweep.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "core/subprocess.h"
#include "parallel/mpi.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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
  json fits = fit_sweep(plan, outcomes);
  if (!plan.ablation_reference.empty()) fits["ablation"] = ablation_sweep(plan, outcomes);
  write_text_file_atomic(fits_path, fits.dump(2) + "\n");
  const auto done = std::count_if(outcomes.begin(), outcomes.end(),
                                  [](const RunOutcome& o) { return o.status == "done"; });
  spdlog::info("sweep: {} of {} runs complete; wrote {} and {}", done, plan.runs.size(), csv, fits_path);
  // An ablation sweep compares its modes at one point: its table, not the
  // power laws (which need several points per mode).
  std::printf("%s", fits.contains("ablation") ? ablation_table(fits["ablation"]).c_str()
                                              : fits_table(fits).c_str());
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

// What a run's metrics say now. A torn last line (being written) is skipped
// by the reader; progress is best effort, never a reason to stop the sweep.
RunOutcome current_outcome(const SweepRun& run) {
  try {
    return outcome_from_metrics(run.metrics_file(), run.steps);
  } catch (const Error&) {
    return {};
  }
}
// Seconds until the run ends at its rate so far (o.step > 0).
double eta_seconds(const SweepRun& run, const RunOutcome& o) {
  return o.wall_sec / static_cast<double>(o.step) * static_cast<double>(run.steps - o.step);
}

// The CPUs this process may run on.
std::vector<int> own_cpus() {
  cpu_set_t set;
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  if (out.empty()) out.push_back(0);
  return out;
}

// The GPUs this process may give its runs: CUDA_VISIBLE_DEVICES's entries
// when it is set, else every device CUDA sees.
std::vector<std::string> own_gpus() {
  std::vector<std::string> out;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::istringstream in(v);
    for (std::string e; std::getline(in, e, ',');)
      if (!e.empty()) out.push_back(e);
    return out;
  }
  for (int i = 0; i < cuda::device_count(); ++i) out.push_back(std::to_string(i));
  return out;
}

// Without --jobs: for a sweep of small single-process CPU models, a run per
// CPU (1 thread each), which on 2 cores trained cpu_small.json faster than
// one run at a time on both cores (docs/sweeps.md); otherwise 1.
int default_jobs(const SweepPlan& plan) {
  for (const auto& r : plan.runs)
    if (r.config.training.device != Device::CPU || r.params_total > kSmallModelParams ||
        r.config.parallel.pipeline * r.config.parallel.data > 1)
      return 1;
  return static_cast<int>(own_cpus().size());
}

// --jobs N: the runs to train, up to N at once, each its own process.
int train_in_processes(const SweepPlan& plan, int max_jobs, const std::string& attnres_bin,
                       const std::vector<size_t>& todo) {
  const SignalGate gate;
  const std::vector<int> cpus = own_cpus();
  int jobs = std::max(1, std::min<int>(max_jobs, static_cast<int>(todo.size())));
  // Runs on GPUs: each job gets GPUs of its own, as many as its runs' ranks.
  int64_t gpu_ranks = 0;
  for (size_t i : todo)
    if (plan.runs[i].config.training.device == Device::CUDA)
      gpu_ranks = std::max(gpu_ranks, plan.runs[i].config.parallel.pipeline * plan.runs[i].config.parallel.data);
  std::vector<std::string> gpus;
  if (gpu_ranks > 0) {
    gpus = own_gpus();
    if (static_cast<int64_t>(gpus.size()) < gpu_ranks)
      fail("sweep --jobs: its runs train on cuda with up to ", gpu_ranks, " rank(s) (a GPU each), but "
           "this process sees ", gpus.size(), " GPU(s) (CUDA_VISIBLE_DEVICES or the devices present)");
    jobs = std::min<int>(jobs, static_cast<int>(static_cast<int64_t>(gpus.size()) / gpu_ranks));
  }
  const int per_job = std::max<int>(1, static_cast<int>(cpus.size()) / jobs);
  spdlog::info("sweep: {} runs to train, {} at a time, {} thread(s) each (CPUs {}..{} split, "
               "pinned apart){}", todo.size(), jobs, per_job, cpus.front(), cpus.back(),
               gpus.empty() ? "" : fmt::format(", {} GPU(s) each", gpu_ranks));
  struct Running {
    size_t run;
    pid_t pid;
    int slot;
  };
  std::vector<Running> running;
  std::vector<bool> slot_busy(static_cast<size_t>(jobs), false);
  size_t next = 0;
  int rc = 0, stop = 0;
  int64_t done = 0;
  double flops_done = 0;  // of the finished runs
  const auto t_start = std::chrono::steady_clock::now();
  auto last_report = t_start;
  auto report = [&] {
    std::string parts;
    double flops_now = flops_done, longest = 0;  // the running runs' longest ETA
    for (const auto& r : running) {
      const SweepRun& run = plan.runs[r.run];
      const RunOutcome o = current_outcome(run);
      flops_now += run.flops * static_cast<double>(o.step) / static_cast<double>(run.steps);
      if (o.step > 0) longest = std::max(longest, eta_seconds(run, o));
      parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", run.name, progress_text(run));
    }
    double flops_left = 0;
    for (size_t k = next; k < todo.size(); ++k) flops_left += plan.runs[todo[k]].flops;
    for (const auto& r : running) flops_left += plan.runs[r.run].flops;
    flops_left -= flops_now - flops_done;
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const double rate = spent > 0 ? flops_now / spent : 0;  // all jobs together
    // At the end fewer runs than jobs are left: the sweep lasts at least as
    // long as its slowest running run.
    spdlog::info("sweep: {} done, {} running ({}), {} left; sweep ETA {}", done, running.size(),
                 parts, todo.size() - next,
                 rate > 0 ? format_duration(std::max(longest, flops_left / rate)) : "?");
  };
  while (next < todo.size() || !running.empty()) {
    while (!stop && next < todo.size() && running.size() < static_cast<size_t>(jobs)) {
      const size_t i = todo[next++];
      const SweepRun& run = plan.runs[i];
      prepare_run(plan, i);
      const int slot = static_cast<int>(std::find(slot_busy.begin(), slot_busy.end(), false) - slot_busy.begin());
      slot_busy[static_cast<size_t>(slot)] = true;
      ChildSpec spec;
      const int64_t ranks = run.config.parallel.pipeline * run.config.parallel.data;
      if (ranks > 1) spec.argv = {"mpirun", "-np", std::to_string(ranks)};
      for (const std::string& a : {attnres_bin, std::string("train"), run.config_file()})
        spec.argv.push_back(a);
      spec.env = {{"OMP_NUM_THREADS", std::to_string(std::max<int64_t>(1, per_job / ranks))}};
      if (!gpus.empty()) {  // the slot's GPUs, one per rank
        std::string visible;
        for (int64_t g = 0; g < ranks; ++g)
          visible += (g ? "," : "") + gpus[static_cast<size_t>(slot * gpu_ranks + g)];
        spec.env.push_back({"CUDA_VISIBLE_DEVICES", visible});
      }
      for (int c = 0; c < per_job; ++c)
        spec.cpus.push_back(cpus[static_cast<size_t>((slot * per_job + c) % static_cast<int>(cpus.size()))]);
      spec.log_file = (fs::path(run.dir) / "train.log").string();
      running.push_back({i, spawn_child(spec, gate), slot});
    }
    if (const int sig = gate.wait(1.0); sig != 0 && !stop) {
      stop = sig;
      spdlog::warn("sweep: received {}: passed to the {} running run(s), which save and stop; "
                   "no new run starts", sig == SIGINT ? "SIGINT" : "SIGTERM", running.size());
      for (const auto& r : running) signal_child(r.pid, sig);
    }
    for (size_t k = 0; k < running.size();) {
      const auto ended = child_exited(running[k].pid);
      if (!ended) {
        ++k;
        continue;
      }
      const SweepRun& run = plan.runs[running[k].run];
      const RunEnd end = finish_run(run, ended->status);
      if (end == RunEnd::Failed) {
        const std::string why = last_reason_line(run);
        spdlog::warn("{}: {}{}; its checkpoint is kept: run the sweep again to resume (log: {})",
                     run.name, ended->describe(), why.empty() ? "" : ": " + why,
                     (fs::path(run.dir) / "train.log").string());
        if (rc == 0) rc = ended->status;
      } else {
        ++done;
        flops_done += run.flops;
      }
      slot_busy[static_cast<size_t>(running[k].slot)] = false;
      running.erase(running.begin() + static_cast<long>(k));
    }
    if (std::chrono::steady_clock::now() - last_report > std::chrono::seconds(10) && !running.empty()) {
      report();
      last_report = std::chrono::steady_clock::now();
    }
  }
  return rc != 0 ? rc : stop != 0 ? 128 + stop : 0;
}

}  // namespace

void prepare_run(const SweepPlan& plan, size_t i) {
  const SweepRun& run = plan.runs[i];
  fs::create_directories(run.dir);
  if (!fs::exists(run.config_file()))
    write_text_file_atomic(run.config_file(), run.config.to_json().dump(2) + "\n");
  spdlog::info("[{}/{}] {}: {} residual, {} non-embedding params, {} steps = {} tokens, "
               "C = {:.3e} FLOPs", i + 1, plan.runs.size(), run.name,
               model::residual_mode_name(run.config.model.mode), run.params, run.steps,
               run.tokens, run.flops);
}

RunEnd finish_run(const SweepRun& run, int code) {
  if (code == kExitNonFinite) {
    RunOutcome o = outcome_from_metrics(run.metrics_file(), run.steps);
    o.status = "diverged";
    write_result(run, o);
    spdlog::warn("{}: non-finite loss or gradient; recorded as diverged (delete {} to retry)",
                 run.name, run.dir);
    return RunEnd::Diverged;
  }
  if (code != 0) return RunEnd::Failed;
  const RunOutcome o = outcome_from_metrics(run.metrics_file(), run.steps);
  if (o.status == "done") {
    write_result(run, o);
    spdlog::info("{}: done, train loss {:.4f}, val loss {:.4f}, {:.1f} s", run.name, o.train_loss,
                 o.val_loss, o.wall_sec);
    return RunEnd::Done;
  }
  // run.stop_after ended this invocation early: the next one resumes.
  spdlog::info("{}: stopped at step {} of {} (run.stop_after); run the sweep again to continue",
               run.name, o.step, run.steps);
  return RunEnd::Paused;
}

std::string last_reason_line(const SweepRun& run) {
  std::ifstream in((fs::path(run.dir) / "train.log").string());
  std::string line, last;
  while (std::getline(in, line))
    if (line.find("error") != std::string::npos || line.find("the task ended") != std::string::npos)
      last = line;
  if (last.rfind('[', 0) == 0 && last.find("] ") != std::string::npos) {
    last = last.substr(last.find("] ") + 2);
    last = last.substr(last.find(' ') + 1);  // the level
  }
  return last;
}

std::string progress_text(const SweepRun& run) {
  const RunOutcome o = current_outcome(run);
  if (o.step <= 0) return "";
  return fmt::format("step {}/{} ETA {}", o.step, run.steps, format_duration(eta_seconds(run, o)));
}

int finish_task(const std::string& run_dir, int code) {
  SweepRun run;
  run.dir = run_dir;
  run.name = fs::path(run_dir).filename().string();
  run.config = load_config(run.config_file(), {});
  run.steps = run.config.training.steps;
  if (finish_run(run, code) == RunEnd::Failed) {
    const RunOutcome o = current_outcome(run);
    spdlog::warn("{}: the task ended with {} at step {} of {}; its checkpoints are kept, and "
                 "submitting the sweep again (--slurm) resubmits it: it resumes", run.name,
                 code > 128 ? fmt::format("signal {} ({})", code - 128, strsignal(code - 128))
                            : fmt::format("exit code {}", code),
                 o.step, run.steps);
  }
  return code;
}

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
  // (Processes need this binary's path: without it, one run at a time here.)
  const int jobs = opt.jobs > 0 ? opt.jobs : mpi || opt.attnres_bin.empty() ? 1 : default_jobs(plan);
  if (opt.jobs == 0 && jobs > 1 && opt.train)
    spdlog::info("sweep: small CPU models: {} runs at once, one per core (faster than the cores' "
                 "threads on one run at a time; --jobs 1 for that)", jobs);
  if (jobs > 1 && opt.train) {
    if (mpi) fail("sweep --jobs runs each run as a process of its own (through mpirun when its "
                  "layout has several ranks): start the sweep itself without mpirun");
    std::vector<size_t> todo;
    for (size_t i = 0; i < plan.runs.size(); ++i) {
      if (decide(plan.runs[i], true) == RunAction::Train) todo.push_back(i);
      else ++skipped;
    }
    // The costliest runs first: the last ones to start are then the short
    // ones, and the jobs end close together instead of one long run
    // finishing alone on an otherwise idle machine. (A run's numbers do not
    // depend on the order.)
    std::stable_sort(todo.begin(), todo.end(),
                     [&](size_t a, size_t b) { return plan.runs[a].flops > plan.runs[b].flops; });
    rc = train_in_processes(plan, jobs, opt.attnres_bin, todo);
    trained = static_cast<int64_t>(todo.size());
  } else {
    for (size_t i = 0; i < plan.runs.size(); ++i) {
      const SweepRun& run = plan.runs[i];
      const RunAction action = agree_action(root ? decide(run, opt.train) : RunAction::Skip);
      if (action == RunAction::Skip) {
        if (opt.train && root) spdlog::info("[{}/{}] {}: complete, skipped", i + 1, plan.runs.size(), run.name);
        ++skipped;
        continue;
      }
      if (root) prepare_run(plan, i);
      if (mpi) parallel::Comm::world().barrier();  // config.json exists before anyone trains
      const int code = train(run.config);
      ++trained;
      const RunEnd end = root                       ? finish_run(run, code)
                         : code == 0               ? RunEnd::Done
                         : code == kExitNonFinite ? RunEnd::Diverged
                                                  : RunEnd::Failed;
      if (end == RunEnd::Paused) ++paused;
      if (end == RunEnd::Failed) {
        if (root)
          spdlog::warn("sweep stopped during {} (exit code {}); its checkpoint is kept: run the same "
                       "command again to resume", run.name, code);
        rc = code;
        break;
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
