// metrics.jsonl: one JSON object per line, flushed after each write so a
// crash loses at most the line being written. A resumed run appends.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace attnres::train {

class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool append);
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
