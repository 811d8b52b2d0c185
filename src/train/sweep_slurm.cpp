#include "train/sweep_slurm.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "core/subprocess.h"
#include "train/metrics.h"
#include "train/sweep.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string abs_path(const std::string& p) { return fs::absolute(p).lexically_normal().string(); }
std::string slurm_dir(const SweepPlan& plan) { return abs_path((fs::path(plan.out_dir) / "slurm").string()); }
std::string submissions_file(const SweepPlan& plan) {
  return (fs::path(slurm_dir(plan)) / "submissions.json").string();
}
// The jobs' name: the sweep's output directory, which tells sweeps apart.
std::string job_name(const SweepPlan& plan) {
  return "attnres-" + fs::path(abs_path(plan.out_dir)).filename().string();
}

// The #SBATCH lines both scripts share, and the environment they set.
std::string common_header(const SlurmOptions& opt) {
  std::string s = fmt::format("#SBATCH --chdir={}\n", opt.workdir);
  s += "#SBATCH --export=NONE\n";  // nothing from the submitting shell: all of it is below
  if (!opt.partition.empty()) s += "#SBATCH --partition=" + opt.partition + "\n";
  if (!opt.account.empty()) s += "#SBATCH --account=" + opt.account + "\n";
  if (!opt.time.empty()) s += "#SBATCH --time=" + opt.time + "\n";
  for (const auto& o : opt.sbatch_options) s += "#SBATCH " + o + "\n";
  return s;
}
std::string environment(const SlurmOptions& opt) {
  std::string s = "set -u\n";
  s += "export PATH=" + shell_quote(opt.path) + "\n";
  if (!opt.ld_library_path.empty())
    s += "export LD_LIBRARY_PATH=" + shell_quote(opt.ld_library_path) + "\n";
  for (const auto& [name, value] : opt.blas_env)
    s += "export " + name + "=" + shell_quote(value) + "\n";
  s += "attnres=" + shell_quote(opt.attnres_bin) + "\n";
  return s;
}

std::string now_iso() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", std::localtime(&t));
  return buf;
}

// Run name -> the Slurm task ("<array>_<i>") that trains it in the newest
// submission that has it.
std::map<std::string, std::string> task_of_runs(const json& submissions) {
  std::map<std::string, std::string> task;
  for (const auto& s : submissions)
    for (const auto& a : s.at("arrays")) {
      const auto& runs = a.at("runs");
      for (size_t i = 0; i < runs.size(); ++i)
        task[runs[i].get<std::string>()] = a.at("job").get<std::string>() + "_" + std::to_string(i);
    }
  return task;
}

// <out_dir>/slurm/submissions.json (an empty array when there is none), and
// from it task_of_runs.
json read_submissions(const SweepPlan& plan, std::map<std::string, std::string>& task) {
  const std::string p = submissions_file(plan);
  if (!fs::exists(p)) return json::array();
  try {
    json j = json::parse(read_text_file(p));
    if (!j.is_array()) fail("not a JSON array");
    task = task_of_runs(j);
    return j;
  } catch (const std::exception& e) {
    fail(p, ": damaged record of the sweep's Slurm submissions (", e.what(),
         "); move it away to submit again (the runs' directories are what counts)");
  }
}

