#include "kernels/base/error.h"

namespace packbert::detail {

void throw_check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(fmt::format("{} (internal check '{}' failed at {}:{})", msg, cond, file, line));
}

}  // namespace packbert::detail
