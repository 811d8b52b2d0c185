// metrics.jsonl: one JSON object per line, flushed after each write so a
// crash loses at most the line being written. A resumed run appends, after
// dropping the records of steps past its checkpoint (a run that went on
// after its last checkpoint and then died wrote those; the resumed run
// writes them again).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace attnres::train {

// A duration for progress lines and ETAs: "4m07s", "2h05m"; "?" when not a
// finite, non-negative number of seconds.
std::string format_duration(double sec);

class MetricsWriter {
 public:
  // append: keep the file's records up to and including step `resumed_step`
  // and drop the rest (from the first record of a later step on, and a line
  // torn by a crash); at step 0 (a restart that resumed from nothing) keep
  // only the restart records. Otherwise start the file afresh.
  MetricsWriter(const std::string& path, bool append, int64_t resumed_step = 0);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // Doubles are written in nlohmann's shortest round-trip form.
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace attnres::train
