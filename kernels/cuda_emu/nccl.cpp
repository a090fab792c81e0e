// NCCL in the emulated build (include/nccl.h): one MPI rank per emulated GPU, the collectives
// moved by MPI on a communicator of their own.
//
// Stream order. A collective is an asynchronous item of its stream (runtime.h, enqueue_async):
// when the emulated stream reaches it, it is handed to its communicator's worker thread, and
// the stream's later work waits until the worker has written the result. So the data moves when
// the stream gets there, not at the call, and a stream that does not wait for the event that
// orders it after the producer's writes sends what the buffer held before (as on a GPU). Calls
// between ncclGroupStart and ncclGroupEnd are checked at the call and enqueued at the group's
// end, in call order. On a capturing stream a collective is recorded into the CUDA graph and
// runs at each of the graph's launches.
//
// Graphs. NCCL requires whether a collective is graph-captured to be the same on every rank,
// and each launch of a graph to pair with the graphs the other ranks captured together with
// it. The emulation checks both: a collective carries its capture number (0: not captured;
// k: the communicator's k-th captured collective on this rank, counted at the capture), which
// the ranks compare like the rest of the header. A rank that runs a collective eagerly while
// another replays it, or that replays a graph of another capture than its peers', disagrees
// there and hangs as below.
//
// Matching. The worker runs its communicator's collectives one at a time, in the order its
// stream reached them. Each begins with an MPI_Allgather of a header (kind, type, count, root and
// the collective's index on the communicator): ranks match calls by their order on the
// communicator, as NCCL does. Calls that differ between ranks hang, as on hardware, after one
// line on stderr naming both; a rank that never makes the call leaves its peers waiting. Either
// way the host's queries answer cudaErrorNotReady and its synchronisations wait, until
// ncclCommAbort.
//
// Reduction order. Every rank's contribution reaches every rank (MPI_Allgatherv), and each
// element is summed in rank order, ((x_0 + x_1) + x_2) + ..., in fp32 for f32, bf16 and f16 (the
// 16-bit inputs widened exactly, the sum rounded once to the output type, to nearest even) and
// in fp64 for f64. Every rank computes the same sum, so all ranks receive the same bits, and a
// result depends on the rank count but never on timing. Real NCCL's order depends on its ring or
// tree and on the message size: it agrees to rounding.
//
// Communicators span one rank (no MPI) or every rank of MPI_COMM_WORLD, with NCCL rank =
// position in the communicator (what packbert makes); ncclCommInitRank is then collective over
// MPI_COMM_WORLD, which it duplicates (ordered by the NCCL rank). Two ranks on one device fail
// it with ncclInvalidUsage and "Duplicate GPU detected", as NCCL does. MPI must have been
// initialised with MPI_THREAD_MULTIPLE: the worker calls MPI while the host thread does.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/lowp_convert.h"
#include "kernels/cuda_emu/runtime.h"

namespace {

enum class Kind : int32_t { all_reduce, reduce_scatter, all_gather, reduce, broadcast };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "ncclAllReduce";
    case Kind::reduce_scatter: return "ncclReduceScatter";
    case Kind::all_gather: return "ncclAllGather";
    case Kind::reduce: return "ncclReduce";
    case Kind::broadcast: return "ncclBroadcast";
  }
  return "?";
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    case ncclBfloat16:
    case ncclFloat16: return 2;
    default: return 0;  // not emulated
  }
}

// What every rank compares before a collective moves data.
struct Header {
  int32_t kind = 0;
  int32_t type = 0;
  int32_t root = 0;
  int32_t pad = 0;
  uint64_t count = 0;
  uint64_t index = 0;    // the collective's position on its communicator
  uint64_t capture = 0;  // 0, or k: the k-th collective captured on the communicator (Graphs)
  bool operator==(const Header& o) const {
    return kind == o.kind && type == o.type && root == o.root && count == o.count &&
           index == o.index && capture == o.capture;
  }
};