// `sbatch --parsable [args] SCRIPT`: the job id.
std::string sbatch(const std::vector<std::string>& args, const std::string& script) {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(script);
  const CommandResult r = run_command(argv);
  std::string out = r.out;
  out = out.substr(0, out.find_first_of(";\n"));  // "<id>" or "<id>;<cluster>"
  if (r.exit.status != 0 || out.empty() ||
      out.find_first_not_of("0123456789") != std::string::npos)
    fail("sbatch ", script, " failed (", r.exit.describe(), "): ", r.err.empty() ? r.out : r.err);
  return out;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::string array_script(const SweepPlan& plan, const std::vector<size_t>& runs, int64_t ranks,
                         const SlurmOptions& opt) {
  ATTNRES_CHECK(!runs.empty(), "array_script: no runs");
  const Config& first = plan.runs[runs.front()].config;
  const int gpus = opt.gpus_per_run >= 0 ? opt.gpus_per_run
                   : first.training.device == Device::CUDA ? static_cast<int>(ranks)
                                                           : 0;
  std::string s = "#!/bin/bash\n";
  s += fmt::format(
      "# Written by `attnres sweep --slurm` (docs/sweeps.md) for the sweep\n"
      "#   {}\n"
      "# A job array: task i trains runs[i] with `attnres train` (resume = auto: a requeued\n"
      "# or resubmitted task continues from its run's newest checkpoint), then records the\n"
      "# run's end with `attnres sweep --finish`.\n",
      opt.sweep_file);
  s += "#SBATCH --job-name=" + job_name(plan) + "\n";
  s += fmt::format("#SBATCH --array=0-{}{}\n", runs.size() - 1,
                   opt.max_running > 0 ? "%" + std::to_string(opt.max_running) : "");
  s += "#SBATCH --output=" + slurm_dir(plan) + "/%A_%a.out\n";
  s += "#SBATCH --open-mode=append\n";
  s += "#SBATCH --requeue\n";              // preempted or failed nodes: the task runs again
  s += "#SBATCH --signal=B:USR1@300\n";    // 5 minutes before --time: save, stop, requeue
  s += fmt::format("#SBATCH --ntasks={}\n", ranks);
  if (opt.cpus_per_rank > 0) s += fmt::format("#SBATCH --cpus-per-task={}\n", opt.cpus_per_rank);
  // One GPU per rank: --gpus-per-task keeps each rank's GPU on its node
  // wherever Slurm places the ranks (each sees its own as device 0).
  if (gpus > 0 && gpus == ranks) s += "#SBATCH --gpus-per-task=1\n";
  else if (gpus > 0) s += fmt::format("#SBATCH --gpus={}\n", gpus);
  s += common_header(opt);
  s += environment(opt);
  s += "export OMP_NUM_THREADS=\"${SLURM_CPUS_PER_TASK:-1}\"\n";
  if (ranks > 1) s += "export SLURM_EXPORT_ENV=ALL  # srun's steps get this environment\n";
  s += "runs=(";
  for (size_t i : runs) s += "\n  " + shell_quote(plan.runs[i].name);
  s += "\n)\n";
  s += "run=\"${runs[$SLURM_ARRAY_TASK_ID]}\"\n";
  s += "dir=" + shell_quote(abs_path((fs::path(plan.out_dir) / "runs").string())) + "/\"$run\"\n";
  s += "task=\"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"\n";
  s += "log=\"$dir/train.log\"\n";
  s += "echo \"[$(date '+%F %T')] Slurm task $task on $(hostname) (restart ${SLURM_RESTART_COUNT:-0}): "
       "training $run\" >>\"$log\"\n";
  // SIGTERM (scancel, preemption) and SIGUSR1 (--time nearly over) are
  // passed to the trainer, which saves a checkpoint and stops. It runs in the
  // background so that this shell can take signals while it waits.
  s += "pid=\"\"\n"
       "requeue=0\n"
       "trap 'kill -TERM \"$pid\" 2>/dev/null' TERM INT\n"
       "trap 'requeue=1; kill -TERM \"$pid\" 2>/dev/null' USR1\n";
  s += ranks > 1 ? fmt::format("srun --ntasks={} --kill-on-bad-exit=1 ", ranks) : std::string();
  s += "\"$attnres\" train \"$dir/config.json\" >>\"$log\" 2>&1 &\n";
  s += "pid=$!\n"
       "wait \"$pid\"\n"
       "while kill -0 \"$pid\" 2>/dev/null; do wait \"$pid\"; done  # a signal ended the wait\n"
       "wait \"$pid\"; rc=$?\n"
       "\"$attnres\" sweep --finish \"$dir\" \"$rc\" >>\"$log\" 2>&1\n"
       "if [[ $requeue == 1 && ! -e \"$dir/result.json\" ]]; then\n"
       "  echo \"[$(date '+%F %T')] Slurm task $task: time limit near, checkpoint saved; requeued\" >>\"$log\"\n"
       "  scontrol requeue \"$task\"\n"
       "fi\n"
       "exit \"$rc\"\n";
  return s;
}

std::string collect_script(const SweepPlan& plan, const SlurmOptions& opt) {
  std::string s = "#!/bin/bash\n";
  s += fmt::format(
      "# Written by `attnres sweep --slurm` (docs/sweeps.md) for the sweep\n"
      "#   {}\n"
      "# After the sweep's job arrays end: results.csv, fits.json and the figures.\n",
      opt.sweep_file);
  s += "#SBATCH --job-name=" + job_name(plan) + "-collect\n";
  s += "#SBATCH --output=" + slurm_dir(plan) + "/collect_%j.out\n";
  s += "#SBATCH --ntasks=1\n";
  s += common_header(opt);
  s += environment(opt);
  s += "export OMP_NUM_THREADS=\"${SLURM_CPUS_PER_TASK:-1}\"\n";
  s += "exec \"$attnres\" sweep " + shell_quote(opt.sweep_file) + " --report";
  for (const auto& o : opt.overrides) s += " " + shell_quote(o);
  s += "\n";
  return s;
}

std::map<std::string, std::string> slurm_queue() {
  const CommandResult r =
      run_command({"squeue", "--noheader", "--array", "--me", "--format=%i|%T"});
  if (r.exit.status != 0)
    fail("cannot read Slurm's queue: squeue ", r.exit.describe(), r.err.empty() ? "" : ": " + r.err);
  std::map<std::string, std::string> q;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    const size_t bar = line.find('|');
    if (bar != std::string::npos) q[line.substr(0, bar)] = line.substr(bar + 1);
  }
  return q;
}

