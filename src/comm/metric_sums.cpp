#include "comm/metric_sums.h"

#include "core/mpi_check.h"
#include "kernels/base/error.h"
#include "core/watchdog.h"

namespace packbert {

MetricSums::MetricSums(MPI_Comm parent) {
  int initialized = 0, finalized = 0;
  PB_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) PB_MPI_CHECK(MPI_Finalized(&finalized));
  if (!initialized || finalized) return;
  PB_MPI_CHECK(MPI_Comm_size(parent, &size_));
  if (size_ == 1) return;
  const WatchScope watch("MPI_Comm_dup (metric sums)");
  PB_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  PB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  PB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
}

MetricSums::~MetricSums() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void MetricSums::sum(double* data, int count, const char* collective) {
  PB_REQUIRE(count >= 0 && (data || count == 0), "metric sums: {} values ({})", count, collective);
  if (size_ == 1 || count == 0) return;
  const WatchScope watch(collective);
  PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_DOUBLE, MPI_SUM, comm_));
}

}  // namespace packbert
