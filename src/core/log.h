// Logging setup. We log through spdlog; rank 0 logs at info, other ranks warn+.
#pragma once
#include <spdlog/spdlog.h>

namespace attnres {

// Configure spdlog's default logger for this process: pattern with the rank,
// level info on rank 0 and warn elsewhere. SPDLOG_LEVEL in the environment
// overrides the level (e.g. SPDLOG_LEVEL=debug).
void init_logging(int rank = 0);

}  // namespace attnres
