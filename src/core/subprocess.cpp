#include "core/subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace attnres {

SignalGate::SignalGate() {
  sigemptyset(&taken_);
  sigaddset(&taken_, SIGINT);
  sigaddset(&taken_, SIGTERM);
  sigaddset(&taken_, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &taken_, &old_);
}

SignalGate::~SignalGate() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

int SignalGate::wait(double sec) const {
  if (!(sec > 0)) return 0;
  const double whole = std::floor(sec);
  const timespec ts{static_cast<time_t>(whole), static_cast<long>((sec - whole) * 1e9)};
  siginfo_t info;
  const int sig = sigtimedwait(&taken_, &info, &ts);
  return sig == SIGINT || sig == SIGTERM ? sig : 0;
}

pid_t spawn_child(const ChildSpec& spec, const SignalGate& gate) {
  ATTNRES_CHECK(!spec.argv.empty(), "spawn_child: no command");
  // Everything the child needs, prepared before fork: between fork and exec
  // a child of a multithreaded process may only make async-signal-safe calls
  // (no allocation, no setenv).
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = std::find(spec.unset.begin(), spec.unset.end(), name) != spec.unset.end();
    for (const auto& [n, v] : spec.env) replaced = replaced || n == name;
    if (!replaced) env_strings.push_back(entry);
  }
  for (const auto& [n, v] : spec.env) env_strings.push_back(n + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : spec.cpus) CPU_SET(c, &set);
  const std::string cannot_run = "cannot run '" + spec.argv[0] + "'\n";
  const std::string cannot_open = "cannot open " + spec.log_file + "\n";
  const pid_t pid = fork();
  if (pid < 0) fail("cannot start '", spec.argv[0], "': fork failed: ", std::strerror(errno));
  if (pid > 0) {
    setpgid(pid, pid);  // also here: no race with the first signal sent to the group
    return pid;
  }
  setpgid(0, 0);
  if (!spec.log_file.empty()) {
    const int fd = open(spec.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      (void)!write(STDERR_FILENO, cannot_open.data(), cannot_open.size());
      _exit(127);
    }
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
  }
  if (!spec.cpus.empty()) sched_setaffinity(0, sizeof set, &set);
  pthread_sigmask(SIG_SETMASK, &gate.previous_mask(), nullptr);
  execvpe(argv[0], argv.data(), envp.data());
  (void)!write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
  _exit(127);
}

std::string ChildExit::describe() const {
  if (signal != 0) return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exit status " + std::to_string(status);
}

std::optional<ChildExit> child_exited(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r < 0) fail("waitpid(", pid, ") failed: ", std::strerror(errno));
  if (r == 0) return std::nullopt;
  ChildExit e;
  if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
    e.status = 128 + e.signal;
  } else {
    e.status = WEXITSTATUS(status);
  }
  return e;
}

void signal_child(pid_t pid, int sig) { kill(-pid, sig); }

}  // namespace attnres
