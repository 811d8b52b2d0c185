// Errors say whose fault they are: bad input is attnres::Error (exit 2),
// a broken invariant is attnres::InternalError (exit 1) with file and line.
#include <catch2/catch.hpp>
#include <string>

#include "core/error.h"

using namespace attnres;

TEST_CASE("ATTNRES_CHECK raises an internal error naming the file and line", "[core]") {
  const int line = __LINE__ + 2;
  try {
    ATTNRES_CHECK(1 + 1 == 3, "arithmetic ", 42);
    FAIL("no error");
  } catch (const InternalError& e) {
    const std::string what = e.what();
    CHECK(what.find("test_error.cpp:" + std::to_string(line)) != std::string::npos);
    CHECK(what.find("check `1 + 1 == 3` failed: arithmetic 42") != std::string::npos);
  }
}

TEST_CASE("fail raises a plain input error, not an internal one", "[core]") {
  bool internal = false, input = false;
  try {
    fail("config key x: bad");
  } catch (const InternalError&) {
    internal = true;
  } catch (const Error& e) {
    input = std::string(e.what()) == "config key x: bad";
  }
  CHECK_FALSE(internal);
  CHECK(input);
}
