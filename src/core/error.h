// Errors: exceptions with context at the boundary, checked conditions inside.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace attnres {

// Every error the library raises. The message names the file/key and the reason;
// the CLI prints it and exits 2 (bad input: config, data, checkpoint, arguments).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Our fault, not the user's: a broken invariant (ATTNRES_CHECK) or a failed
// CUDA / cuBLAS / NCCL / MPI call. The message carries the source file and
// line; the CLI prints "internal error: ..." and exits 1.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throw an attnres::Error built from the streamed arguments.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

// Throw an attnres::InternalError built from the streamed arguments.
template <typename... Args>
[[noreturn]] void fail_internal(const Args&... args) {
  throw InternalError(detail::concat(args...));
}

}  // namespace attnres

// Internal invariant check: throws attnres::InternalError with file:line.
#define ATTNRES_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::attnres::fail_internal(__FILE__, ":", __LINE__, ": check `", #cond, "` failed: ", \
                               __VA_ARGS__);                                              \
  } while (0)
