// Config tests' helper: the error a config's validation reports ("" when it
// is valid), so a test can check that a bad key is refused and named.
#pragma once
#include <string>

#include "core/error.h"
#include "train/config.h"

namespace attnres::testing {

inline std::string config_error(const train::json& j) {
  try {
    train::Config::from_json(j, "cfg.json").validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace attnres::testing
