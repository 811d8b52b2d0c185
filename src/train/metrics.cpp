#include "train/metrics.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace attnres::train {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
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
