// Errors: exceptions with context at the boundary, checked conditions inside.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace attnres {

// Every error the library raises. The message names the file/key and the reason;
// the CLI prints it and exits non-zero.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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

}  // namespace attnres

// Internal invariant / argument check: throws attnres::Error with file:line.
#define ATTNRES_CHECK(cond, ...)                                                   \
  do {                                                                             \
    if (!(cond))                                                                   \
      ::attnres::fail(__FILE__, ":", __LINE__, ": check `", #cond, "` failed: ",   \
                      __VA_ARGS__);                                                \
  } while (0)
