// An environment variable put back as it was when the scope ends (RAII), for
// tests and benchmarks that run the same code under different settings
// (e.g. ATTNRES_MIX_KERNELS). Not thread-safe, like setenv itself.
#pragma once
#include <cstdlib>
#include <string>

namespace attnres {

class ScopedEnv {
 public:
  // Remembers `name` (set or not); sets it to `value` when one is given.
  explicit ScopedEnv(const char* name, const char* value = nullptr) : name_(name) {
    const char* v = std::getenv(name);
    had_ = v != nullptr;
    if (had_) old_ = v;
    if (value) setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace attnres