std::string describe(const Header& h) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s of %llu elements of type %d, root %d, ",
                kind_name(static_cast<Kind>(h.kind)), static_cast<unsigned long long>(h.count),
                h.type, h.root);
  std::string s = buf;
  if (h.capture == 0) return s + "not in a graph";
  return s + "in a graph (captured collective #" + std::to_string(h.capture) + ")";
}

// Elements rank r sends in collective h on n ranks (its part of the MPI_Allgatherv).
size_t send_count(Kind kind, size_t count, int root, int r, size_t n) {
  if (kind == Kind::reduce_scatter) return count * n;
  if (kind == Kind::broadcast && r != root) return 0;
  return count;
}

struct Op {
  Header h;
  const void* send = nullptr;
  void* recv = nullptr;
  std::atomic<bool> done{false};
};

struct Pending {  // a call inside a group, enqueued at its end
  ncclComm_t comm;
  cudaStream_t stream;
  std::shared_ptr<Op> op;
};

thread_local int t_group_depth = 0;
thread_local std::vector<Pending> t_group;
thread_local ncclResult_t t_group_error = ncclSuccess;

std::mutex g_error_mu;
std::string g_last_error;  // ncclGetLastError

ncclResult_t error(ncclResult_t r, const std::string& what) {
  std::lock_guard<std::mutex> lock(g_error_mu);
  g_last_error = what;
  std::fprintf(stderr, "NCCL emulation: %s\n", what.c_str());
  return r;
}

float widen(ncclDataType_t t, const void* p, size_t i) {
  uint16_t h = 0;
  std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
  return t == ncclBfloat16 ? packbert::lowp::bf16_to_float(h) : packbert::lowp::f16_to_float(h);
}

void store16(ncclDataType_t t, void* p, size_t i, float v) {
  const uint16_t h =
      t == ncclBfloat16 ? packbert::lowp::float_to_bf16(v) : packbert::lowp::float_to_f16(v);
  std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
}

// out[i] = sum over ranks r in order of the r-th contribution's element (first + i), for
// i < count; contributions are `stride` elements apart in `all`.
void sum_in_rank_order(ncclDataType_t t, const char* all, size_t stride, int nranks, size_t first,
                       size_t count, void* out) {
  const size_t es = type_size(t);
  for (size_t i = 0; i < count; ++i) {
    if (t == ncclFloat64) {
      double s = 0;
      for (int r = 0; r < nranks; ++r) {
        double x = 0;
        std::memcpy(&x, all + (static_cast<size_t>(r) * stride + first + i) * es, 8);
        s = r == 0 ? x : s + x;
      }
      std::memcpy(static_cast<char*>(out) + i * 8, &s, 8);
    } else if (t == ncclFloat32) {
      float s = 0;
      for (int r = 0; r < nranks; ++r) {
        float x = 0;
        std::memcpy(&x, all + (static_cast<size_t>(r) * stride + first + i) * es, 4);
        s = r == 0 ? x : s + x;
      }
      std::memcpy(static_cast<char*>(out) + i * 4, &s, 4);
    } else {
      float s = 0;
      for (int r = 0; r < nranks; ++r) {
        const float x = widen(t, all, static_cast<size_t>(r) * stride + first + i);
        s = r == 0 ? x : s + x;
      }
      store16(t, out, i, s);
    }
  }
}

}  // namespace

struct ncclComm {
  int rank = 0;
  int nranks = 1;
  int device = 0;
  MPI_Comm mpi = MPI_COMM_NULL;  // null for a communicator of one rank
  uint64_t issued = 0;           // collectives enqueued so far (the next one's index)
  uint64_t captured = 0;         // collectives captured into graphs so far (Graphs)

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Op>> queue;
  std::shared_ptr<Op> current;  // the collective the worker is running
  bool stopping = false;
  std::atomic<bool> aborted{false};
  std::thread worker;

