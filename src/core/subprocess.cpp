#include "core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
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

namespace {
// A wait status as a ChildExit.
ChildExit exit_of(int status) {
  ChildExit e;
  if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
    e.status = 128 + e.signal;
  } else {
    e.status = WEXITSTATUS(status);
  }
  return e;
}
}  // namespace

std::optional<ChildExit> child_exited(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r < 0) fail("waitpid(", pid, ") failed: ", std::strerror(errno));
  if (r == 0) return std::nullopt;
  return exit_of(status);
}

void signal_child(pid_t pid, int sig) { kill(-pid, sig); }

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

namespace {
// A file descriptor closed on destruction.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};
}  // namespace

CommandResult run_command(const std::vector<std::string>& argv) {
  ATTNRES_CHECK(!argv.empty(), "run_command: no command");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) fail("cannot run '", argv[0], "': pipe: ", std::strerror(errno));
  Fd out_r(out_pipe[0]), out_w(out_pipe[1]);
  if (pipe2(err_pipe, O_CLOEXEC) != 0) fail("cannot run '", argv[0], "': pipe: ", std::strerror(errno));
  Fd err_r(err_pipe[0]), err_w(err_pipe[1]);
  const std::string cannot_run = "cannot run '" + argv[0] + "': " + "not found or not executable\n";
  const pid_t pid = fork();
  if (pid < 0) fail("cannot run '", argv[0], "': fork failed: ", std::strerror(errno));
  if (pid == 0) {  // async-signal-safe calls only (see spawn_child)
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(out_w.fd, STDOUT_FILENO);
    dup2(err_w.fd, STDERR_FILENO);
    execvp(args[0], args.data());
    (void)!write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
    _exit(127);
  }
  out_w.reset();
  err_w.reset();
  // Both pipes at once: a command that fills one while we block on the
  // other would never end.
  CommandResult r;
  pollfd fds[2] = {{out_r.fd, POLLIN, 0}, {err_r.fd, POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  char buf[4096];
  for (int open_fds = 2; open_fds > 0;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || fds[k].revents == 0) continue;
      const ssize_t n = read(fds[k].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[k]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[k].fd = -1;  // closed (the Fd closes it)
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit = exit_of(status);
  return r;
}

}  // namespace attnres
