// Logging: spdlog with a "[rank N]" prefix on every line.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace packbert {

// Installs the default logger: stderr, pattern "[time] [rank N] [level] msg".
// level: trace|debug|info|warn|error|critical|off. Throws packbert::Error on an unknown level.
void init_logging(int rank, const std::string& level);

}  // namespace packbert