int submit_sweep(const SweepPlan& plan, const SlurmOptions& opt) {
  if (const auto changed = changed_configs(plan); !changed.empty()) {
    std::string msg;
    for (const auto& c : changed) msg += c + "\n";
    fail(msg, changed.size(), " started run(s) would be refused: nothing submitted");
  }
  std::map<std::string, std::string> task;
  const json submissions = read_submissions(plan, task);
  std::map<std::string, std::string> queue;
  if (!submissions.empty()) {
    if (opt.dry_run) {
      try {
        queue = slurm_queue();
      } catch (const Error& e) {
        spdlog::warn("{} (dry run: every unfinished run is listed)", e.what());
      }
    } else {
      queue = slurm_queue();
    }
  }
  auto active = [&](const SweepRun& r) -> std::string {
    auto t = task.find(r.name);
    return t != task.end() && queue.count(t->second) ? t->second : "";
  };

  // Unfinished runs not already in the queue, by rank count.
  std::map<int64_t, std::vector<size_t>> groups;
  std::set<std::string> busy_arrays;
  int64_t complete = 0, queued = 0;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const SweepRun& run = plan.runs[i];
    if (fs::exists(run.result_file())) {
      ++complete;
      continue;
    }
    if (const std::string t = active(run); !t.empty()) {
      ++queued;
      busy_arrays.insert(t.substr(0, t.find('_')));
      continue;
    }
    const int64_t ranks = run.config.parallel.pipeline * run.config.parallel.data;
    if (opt.ranks_per_run > 0 && opt.ranks_per_run != ranks)
      fail(plan.source, " (run ", run.name, "): --ranks-per-run ", opt.ranks_per_run,
           " but the run's layout has parallel.pipeline * parallel.data = ", ranks,
           " ranks; set the layout with --parallel.pipeline=P --parallel.data=D");
    groups[ranks].push_back(i);
  }
  // The costliest runs first (Slurm starts an array's tasks in order): the
  // last to start are then short ones.
  for (auto& [ranks, runs] : groups)
    std::stable_sort(runs.begin(), runs.end(),
                     [&](size_t a, size_t b) { return plan.runs[a].flops > plan.runs[b].flops; });
  if (groups.empty()) {
    std::printf("nothing to submit: %lld of %zu runs complete, %lld queued or running in Slurm\n",
                static_cast<long long>(complete), plan.runs.size(), static_cast<long long>(queued));
    return 0;
  }

  const size_t number = submissions.size() + 1;  // this submission's number, for file names
  const std::string dir = slurm_dir(plan);
  json record = {{"submitted", now_iso()}, {"arrays", json::array()}};
  std::vector<std::string> after(busy_arrays.begin(), busy_arrays.end());
  if (!opt.dry_run) fs::create_directories(dir);
  for (const auto& [ranks, runs] : groups) {
    const std::string script = array_script(plan, runs, ranks, opt);
    const std::string path =
        fmt::format("{}/sweep_{}{}.sbatch", dir, number, groups.size() > 1 ? fmt::format("_np{}", ranks) : "");
    json names = json::array();
    for (size_t i : runs) names.push_back(plan.runs[i].name);
    if (opt.dry_run) {
      std::printf("# ---- %s (%zu tasks, not submitted) ----\n%s", path.c_str(), runs.size(), script.c_str());
      continue;
    }
    for (size_t i : runs) prepare_run(plan, i);
    write_text_file_atomic(path, script);
    const std::string job = sbatch({}, path);
    after.push_back(job);
    record["arrays"].push_back({{"job", job}, {"script", path}, {"runs", names}});
    spdlog::info("submitted job array {}: {} task(s) of {} rank(s) ({})", job, runs.size(), ranks, path);
    // Recorded at once: a failure below must not forget a submitted array.
    json all = submissions;
    all.push_back(record);
    write_text_file_atomic(submissions_file(plan), all.dump(2) + "\n");
  }
  const std::string collect = collect_script(plan, opt);
  const std::string collect_path = fmt::format("{}/collect_{}.sbatch", dir, number);
  if (opt.dry_run) {
    std::printf("# ---- %s (submitted with --dependency=afterany:<the arrays above%s>) ----\n%s",
                collect_path.c_str(), busy_arrays.empty() ? "" : " and the sweep's queued arrays",
                collect.c_str());
    return 0;
  }
  write_text_file_atomic(collect_path, collect);
  std::string dependency = "--dependency=afterany";
  for (const auto& a : after) dependency += ":" + a;
  const std::string collect_job = sbatch({dependency}, collect_path);
  record["collect"] = {{"job", collect_job}, {"script", collect_path}, {"after", after}};
  json all = submissions;
  all.push_back(record);
  write_text_file_atomic(submissions_file(plan), all.dump(2) + "\n");
  size_t n = 0;
  for (const auto& g : groups) n += g.second.size();
  spdlog::info("submitted {} run(s) ({} complete, {} already queued or running); collect job {} "
               "runs `attnres sweep --report` after job(s) {}. Progress: attnres sweep {} --status",
               n, complete, queued, collect_job, fmt::join(after, ", "), opt.sweep_file);
  return 0;
}

