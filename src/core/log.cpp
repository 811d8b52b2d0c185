#include "core/log.h"

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace attnres {

void init_logging(int rank) {
  // Logs go to stderr so that stdout stays machine-readable (eval prints JSON).
  auto logger = spdlog::get("attnres");
  if (!logger) logger = spdlog::stderr_color_mt("attnres");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern(rank == 0 ? "[%H:%M:%S] %^%l%$ %v" : "[%H:%M:%S] [rank " + std::to_string(rank) + "] %^%l%$ %v");
  spdlog::set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);
  spdlog::cfg::load_env_levels();
}

}  // namespace attnres
