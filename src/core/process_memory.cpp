#include "core/process_memory.h"

#include <cstdio>
#include <fstream>
#include <string>

namespace attnres {

namespace {
// A "Name:   123 kB" line of /proc/self/status, in MiB.
double status_mib(const char* name) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = std::string(name) + ":";
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(prefix.size())) / 1024.0;
  return 0;
}
}  // namespace

double rss_mib() { return status_mib("VmRSS"); }
double peak_rss_mib() { return status_mib("VmHWM"); }

void reset_peak_rss() {
  if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

}  // namespace attnres