  // The stream reached op. After ncclCommAbort it completes at once (its worker is gone; the
  // data is whatever the buffer holds), so that no stream waits for it forever.
  void post(const std::shared_ptr<Op>& op) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (aborted || stopping) {
        op->done = true;
        return;
      }
      queue.push_back(op);
    }
    cv.notify_one();
  }

  void run() {
    for (;;) {
      std::shared_ptr<Op> op;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        op = queue.front();
        queue.pop_front();
        current = op;
      }
      if (!aborted) execute(*op);
      std::lock_guard<std::mutex> lock(mu);
      current.reset();
      op->done = true;
    }
  }

  // Until ncclCommAbort: what a mismatched or abandoned collective does on hardware.
  void hang() {
    while (!aborted) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  void execute(Op& op) {
    const Header& h = op.h;
    const auto kind = static_cast<Kind>(h.kind);
    const auto type = static_cast<ncclDataType_t>(h.type);
    const size_t es = type_size(type);
    const auto n = static_cast<size_t>(nranks);
    // Elements this rank contributes.
    const size_t mine = send_count(kind, h.count, h.root, rank, n);
    std::vector<char> all;
    if (nranks == 1) {
      all.assign(static_cast<const char*>(op.send), static_cast<const char*>(op.send) + mine * es);
    } else {
      std::vector<Header> heads(n);
      if (MPI_Allgather(&h, sizeof(Header), MPI_BYTE, heads.data(), sizeof(Header), MPI_BYTE,
                        mpi) != MPI_SUCCESS)
        return hang();
      for (size_t r = 0; r < n; ++r) {
        if (!(heads[r] == h)) {
          std::fprintf(stderr,
                       "NCCL emulation: rank %d's collective #%llu is %s, rank %zu's is %s (#%llu):"
                       " ranks disagree on the order of their calls or on their graphs, which "
                       "hangs on hardware\n",
                       rank, static_cast<unsigned long long>(h.index), describe(h).c_str(), r,
                       describe(heads[r]).c_str(), static_cast<unsigned long long>(heads[r].index));
          return hang();
        }
      }
      std::vector<int> counts(n), displs(n);
      size_t at = 0;
      for (size_t r = 0; r < n; ++r) {
        const size_t c = send_count(kind, h.count, h.root, static_cast<int>(r), n);
        counts[r] = static_cast<int>(c * es);
        displs[r] = static_cast<int>(at);
        at += c * es;
      }
      all.resize(std::max<size_t>(at, 1));
      if (MPI_Allgatherv(op.send, static_cast<int>(mine * es), MPI_BYTE, all.data(), counts.data(),
                         displs.data(), MPI_BYTE, mpi) != MPI_SUCCESS)
        return hang();
    }
    if (aborted) return;  // the buffers may be gone
    switch (kind) {
      case Kind::all_reduce:
        sum_in_rank_order(type, all.data(), h.count, nranks, 0, h.count, op.recv);
        break;
      case Kind::reduce:
        if (rank == h.root)
          sum_in_rank_order(type, all.data(), h.count, nranks, 0, h.count, op.recv);
        break;
      case Kind::reduce_scatter:
        sum_in_rank_order(type, all.data(), h.count * n, nranks,
                          static_cast<size_t>(rank) * h.count, h.count, op.recv);
        break;
      case Kind::all_gather: std::memcpy(op.recv, all.data(), h.count * n * es); break;
      case Kind::broadcast:  // only the root sent anything
        std::memmove(op.recv, all.data(), h.count * es);
        break;
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_one();
  }
};

namespace {

// Puts op on the stream: handed to the worker when the stream reaches it, complete when the
// worker has written the result. Each run is a fresh Op with the next index on the
// communicator, taken at the call, or, captured into a CUDA graph, at each of its launches (the
// ranks replay their graphs in the same order, so their indices still agree).
cudaError_t enqueue_op(ncclComm_t comm, cudaStream_t stream, std::shared_ptr<Op> o) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
      status == cudaStreamCaptureStatusActive)
    o->h.capture = ++comm->captured;
  return packbert::emu::enqueue_async(stream, kind_name(static_cast<Kind>(o->h.kind)), [comm, o] {
    auto run = std::make_shared<Op>();
    run->h = o->h;
    run->h.index = comm->issued++;
    run->send = o->send;
    run->recv = o->recv;
    return packbert::emu::AsyncRun{[comm, run] { comm->post(run); },
                                   [run] { return run->done.load(); }};
  });
}

