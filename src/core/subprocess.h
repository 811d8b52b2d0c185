// Child processes for the commands that run others (`attnres supervise`,
// `attnres sweep --jobs`, the Slurm commands of `attnres sweep --slurm`): started with fork + exec in a process group of
// their own, optionally with extra environment, a CPU set and a log file,
// and waited for without signal handlers: SIGINT, SIGTERM and SIGCHLD are
// blocked while a SignalGate lives and taken synchronously (sigtimedwait),
// so there is no global state. Linux.
#pragma once
#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnres {

// Blocks SIGINT, SIGTERM and SIGCHLD for this thread's lifetime of the gate
// (children get the mask from before it); restores the mask on destruction.
class SignalGate {
 public:
  SignalGate();
  ~SignalGate();
  SignalGate(const SignalGate&) = delete;
  SignalGate& operator=(const SignalGate&) = delete;

  // Waits up to `sec` seconds for SIGINT or SIGTERM (a SIGCHLD also ends the
  // wait early, to let the caller reap); returns the stop signal, or 0.
  int wait(double sec) const;
  const sigset_t& previous_mask() const { return old_; }

 private:
  sigset_t taken_, old_;
};

struct ChildSpec {
  std::vector<std::string> argv;                           // argv[0] looked up on PATH
  std::vector<std::pair<std::string, std::string>> env;    // variables set (name, value)
  std::vector<std::string> unset;                          // variables removed
  std::vector<int> cpus;                                   // CPU set; empty: inherited
  std::string log_file;                                    // stdout + stderr appended there; empty: inherited
};

// Starts the child (in its own process group) with the gate's previous
// signal mask. Throws attnres::Error when fork fails; a command that cannot
// be executed exits 127 with a message in its log.
pid_t spawn_child(const ChildSpec& spec, const SignalGate& gate);

// How a child ended.
struct ChildExit {
  int status = 0;  // exit code, or 128 + the signal that killed it
  int signal = 0;  // that signal; 0 when it exited
  std::string describe() const;  // "exit status 1", "killed by signal 9 (Killed)"
};

// The child's ending when it has ended (reaped), nullopt while it runs.
std::optional<ChildExit> child_exited(pid_t pid);

// Sends `sig` to the child's process group.
void signal_child(pid_t pid, int sig);

// `s` single-quoted for a POSIX shell (a ' inside becomes '\'').
std::string shell_quote(const std::string& s);

// A short command run to its end with its output captured (sbatch, squeue).
struct CommandResult {
  ChildExit exit;       // status 127: it could not be executed
  std::string out, err;  // its stdout and stderr
};
// Runs argv (argv[0] looked up on PATH) with this process's environment and
// no stdin, and waits for it. Throws attnres::Error only when it cannot fork.
CommandResult run_command(const std::vector<std::string>& argv);

}  // namespace attnres
