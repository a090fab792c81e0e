// Errors: one exception type carrying context, thrown anywhere, caught once at the top of main.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace packbert {

// An error a user can act on: the message names the file / dataset / sample index / config key.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
[[noreturn]] void throw_check_failed(const char* file, int line, const char* cond,
                                     const std::string& msg);
}  // namespace detail

}  // namespace packbert

// Throw packbert::Error with a formatted message: PB_THROW("{}: bad value {}", path, v).
#define PB_THROW(...) throw ::packbert::Error(::fmt::format(__VA_ARGS__))

// Input/contract check that throws packbert::Error with the formatted message.
#define PB_REQUIRE(cond, ...)                                                                      \
  do {                                                                                             \
    if (!(cond)) PB_THROW(__VA_ARGS__);                                                            \
  } while (0)

// Internal invariant: failure is a bug; the message carries file:line and the condition.
#define PB_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ::packbert::detail::throw_check_failed(__FILE__, __LINE__, #cond,                            \
                                             ::fmt::format(__VA_ARGS__));                          \
  } while (0)
