// The gradient reducer's NCCL transport (comm/grad_reducer.h) for a device gradient: the same
// buckets as MPI's, each summed on a communication stream while the backend's stream runs the
// backward of the earlier layers. Built with PACKBERT_HAVE_CUDA (nccl_transport.cpp); otherwise
// make_nccl_transport throws (no_nccl_transport.cpp). This header names no CUDA or NCCL type.
//
// Streams and events. ready() runs on the host when the backward has LAUNCHED the ops that
// produce a tensor's gradient; they may still be running. When a bucket becomes startable an
// event is recorded on the backend's stream (Backend::native_stream): it completes when every op
// launched so far, so every write to that bucket, is done. The communication stream
// (non-blocking: it never orders with the legacy default stream, and of the highest priority the
// device offers, so its kernels are scheduled ahead of the backward's) waits for that event and
// runs the bucket's collective in place (ncclAllReduce, or ncclReduceScatter into this rank's
// shard), then records the bucket's done event. finish() makes the backend's stream wait for the
// LAST bucket's done event (the communication stream runs buckets in order, so that one implies
// all): the optimizer, issued next, waits for the last bucket only, and the host never blocks.
// The backend's stream must not write a bucket between its start and finish() (the backward
// writes each gradient once per round, before announcing it). all_gather is ordered the same way.
//
// Bootstrap. Every rank makes its device current and creates its stream and events; an
// MPI_Allreduce of a success flag makes all ranks fail together when one cannot (instead of
// leaving the others in ncclCommInitRank), and an MPI_Allgather of each rank's GPU (host and PCI
// bus id) refuses two ranks on one GPU with an error naming them. Rank 0 then creates the unique
// id (its failure agreed on the same way), MPI_Bcast sends it and each rank joins with
// ncclCommInitRank, whose outcome is agreed on too. MPI is used for the bootstrap only, on a
// duplicate of the parent communicator that is freed afterwards.
//
// Determinism. NCCL's ring/tree choice and its summation order depend on the rank count, the
// topology and the message size, not on timing: for fixed bucket sizes on the same machines the
// result is reproducible run to run, and every rank receives the same bits. Across rank counts
// the order differs: rounding only.
//
// Errors. Every CUDA and NCCL call is checked; a failure throws packbert::Error naming the call,
// the file:line and CUDA's or NCCL's message (ncclGetErrorString, ncclGetLastError). test()
// also asks ncclCommGetAsyncError, so a network failure surfaces at the next ready(). Once a
// round has failed, or when the transport is destroyed while a round is in flight or during
// stack unwinding, the communicator is ended with ncclCommAbort: waiting could hang forever on a
// peer that died, and the top-level handler is about to MPI_Abort anyway.
//
// Hangs. The bootstrap is watched by the collective watchdog (core/watchdog.h) like any MPI
// collective. The rounds cannot be: finish() does not block the host (the backend's stream
// waits), so a peer that never joins would leave the host blocked later, in a CUDA
// synchronisation. So each collective the transport issues arms an AsyncWatch with its done
// event: the watchdog thread polls it (cudaEventQuery), and one still incomplete after
// train.collective_timeout_s gets ncclCommAbort, then the watchdog's line (naming the step and
// the collective) and its action, which ends the job.
//
// Graphs (comm/grad_reducer.h, Graphs). start() and complete_all() on a capturing compute
// stream are recorded: the ready event forks the communication stream into the capture, the
// collectives are captured on it, and the compute stream's wait for the last done event joins
// it back, so the graph runs each bucket's collective as soon as its part of the backward is
// done, as without graphs. A capture records a second set of events (the watchdog may still be
// polling an earlier round's), and nothing is queried or watched inside it (its events mark
// nothing that has run). launched() records an event after the graph's launch, watched from an
// event recorded at the round's begin(); a replayed round issues nothing else.
//
// NCCL cannot put two ranks on one GPU, so more ranks need as many GPUs (the error says what to
// change); on a machine with one GPU, a communicator of one rank (parent = MPI_COMM_NULL) runs
// the whole path. The emulated build runs the multi-rank path too, one process per emulated GPU
// (kernels/cuda_emu/nccl.cpp; tests/gpu/test_nccl_allreduce.cpp).
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
