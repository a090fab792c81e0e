#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "kernels/base/error.h"

namespace packbert {

void init_logging(int rank, const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only accept "off" when asked for.
  PB_REQUIRE(lvl != spdlog::level::off || level == "off",
             "--log-level: unknown level '{}' (use trace, debug, info, warn, error, critical, off)",
             level);
  spdlog::drop("packbert");
  auto logger = spdlog::stderr_color_mt("packbert");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
  spdlog::set_level(lvl);
}

}  // namespace packbert
