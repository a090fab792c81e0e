// The gradient reducer's NCCL transport (comm/grad_reducer.h) for a device gradient: each bucket
// summed in place on a high-priority communication stream once an event on the backend's stream
// says its gradients are written; finish() makes the backend's stream wait for the last bucket,
// and the host never blocks. The bootstrap fails on every rank together and refuses two ranks on
// one GPU; every CUDA and NCCL error is a packbert::Error naming the call, and a failed or
// abandoned round ends the communicator (ncclCommAbort). Each collective is watched by the
// collective watchdog (core/watchdog.h). Captured rounds are recorded with their events.
// Built with PACKBERT_HAVE_CUDA; otherwise make_nccl_transport throws. This header names no CUDA
// or NCCL type. The reasoning: docs/communication.md#the-nccl-transport.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/bucket_scheduler.h"

namespace packbert {

struct NcclTransportSetup {
  int cuda_device = 0;
  void* stream = nullptr;  // the backend's cudaStream_t (Backend::native_stream)
  float* grads = nullptr;  // the flat device gradient
  size_t num_buckets = 0;
  std::vector<int64_t> shard_bounds;  // GradReducerOptions::shard_bounds, complete
};

// Joins every rank of parent (collective over it) or, with MPI_COMM_NULL, makes a communicator
// of this rank alone.
std::unique_ptr<GradBucketTransport> make_nccl_transport(MPI_Comm parent,
                                                         const NcclTransportSetup& setup);

}  // namespace packbert
