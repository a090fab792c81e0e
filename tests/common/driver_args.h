// Command-line arguments of the mpi test drivers: "driver MODE DIR [--key value | --flag]...".
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "core/error.h"

namespace packbert::test {

struct DriverArgs {
  std::string mode, dir;
  std::map<std::string, std::string> opt;
  bool has(const std::string& k) const { return opt.count(k) > 0; }
  std::string str(const std::string& k, const std::string& def) const {
    const auto it = opt.find(k);
    return it == opt.end() ? def : it->second;
  }
  int64_t num(const std::string& k, int64_t def) const {
    return has(k) ? std::stoll(opt.at(k)) : def;
  }
};

// `flags` are the options that take no value (their value reads as "1").
inline DriverArgs parse_driver_args(int argc, char** argv, const std::string& usage,
                                    const std::set<std::string>& flags) {
  PB_REQUIRE(argc >= 3, "usage: {}", usage);
  DriverArgs a;
  a.mode = argv[1];
  a.dir = argv[2];
  for (int i = 3; i < argc; ++i) {
    std::string k = argv[i];
    PB_REQUIRE(k.rfind("--", 0) == 0, "unexpected argument '{}'", k);
    k = k.substr(2);
    a.opt[k] = flags.count(k) ? "1" : (i + 1 < argc ? argv[++i] : "");
  }
  return a;
}

}  // namespace packbert::test