std::vector<RunState> sweep_states(const SweepPlan& plan, std::string& queue_note) {
  std::map<std::string, std::string> task;
  const json submissions = read_submissions(plan, task);
  std::map<std::string, std::string> queue;
  bool queried = false;
  if (submissions.empty()) {
    queue_note = "not submitted to Slurm";
  } else {
    try {
      queue = slurm_queue();
      queried = true;
      queue_note = "Slurm's queue read";
    } catch (const Error& e) {
      queue_note = std::string("Slurm's queue not read: ") + e.what();
    }
  }
  std::vector<RunState> states;
  for (const SweepRun& run : plan.runs) {
    RunState st;
    const RunOutcome o = read_outcome(run);
    auto t = task.find(run.name);
    auto q = t == task.end() ? queue.end() : queue.find(t->second);
    if (fs::exists(run.result_file())) {
      st.state = o.status;
      st.detail = fmt::format("step {}, train loss {:.4f}, val loss {:.4f}", o.step, o.train_loss, o.val_loss);
    } else if (q != queue.end()) {
      const std::string progress = progress_text(run);
      st.state = q->second == "PENDING" ? "queued" : lower(q->second);
      st.detail = (progress.empty() ? "" : progress + ", ") + "job " + q->first;
    } else if (o.status == "done") {  // trained to the end; `--finish` has not run (yet)
      st.state = "done";
      st.detail = fmt::format("step {}, val loss {:.4f} (no result.json yet)", o.step, o.val_loss);
    } else if (o.status == "new" && !fs::exists(fs::path(run.dir) / "train.log")) {
      st.state = "not started";
    } else {
      const std::string why = last_reason_line(run);
      const std::string at = fmt::format("step {}/{}", o.step, run.steps);
      if (queried || !why.empty()) {
        st.state = "failed";
        st.detail = at + (why.empty() ? "" : ": " + why);
      } else {  // a local sweep may be training it right now
        st.state = "started";
        std::error_code ec;
        const auto written = fs::last_write_time(run.metrics_file(), ec);
        st.detail = at;
        if (!ec)
          st.detail += ", metrics written " +
                       format_duration(std::chrono::duration<double>(
                                           fs::file_time_type::clock::now() - written).count()) +
                       " ago";
      }
    }
    states.push_back(std::move(st));
  }
  return states;
}

int print_status(const SweepPlan& plan) {
  std::string note;
  const std::vector<RunState> states = sweep_states(plan, note);
  size_t width = 3;
  for (const auto& r : plan.runs) width = std::max(width, r.name.size());
  std::printf("sweep %s: %zu runs in %s (%s)\n", plan.source.c_str(), plan.runs.size(),
              plan.out_dir.c_str(), note.c_str());
  std::map<std::string, int> counts;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    std::string line = fmt::format("  {:<{}}  {:<11} {}", plan.runs[i].name, width, states[i].state,
                                   states[i].detail);
    line.erase(line.find_last_not_of(' ') + 1);
    std::printf("%s\n", line.c_str());
    ++counts[states[i].state];
  }
  std::string summary;
  for (const auto& [state, n] : counts) summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", n, state);
  std::printf("%s\n", summary.c_str());
  return 0;
}

}  // namespace attnres::train
