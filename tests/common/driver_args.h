// The mpi test drivers' shared frame: "driver write|run DIR [--key value | --flag]...", MPI
// initialised as packbert's main does, and errors handled as there (report, then every rank
// goes down, so no rank waits on one that failed).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "kernels/base/error.h"

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

// Runs `write(args)` or `run(args, rank, size)` by the mode argument; returns main's status.
inline int run_driver(int argc, char** argv, const std::string& usage,
                      const std::set<std::string>& flags,
                      const std::function<void(const DriverArgs&)>& write,
                      const std::function<void(const DriverArgs&, int, int)>& run) {
  int provided = 0, rank = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    const DriverArgs a = parse_driver_args(argc, argv, usage, flags);
    if (a.mode == "write")
      write(a);
    else if (a.mode == "run")
      run(a, rank, size);
    else
      PB_THROW("unknown mode '{}' (write | run)", a.mode);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << rank << "] error: " << e.what() << std::endl;
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    return 1;
  }
  MPI_Finalize();
  return 0;
}

}  // namespace packbert::test
