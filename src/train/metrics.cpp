#include "train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/fileio.h"

namespace attnres::train {

std::string format_duration(double sec) {
  if (!std::isfinite(sec) || sec < 0) return "?";
  const auto s = static_cast<long long>(sec + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s / 60 % 60);
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  return buf;
}

namespace {
bool is_restart(const nlohmann::json& j) {
  return j.is_object() && j.value("event", std::string()) == "restart";
}

// Rewrites `path` without the records of steps after `step` (atomically). At
// step 0 nothing the earlier attempts trained or measured is kept (the run
// starts over and writes it again), only their restart records.
void drop_records_after(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  std::istringstream in(read_text_file(path));
  std::string line, kept;
  int64_t dropped = 0;
  bool past = false;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer())
      past = j["step"].get<int64_t>() > step || (step == 0 && !is_restart(j));
    else if (j.is_discarded())
      past = true;  // a line torn by a crash
    if (past)
      ++dropped;
    else
      kept += line + "\n";
  }
  if (dropped == 0) return;
  write_text_file_atomic(path, kept);
  spdlog::info("{}: dropped {} records past step {} (written after the checkpoint resumed from)",
               path, dropped, step);
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append, int64_t resumed_step)
    : path_(path) {
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  if (append) drop_records_after(path, resumed_step);
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) fail(path, ": cannot open metrics file: ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    fail(path_, ": write failed: ", std::strerror(errno));
}

}  // namespace attnres::train
