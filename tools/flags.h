// Minimal command-line flag parsing for the subcommands: `--name value` or
// `--name=value`, repeated flags collected in order, anything else positional.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace attnres::tools {

// All of `v` as a whole number, or nothing (empty, other characters, out of range).
inline std::optional<long long> to_int(const std::string& v) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

class Flags {
 public:
  // `known` lists the accepted flag names (without dashes); `boolean` those
  // that take no value: `--name` or `--name=true` sets one, `--name=false`
  // unsets it (the last one given wins). Unknown flags, and a boolean given
  // another value, are an error naming the command and the flag.
  Flags(const std::vector<std::string>& args, const std::string& command,
        const std::set<std::string>& known, const std::set<std::string>& boolean = {}) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a.rfind("--", 0) != 0 || a.size() == 2) {
        positional_.push_back(a);
        continue;
      }
      std::string name = a.substr(2), value;
      auto eq = name.find('=');
      bool has_value = eq != std::string::npos;
      if (has_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (!known.count(name) && !boolean.count(name))
        fail(command, ": unknown option --", name, " (see `attnres ", command, " --help`)");
      if (boolean.count(name)) {
        if (has_value && value != "true" && value != "false")
          fail(command, ": option --", name, " is a switch: give --", name, ", --", name,
               "=true or --", name, "=false, not '", value, "'");
        if (has_value && value == "false")
          values_.erase(name);
        else
          values_[name].push_back("true");
        continue;
      }
      if (!has_value) {
        if (i + 1 >= args.size()) fail(command, ": option --", name, " needs a value");
        value = args[++i];
      }
      values_[name].push_back(value);
    }
  }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second.back();
  }
  std::string required(const std::string& name, const std::string& command) const {
    if (!has(name)) fail(command, ": missing required option --", name);
    return get(name, "");
  }
  std::vector<std::string> all(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  long long get_int(const std::string& name, long long fallback, const std::string& command) const {
    if (!has(name)) return fallback;
    const std::string v = get(name, "");
    if (const auto x = to_int(v)) return *x;
    fail(command, ": option --", name, " needs an integer, got '", v, "'");
  }
  double get_double(const std::string& name, double fallback, const std::string& command) const {
    if (!has(name)) return fallback;
    std::string v = get(name, "");
    try {
      size_t used = 0;
      double x = std::stod(v, &used);
      if (used == v.size()) return x;
    } catch (...) {
    }
    fail(command, ": option --", name, " needs a number, got '", v, "'");
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

// A command's arguments that override config keys (--section.key=value) and
// the rest (its own flags and positionals), in order.
inline std::pair<std::vector<std::string>, std::vector<std::string>> split_config_overrides(
    const std::vector<std::string>& args) {
  std::vector<std::string> flags, overrides;
  for (const auto& a : args)
    (a.rfind("--", 0) == 0 && a.find('.') != std::string::npos && a.find('=') != std::string::npos
         ? overrides
         : flags)
        .push_back(a);
  return {flags, overrides};
}

}  // namespace attnres::tools
