// attnres supervise [--max-restarts N] [--backoff SEC] -- COMMAND...
//
// Runs COMMAND (typically `mpirun -np 4 build/attnres train cfg.json`) and,
// when it fails in a way that a restart can cure, runs it again with
// `--checkpoint.resume=auto` appended: the run continues from its newest
// checkpoint that verifies, bit-identical to a run that never failed
// (resume is exact). Restartable: killed by a signal, or an exit status of
// 1 (a runtime error: a dead rank makes mpirun exit so) or 128+N (a signal
// reported by the launcher). Never restarted: 0 (done), 2 (bad input: the
// same input fails the same way), 3 (non-finite loss: the same data
// diverges the same way), any other status, and a command this supervisor
// itself was asked to stop (SIGINT / SIGTERM are forwarded to it, and its
// status is returned). Between attempts it waits --backoff seconds, doubled
// after each restart (at most 10 minutes). Each restart is logged on stderr
// and passed to the command in ATTNRES_RESTART (JSON), which `attnres train`
// writes into metrics.jsonl as {"event": "restart", ...} with the step it
// resumed from.
//
// Signals are not caught by handlers (core/subprocess.h: SignalGate). The
// command runs in a process group of its own (a terminal's Ctrl-C reaches it
// once, through this process).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/subprocess.h"
#include "tools/commands.h"

namespace attnres::tools {

namespace {

const char* kHelp =
    "usage: attnres supervise [--max-restarts N] [--backoff SEC] -- COMMAND [ARG...]\n"
    "  Runs COMMAND; when it is killed by a signal or exits with 1 or 128+N, runs it again\n"
    "  with --checkpoint.resume=auto appended (up to N times, default 3), after SEC seconds\n"
    "  (default 10), doubled after each restart. Exit statuses 0, 2 (bad input) and 3 (NaN)\n"
    "  end it. SIGINT / SIGTERM are passed to COMMAND, which is then not restarted. Each\n"
    "  restart is logged, and written to the run's metrics.jsonl by attnres train.\n"
    "  Example: attnres supervise --max-restarts 5 -- mpirun -np 4 build/attnres train cfg.json";

// How one attempt ended: the child's exit, and whether this supervisor was
// asked to stop (SIGINT / SIGTERM, passed on to the command).
struct Ending {
  ChildExit exit;
  bool stopped = false;
};

bool restartable(const Ending& e) {
  if (e.stopped) return false;
  if (e.exit.signal != 0) return true;
  return e.exit.status == 1 || e.exit.status > 128;
}

// Waits for `pid`, passing SIGINT / SIGTERM on to its process group.
Ending wait_for(pid_t pid, const SignalGate& gate) {
  Ending e;
  while (true) {
    if (auto x = child_exited(pid)) {
      e.exit = *x;
      return e;
    }
    if (const int sig = gate.wait(1.0)) {  // a SIGCHLD ends the wait early too
      e.stopped = true;
      signal_child(pid, sig);
      spdlog::warn("supervise: received {}, passed to the command; it will not be restarted",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
  }
}

// Sleeps `sec`, or less when SIGINT / SIGTERM comes: returns false then.
bool back_off(double sec, const SignalGate& gate) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(sec);
  while (true) {
    const double left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
    if (left <= 0) return true;
    if (gate.wait(left) != 0) return false;
  }
}

}  // namespace

int cmd_supervise(const Args& args) {
  int max_restarts = 3;
  double backoff = 10;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::puts(kHelp);
      return 0;
    }
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= args.size()) fail("supervise: ", flag, " needs a value");
      return args[++i];
    };
    try {
      if (a == "--max-restarts") {
        const std::string v = value("--max-restarts");
        size_t used = 0;
        max_restarts = std::stoi(v, &used);
        if (used != v.size() || max_restarts < 0) throw std::invalid_argument(v);
      } else if (a == "--backoff") {
        const std::string v = value("--backoff");
        size_t used = 0;
        backoff = std::stod(v, &used);
        if (used != v.size() || !(backoff >= 0)) throw std::invalid_argument(v);
      } else {
        fail("supervise: unknown option '", a, "' (the command follows --)\n", kHelp);
      }
    } catch (const std::logic_error&) {
      fail("supervise: ", a, " takes a number >= 0, got '", args[i], "'");
    }
  }
  if (i + 1 >= args.size()) fail("supervise: no command after --\n", kHelp);
  std::vector<std::string> command(args.begin() + static_cast<long>(i) + 1, args.end());

  const SignalGate gate;
  std::string restart_env;
  for (int attempt = 0;; ++attempt) {
    const auto t0 = std::chrono::steady_clock::now();
    ChildSpec spec;
    spec.argv = command;
    if (restart_env.empty()) spec.unset = {"ATTNRES_RESTART"};
    else spec.env = {{"ATTNRES_RESTART", restart_env}};
    const Ending e = wait_for(spawn_child(spec, gate), gate);
    const double ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (e.exit.status == 0) {
      if (attempt > 0) spdlog::info("supervise: the command finished after {} restart(s)", attempt);
      return 0;
    }
    if (!restartable(e)) {
      spdlog::error("supervise: the command ended with {} after {:.1f} s: {}", e.exit.describe(), ran,
                    e.stopped ? "stopped on request, not restarted"
                              : "not restartable (2: bad input, 3: non-finite loss, or another "
                                "status that a restart would not change)");
      return e.exit.status;
    }
    if (attempt == max_restarts) {
      spdlog::error("supervise: the command ended with {} after {:.1f} s; no restart left ({} "
                    "made, --max-restarts {})", e.exit.describe(), ran, attempt, max_restarts);
      return e.exit.status;
    }
    const double wait = std::min(backoff * std::pow(2.0, attempt), 600.0);
    spdlog::warn("supervise: the command ended with {} after {:.1f} s; restart {} of {} in {:.0f} s "
                 "with --checkpoint.resume=auto", e.exit.describe(), ran, attempt + 1, max_restarts, wait);
    if (!back_off(wait, gate)) {
      spdlog::warn("supervise: stopped during the back-off; not restarting");
      return e.exit.status;
    }
    if (attempt == 0) command.push_back("--checkpoint.resume=auto");
    restart_env = nlohmann::json{{"restart", attempt + 1},
                                 {"previous_status", e.exit.status},
                                 {"previous_signal", e.exit.signal},
                                 {"reason", e.exit.describe()}}
                      .dump();
  }
}

}  // namespace attnres::tools