// A collective's checks at the call (NCCL's argument errors), then its enqueueing (or, inside a
// group, its recording for ncclGroupEnd).
ncclResult_t collective(Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  const char* name = kind_name(kind);
  ncclResult_t r = ncclSuccess;
  if (!comm) {
    r = error(ncclInvalidArgument, std::string(name) + ": no communicator");
  } else if (comm->aborted) {
    r = error(ncclInvalidUsage, std::string(name) + ": the communicator was aborted");
  } else if (type_size(type) == 0) {
    r = error(ncclInvalidArgument, std::string(name) + ": type " + std::to_string(type) +
                                       " is not emulated (f32, f64, bf16, f16)");
  } else if ((kind == Kind::all_reduce || kind == Kind::reduce_scatter || kind == Kind::reduce) &&
             op != ncclSum) {
    r = error(ncclInvalidArgument, std::string(name) + ": only ncclSum is emulated");
  } else if ((kind == Kind::reduce || kind == Kind::broadcast) &&
             (root < 0 || root >= comm->nranks)) {
    r = error(ncclInvalidArgument, std::string(name) + ": root " + std::to_string(root) + " of " +
                                       std::to_string(comm->nranks) + " ranks");
  } else {
    const size_t es = type_size(type), n = static_cast<size_t>(comm->nranks);
    const size_t send_elems = send_count(kind, count, root, comm->rank, n);
    size_t recv_elems = count;
    if (kind == Kind::all_gather) recv_elems = count * n;
    if (kind == Kind::reduce && comm->rank != root) recv_elems = 0;
    if (send_elems * es * n > size_t{INT32_MAX}) {
      r = error(ncclInvalidUsage, std::string(name) + ": " + std::to_string(send_elems * es) +
                                      " bytes per rank: the emulation moves under 2 GiB a call");
    } else if ((send_elems && !packbert::emu::device_range(send, send_elems * es)) ||
               (recv_elems && !packbert::emu::device_range(recv, recv_elems * es))) {
      r = error(ncclInvalidArgument,
                std::string(name) + ": a buffer is not device memory (or is too short)");
    }
  }
  if (r != ncclSuccess) {
    if (t_group_depth > 0) t_group_error = r;
    return r;
  }
  auto o = std::make_shared<Op>();
  o->h.kind = static_cast<int32_t>(kind);
  o->h.type = static_cast<int32_t>(type);
  o->h.root = (kind == Kind::reduce || kind == Kind::broadcast) ? root : 0;
  o->h.count = count;
  o->send = send;
  o->recv = recv;
  if (t_group_depth > 0) {
    t_group.push_back({comm, stream, std::move(o)});
    return ncclSuccess;
  }
  if (enqueue_op(comm, stream, std::move(o)) != cudaSuccess)
    return error(ncclUnhandledCudaError, std::string(name) + ": the stream has failed");
  return ncclSuccess;
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "NCCL error";
  }
}

