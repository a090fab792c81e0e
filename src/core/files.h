// Small file helpers shared by the writers of logs and metrics.
#pragma once

#include <cstdio>
#include <string>

namespace packbert {

// Opens `path` for appending, creating its parent directories first. Errors name the path,
// `what` the file is ("metrics file", "MLPerf log") and the OS reason.
std::FILE* open_for_append(const std::string& path, const char* what);

}  // namespace packbert
