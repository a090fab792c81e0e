// Blocking sums over ranks of a few host doubles: the loss sums and counts of a training step,
// an evaluation's. On a duplicate of the parent communicator (its collectives match no one
// else's) with MPI_ERRORS_RETURN, each call watched by the collective watchdog
// (core/watchdog.h) under the name it is given. One rank, or MPI not initialised (unit tests,
// a bare run): nothing moves and no MPI call is made after construction.
#pragma once

#include <mpi.h>

namespace packbert {

class MetricSums {
 public:
  explicit MetricSums(MPI_Comm parent);  // collective over parent (more than one rank)
  ~MetricSums();
  MetricSums(const MetricSums&) = delete;
  MetricSums& operator=(const MetricSums&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // In place: data[i] := the sum over ranks of data[i]. collective: its name in the watchdog's
  // message, a string that outlives the call ("MPI_Allreduce (step metrics)").
  void sum(double* data, int count, const char* collective);

 private:
  int rank_ = 0;
  int size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;  // the duplicate (more than one rank)
};

}  // namespace packbert