const char* ncclGetLastError(ncclComm_t) {
  std::lock_guard<std::mutex> lock(g_error_mu);
  return g_last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& c : id->internal) c = static_cast<char>(rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return error(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                          std::to_string(nranks));
  auto c = std::make_unique<ncclComm>();
  c->rank = rank;
  c->nranks = nranks;
  c->device = packbert::emu::current_device();
  if (nranks > 1) {
    int initialized = 0, level = 0, world = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      return error(ncclSystemError, "ncclCommInitRank: the emulation needs MPI initialised");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
      return error(ncclSystemError,
                   "ncclCommInitRank: the emulation needs MPI_THREAD_MULTIPLE (its worker thread "
                   "calls MPI)");
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != nranks)
      return error(ncclInvalidUsage, "ncclCommInitRank: " + std::to_string(nranks) + " ranks of " +
                                         std::to_string(world) +
                                         ": the emulation's communicators span every MPI rank");
    if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->mpi) != MPI_SUCCESS)
      return error(ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed");
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    // Every rank must hold the same id, and a device of its own.
    struct Who {
      char id[sizeof(ncclUniqueId)];
      char host[MPI_MAX_PROCESSOR_NAME];
      int device;
      int rank;
    } me{}, none{};
    std::memcpy(me.id, &id, sizeof(id));
    int len = 0;
    MPI_Get_processor_name(me.host, &len);
    me.device = c->device;
    me.rank = rank;
    std::vector<Who> all(static_cast<size_t>(nranks), none);
    MPI_Allgather(&me, sizeof(Who), MPI_BYTE, all.data(), sizeof(Who), MPI_BYTE, c->mpi);
    for (const Who& a : all) {
      if (std::memcmp(a.id, me.id, sizeof(me.id)) != 0) {
        MPI_Comm_free(&c->mpi);
        return error(ncclInvalidUsage,
                     "ncclCommInitRank: ranks hold different unique ids (one id, from "
                     "ncclGetUniqueId on one rank, must reach them all)");
      }
    }
    for (const Who& a : all) {
      for (const Who& b : all) {
        if (a.rank < b.rank && a.device == b.device && std::strcmp(a.host, b.host) == 0) {
          MPI_Comm_free(&c->mpi);
          char bus[32] = {0};
          cudaDeviceGetPCIBusId(bus, sizeof(bus), a.device);
          return error(ncclInvalidUsage, "Duplicate GPU detected : rank " + std::to_string(b.rank) +
                                             " and rank " + std::to_string(a.rank) +
                                             " both on CUDA device " + bus);
        }
      }
    }
  }
  ncclComm* raw = c.get();
  c->worker = std::thread([raw] { raw->run(); });
  *comm = c.release();
  return ncclSuccess;
}

// Waits for the communicator's collectives (enqueued ones too: their streams are synchronised
// first, as NCCL requires them complete), then frees it.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  cudaDeviceSynchronize();
  comm->stop();
  comm->worker.join();
  if (comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

// Ends the communicator without waiting: pending collectives complete with whatever their
// buffers hold (their streams move on), and a worker blocked in MPI on a peer that is gone is
// left behind (the process is about to end). The MPI communicator is not freed (that would need
// every rank).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->aborted = true;
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    for (auto& op : comm->queue) op->done = true;
    comm->queue.clear();
    if (comm->current) comm->current->done = true;
  }
  comm->stop();
  comm->worker.detach();  // the ncclComm is leaked with it: the worker may still read it
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* e) {
  if (!comm) return ncclInvalidArgument;
  *e = comm->aborted ? ncclRemoteError : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::all_reduce, send, recv, count, type, op, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::reduce_scatter, send, recv, recvcount, type, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::all_gather, send, recv, sendcount, type, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::reduce, send, recv, count, type, op, root, comm, stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::broadcast, send, recv, count, type, ncclSum, root, comm, stream);
}

ncclResult_t ncclGroupStart() {
  if (t_group_depth++ == 0) {
    t_group.clear();
    t_group_error = ncclSuccess;
  }
  return ncclSuccess;
}

// The group's calls, enqueued in call order; an argument error inside the group fails the group
// and enqueues none of it.
ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Pending> calls;
  calls.swap(t_group);
  if (t_group_error != ncclSuccess) return t_group_error;
  for (Pending& p : calls) {
    if (enqueue_op(p.comm, p.stream, p.op) != cudaSuccess)
      return error(ncclUnhandledCudaError, "ncclGroupEnd: the stream has failed");
  }
  return ncclSuccess;
}
