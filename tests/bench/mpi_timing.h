// Timing of the MPI benchmarks: a step is as slow as its slowest rank, so each measurement is
// the slowest rank's time, the best of `iters` tries (barrier first). Besides the wall time it
// keeps the slowest rank's process CPU time, which shows the work per rank when ranks share
// cores (oversubscribed: the wall time then includes waiting for a core).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <ctime>

namespace packbert::bench {

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double cpu_seconds() {  // this process, all its threads
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct RankTime {
  double wall = 1e30;  // seconds: the slowest rank's, best of the tries
  double cpu = 1e30;   // seconds of process CPU time: the slowest rank's, best of the tries
};

template <typename Fn>
RankTime slowest_rank_time(int iters, Fn&& fn, MPI_Comm comm = MPI_COMM_WORLD) {
  RankTime best;
  for (int it = 0; it < iters; ++it) {
    MPI_Barrier(comm);
    const double w0 = wall_seconds(), c0 = cpu_seconds();
    fn();
    const double mine[2] = {wall_seconds() - w0, cpu_seconds() - c0};
    double slowest[2] = {0, 0};
    MPI_Allreduce(mine, slowest, 2, MPI_DOUBLE, MPI_MAX, comm);
    best.wall = std::min(best.wall, slowest[0]);
    best.cpu = std::min(best.cpu, slowest[1]);
  }
  return best;
}

}  // namespace packbert::bench
