#include "core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "kernels/base/error.h"

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

std::string read_whole_file(const std::string& path, const char* what) {
  std::error_code ec;
  PB_REQUIRE(std::filesystem::is_regular_file(path, ec), "{} {}: no such file", what, path);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  PB_REQUIRE(f != nullptr, "{} {}: cannot open the file: {}", what, path, std::strerror(errno));
  std::string bytes;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  PB_REQUIRE(!failed, "{} {}: cannot read the file", what, path);
  return bytes;
}

void replace_file(const std::string& path, const std::string& text, const char* what) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    PB_REQUIRE(!ec, "{}: cannot create the {}'s directory: {}", path, what, ec.message());
  }
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PB_REQUIRE(fd >= 0, "{}: cannot write the {}: {}", tmp, what, std::strerror(errno));
  int err = 0;  // the first failure's errno
  for (size_t done = 0; done < text.size() && err == 0;) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0)
      done += static_cast<size_t>(n);
    else if (n == 0)
      err = EIO;
    else if (errno != EINTR)
      err = errno;
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    PB_THROW("{}: cannot write the {}: {}", path, what, std::strerror(err));
  }
}

}  // namespace packbert
