#include "core/files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace packbert {

std::FILE* open_for_append(const std::string& path, const char* what) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    PB_REQUIRE(!ec, "{}: cannot create the {}'s directory: {}", path, what, ec.message());
  }
  std::FILE* f = std::fopen(path.c_str(), "a");
  PB_REQUIRE(f != nullptr, "{}: cannot open the {} for appending: {}", path, what,
             std::strerror(errno));
  return f;
}

}  // namespace packbert
