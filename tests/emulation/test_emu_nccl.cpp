// emulated label: the NCCL emulation itself (kernels/cuda_emu/nccl.cpp), under mpirun. The test
// starts mpirun on its own binary; the ranks find PACKBERT_EMU_NCCL_CHILD set and run the body.
//
//   - Every collective (ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclReduce,
//     ncclBroadcast) in f32, bf16 and f16 (and ncclAllReduce in f64), out of place and in place,
//     of 0, 1 and an odd number of elements, against a host reference computed as the emulation
//     documents it: each element summed in rank order, ((x_0 + x_1) + x_2) + ..., in fp32 (the
//     16-bit inputs widened exactly, the sum rounded once to nearest even) or fp64. Bit for bit:
//     the reference is that computation, not an approximation of it. Gathers and broadcasts
//     move bits.
//   - Calls inside ncclGroupStart / ncclGroupEnd.
//   - Stream order: a collective issued before a write on its stream sends the old value; one on
//     another stream that waits for an event recorded after the write sends the new value, and
//     without the wait the old one (the emulation runs a stream's work only when something
//     waits for it, so the unsynchronised write has not run when the collective's stream does).
//   - cudaEventQuery / cudaStreamQuery answer cudaErrorNotReady (not recorded as the last
//     error) while a rank has not yet made its call (rank 1 sleeps before it), then success.
//   - ncclCommAbort ends the wait of a synchronisation for a collective whose peers have not
//     called; mismatched calls print the emulation's diagnostic and hang until ncclCommAbort.
//   - Two ranks on one device (PACKBERT_EMU_DEVICES=1): ncclCommInitRank fails with
//     ncclInvalidUsage, ncclGetLastError saying "Duplicate GPU detected".
//   - Collectives captured into a CUDA graph (stream capture), alone and grouped: each launch of
//     the graph runs them again with the buffers' current contents, in order with eager ones.
//   - A collective that one rank replays from a graph and the others issue eagerly (NCCL
//     requires capture to be uniform over the ranks) prints the diagnostic, naming the graph,
//     and hangs until ncclCommAbort.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/lowp_convert.h"
#include "mpi_self_test.h"
#include "test_util.h"

namespace packbert::test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- the host reference -------------------------------------------------------------------

enum class Kind { all_reduce, reduce_scatter, all_gather, reduce, broadcast };

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

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return "f32";
    case ncclFloat64: return "f64";
    case ncclBfloat16: return "bf16";
    case ncclFloat16: return "f16";
    default: return "?";
  }
}

size_t esize(ncclDataType_t t) { return t == ncclFloat64 ? 8 : t == ncclFloat32 ? 4 : 2; }

uint64_t mix(uint64_t a, uint64_t b) {
  return (a ^ (b + 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
}

// n elements of rank r's contribution of type t: random values of magnitudes 2^-8 .. 2^8 (so
// sums round), drawn from (seed, salt, rank) alone: every rank can compute every rank's.
std::vector<char> values(ncclDataType_t t, uint64_t seed, uint64_t salt, int rank, size_t n) {
  std::mt19937_64 rng(mix(mix(seed, salt), static_cast<uint64_t>(rank)));
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> e(-8, 8);
  std::vector<char> v(std::max<size_t>(n, 1) * esize(t));
  for (size_t i = 0; i < n; ++i) {
    const double x = std::ldexp(u(rng), e(rng));
    char* p = v.data() + i * esize(t);
    if (t == ncclFloat64) {
      std::memcpy(p, &x, 8);
    } else if (t == ncclFloat32) {
      const auto f = static_cast<float>(x);
      std::memcpy(p, &f, 4);
    } else {
      const uint16_t h = t == ncclBfloat16 ? lowp::float_to_bf16(static_cast<float>(x))
                                           : lowp::float_to_f16(static_cast<float>(x));
      std::memcpy(p, &h, 2);
    }
  }
  return v;
}

float widen(ncclDataType_t t, const char* p) {
  if (t == ncclFloat32) {
    float f = 0;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h = 0;
  std::memcpy(&h, p, 2);
  return t == ncclBfloat16 ? lowp::bf16_to_float(h) : lowp::f16_to_float(h);
}

// Element i of every rank's array, summed as documented, written to out.
void ref_sum(ncclDataType_t t, const std::vector<std::vector<char>>& v, size_t i, char* out) {
  const size_t es = esize(t);
  if (t == ncclFloat64) {
    double s = 0;
    for (size_t r = 0; r < v.size(); ++r) {
      double x = 0;
      std::memcpy(&x, v[r].data() + i * es, 8);
      s = r == 0 ? x : s + x;
    }
    std::memcpy(out, &s, 8);
    return;
  }
  float s = 0;
  for (size_t r = 0; r < v.size(); ++r) {
    const float x = widen(t, v[r].data() + i * es);
    s = r == 0 ? x : s + x;
  }
  if (t == ncclFloat32) {
    std::memcpy(out, &s, 4);
  } else {
    const uint16_t h = t == ncclBfloat16 ? lowp::float_to_bf16(s) : lowp::float_to_f16(s);
    std::memcpy(out, &h, 2);
  }
}

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess);
  return p;
}

#define NCCL_OK(call) ASSERT_EQ((call), ncclSuccess) << #call << ": " << ncclGetLastError(nullptr)
#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// One collective: its buffers on the device, filled with this rank's contribution, its call,
// and the check of what it received against the reference.
struct Case {
  Case(Kind k, ncclDataType_t t, size_t n, bool inplace, int r, uint64_t s)
      : kind(k), type(t), count(n), in_place(inplace), root(r), salt(s) {}
  Kind kind;
  ncclDataType_t type;
  size_t count;
  bool in_place;
  int root;
  uint64_t salt;  // draws the contributions

  int rank = 0, np = 1;
  size_t es = 0, send_elems = 0, recv_elems = 0;
  std::vector<std::vector<char>> all;  // every rank's contribution
  void* send = nullptr;
  void* recv = nullptr;
  void* buf = nullptr;  // in place: the one buffer
  void* out = nullptr;  // out of place: the receive buffer

  std::string name() const {
    return std::string(kind_name(kind)) + " " + type_name(type) + " count " +
           std::to_string(count) + (in_place ? " in place" : " out of place") + " root " +
           std::to_string(root);
  }

  // Device buffers and this rank's contribution (synchronously: before any stream work).
  void prepare(uint64_t seed, int r, int n) {
    rank = r;
    np = n;
    es = esize(type);
    const auto nn = static_cast<size_t>(np);
    send_elems = kind == Kind::reduce_scatter ? count * nn : count;
    recv_elems = kind == Kind::all_gather ? count * nn : count;
    for (int q = 0; q < np; ++q) all.push_back(values(type, seed, salt, q, send_elems));
    const std::vector<char>& mine = all[static_cast<size_t>(rank)];
    if (in_place) {
      // NCCL's in-place forms: reduce-scatter receives at send + rank * count, all-gather sends
      // from recv + rank * count.
      const size_t elems = std::max(send_elems, recv_elems);
      buf = dev_alloc(elems * es);
      EXPECT_EQ(cudaMemset(buf, 0xEE, std::max<size_t>(elems * es, 1)), cudaSuccess);
      const size_t at = kind == Kind::all_gather ? static_cast<size_t>(rank) * count : 0;
      if (send_elems) {
        EXPECT_EQ(cudaMemcpy(static_cast<char*>(buf) + at * es, mine.data(), send_elems * es,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      send = static_cast<char*>(buf) + at * es;
      recv = kind == Kind::reduce_scatter ? static_cast<char*>(buf) + rank * count * es : buf;
    } else {
      send = dev_alloc(send_elems * es);
      out = dev_alloc(recv_elems * es);
      if (send_elems) {
        EXPECT_EQ(cudaMemcpy(send, mine.data(), send_elems * es, cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      EXPECT_EQ(cudaMemset(out, 0xEE, std::max<size_t>(recv_elems * es, 1)), cudaSuccess);
      recv = out;
    }
  }

  ncclResult_t issue(ncclComm_t comm, cudaStream_t s) const {
    switch (kind) {
      case Kind::all_reduce: return ncclAllReduce(send, recv, count, type, ncclSum, comm, s);
      case Kind::reduce_scatter:
        return ncclReduceScatter(send, recv, count, type, ncclSum, comm, s);
      case Kind::all_gather: return ncclAllGather(send, recv, count, type, comm, s);
      case Kind::reduce: return ncclReduce(send, recv, count, type, ncclSum, root, comm, s);
      case Kind::broadcast: return ncclBroadcast(send, recv, count, type, root, comm, s);
    }
    return ncclInternalError;
  }

  // What rank `rank` must hold in recv; empty when nothing is specified (a reduce's non-root).
  std::vector<char> expected() const {
    if (kind == Kind::reduce && rank != root) return {};
    std::vector<char> want(recv_elems * es);
    for (size_t i = 0; i < recv_elems; ++i) {
      char* o = want.data() + i * es;
      switch (kind) {
        case Kind::all_reduce:
        case Kind::reduce: ref_sum(type, all, i, o); break;
        case Kind::reduce_scatter:
          ref_sum(type, all, static_cast<size_t>(rank) * count + i, o);
          break;
        case Kind::all_gather: std::memcpy(o, all[i / count].data() + (i % count) * es, es); break;
        case Kind::broadcast:
          std::memcpy(o, all[static_cast<size_t>(root)].data() + i * es, es);
          break;
      }
    }
    return want;
  }

  // After the stream has been synchronised: bit for bit against the reference.
  void verify(const std::string& what) const {
    const std::vector<char> want = expected();
    if (want.empty()) return;
    std::vector<char> got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), recv, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < recv_elems; ++i) {
      if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) {
        if (bad == 0) first = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << name() << " on rank " << rank << ": " << bad << " of "
                       << recv_elems << " elements differ from the reference, the first at "
                       << first;
  }
};

void free_case(Case& c) {
  if (c.in_place) {
    cudaFree(c.buf);
  } else {
    cudaFree(c.send);
    cudaFree(c.out);
  }
  c.buf = c.send = c.recv = c.out = nullptr;
}

ncclComm_t make_comm(int rank, int np) {
  ncclUniqueId id{};
  if (rank == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, np, id, rank);
  EXPECT_EQ(r, ncclSuccess) << ncclGetLastError(nullptr);
  return comm;
}

cudaStream_t make_stream() {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

// ---- the ranks' body ------------------------------------------------------------------------

void every_collective(ncclComm_t comm, cudaStream_t s, uint64_t seed, int rank, int np) {
  uint64_t salt = 1;
  std::vector<Case> cases;
  for (Kind k :
       {Kind::all_reduce, Kind::reduce_scatter, Kind::all_gather, Kind::reduce, Kind::broadcast})
    for (ncclDataType_t t : {ncclFloat32, ncclBfloat16, ncclFloat16, ncclFloat64})
      for (size_t count : {size_t{0}, size_t{1}, size_t{1001}})
        for (bool in_place : {false, true}) {
          if (t == ncclFloat64 && k != Kind::all_reduce) continue;
          // A root other than 0 where it matters: the last rank, or rank 1 for odd counts.
          const int root = count % 2 ? 1 % np : np - 1;
          cases.push_back({k, t, count, in_place, root, salt++});
        }
  // One at a time, each synchronised: the simplest order.
  for (Case& c : cases) {
    c.prepare(seed, rank, np);
    NCCL_OK(c.issue(comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    c.verify("one call");
    free_case(c);
  }
  // All of them issued back to back on the stream, then one synchronisation: the worker runs
  // them in order, and each lands in its own buffers.
  for (Case& c : cases) {
    c.all.clear();
    c.salt += 1000;
    c.prepare(seed, rank, np);
  }
  for (const Case& c : cases) NCCL_OK(c.issue(comm, s));
  CUDA_OK(cudaStreamSynchronize(s));
  for (Case& c : cases) {
    c.verify("issued back to back");
    free_case(c);
  }
}

void grouped_calls(ncclComm_t comm, cudaStream_t s, uint64_t seed, int rank, int np) {
  std::vector<Case> group = {{Kind::all_reduce, ncclFloat32, 77, false, 0, 5001},
                             {Kind::all_gather, ncclBfloat16, 13, true, 0, 5002},
                             {Kind::broadcast, ncclFloat16, 9, true, np - 1, 5003},
                             {Kind::reduce, ncclFloat32, 31, false, 0, 5004},
                             {Kind::reduce_scatter, ncclFloat16, 21, true, 0, 5005},
                             {Kind::all_reduce, ncclFloat64, 5, true, 0, 5006}};
  for (Case& c : group) c.prepare(seed, rank, np);
  NCCL_OK(ncclGroupStart());
  for (const Case& c : group) NCCL_OK(c.issue(comm, s));
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaStreamSynchronize(s));
  for (Case& c : group) {
    c.verify("grouped");
    free_case(c);
  }
}

// A write of new values into a case's send buffer, from pinned memory.
struct NewValues {
  NewValues(const Case& c, uint64_t seed) {
    for (int q = 0; q < c.np; ++q) all.push_back(values(c.type, seed, c.salt + 77, q, c.count));
    bytes = c.count * c.es;
    EXPECT_EQ(cudaMallocHost(&pinned, bytes), cudaSuccess);
    std::memcpy(pinned, all[static_cast<size_t>(c.rank)].data(), bytes);
  }
  ~NewValues() { cudaFreeHost(pinned); }
  std::vector<std::vector<char>> all;
  void* pinned = nullptr;
  size_t bytes = 0;
};

void stream_order(ncclComm_t comm, uint64_t seed, int rank, int np) {
  cudaStream_t a = make_stream(), b = make_stream();
  // 1. The collective before the write on one stream: it sends the old values.
  {
    Case c{Kind::all_reduce, ncclFloat32, 513, false, 0, 6001};
    c.prepare(seed, rank, np);
    const NewValues fresh(c, seed);
    NCCL_OK(c.issue(comm, a));
    CUDA_OK(cudaMemcpyAsync(c.send, fresh.pinned, fresh.bytes, cudaMemcpyHostToDevice, a));
    CUDA_OK(cudaStreamSynchronize(a));
    c.verify("issued before a write on its stream (the old values)");
    std::vector<char> now(fresh.bytes);
    CUDA_OK(cudaMemcpy(now.data(), c.send, now.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(now.data(), fresh.pinned, now.size()), 0) << "the write did not land";
    free_case(c);
  }
  // 2. The write on stream a, an event after it, the collective on stream b waiting for the
  //    event: the new values. 3. The same without the wait: the old ones.
  for (bool wait : {true, false}) {
    Case c{Kind::all_reduce, ncclFloat32, 257, false, 0, wait ? 6002u : 6003u};
    c.prepare(seed, rank, np);
    const NewValues fresh(c, seed);
    cudaEvent_t written = nullptr;
    CUDA_OK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    CUDA_OK(cudaMemcpyAsync(c.send, fresh.pinned, fresh.bytes, cudaMemcpyHostToDevice, a));
    CUDA_OK(cudaEventRecord(written, a));
    if (wait) {
      CUDA_OK(cudaStreamWaitEvent(b, written, 0));
    }
    NCCL_OK(c.issue(comm, b));
    CUDA_OK(cudaStreamSynchronize(b));
    if (wait) c.all = fresh.all;  // the reference: the new values of every rank
    c.verify(wait ? "on a stream that waits for the write's event (the new values)"
                  : "on a stream that does not wait for the write (the old values)");
    CUDA_OK(cudaStreamSynchronize(a));
    CUDA_OK(cudaEventDestroy(written));
    free_case(c);
  }
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
}

// Collectives captured into a CUDA graph (one alone, two in a group) run at each launch of the
// graph, sending what their buffers hold then; each launch issues them afresh (a run of its
// own, which the stream waits for: a copy of the results captured after them sees them), in
// order with an eager collective issued between launches.
void captured_collectives(ncclComm_t comm, uint64_t seed, int rank, int np) {
  cudaStream_t s = make_stream();
  Case alone{Kind::all_reduce, ncclFloat32, 301, false, 0, 8001};
  Case grouped_a{Kind::all_gather, ncclBfloat16, 37, false, 0, 8002};
  Case grouped_b{Kind::reduce_scatter, ncclFloat16, 19, true, 0, 8003};
  const std::vector<Case*> cases = {&alone, &grouped_a, &grouped_b};
  std::vector<void*> copies;
  for (Case* c : cases) {
    c->prepare(seed, rank, np);
    copies.push_back(dev_alloc(c->recv_elems * c->es));
  }
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  NCCL_OK(alone.issue(comm, s));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(grouped_a.issue(comm, s));
  NCCL_OK(grouped_b.issue(comm, s));
  NCCL_OK(ncclGroupEnd());
  for (size_t i = 0; i < cases.size(); ++i) {
    CUDA_OK(cudaMemcpyAsync(copies[i], cases[i]->recv, cases[i]->recv_elems * cases[i]->es,
                            cudaMemcpyDeviceToDevice, s));
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t launch = 1; launch <= 3; ++launch) {
    // New contributions, written before the launch: the launch sends them.
    for (Case* c : cases) {
      for (int q = 0; q < np; ++q)
        c->all[static_cast<size_t>(q)] =
            values(c->type, seed, c->salt + 100 * launch, q, c->send_elems);
      const std::vector<char>& mine = c->all[static_cast<size_t>(rank)];
      CUDA_OK(cudaMemcpy(c->send, mine.data(), mine.size(), cudaMemcpyHostToDevice));
    }
    Case eager{Kind::all_reduce, ncclFloat32, 77, false, 0, 8100 + launch};
    eager.prepare(seed, rank, np);
    CUDA_OK(cudaGraphLaunch(exec, s));
    NCCL_OK(eager.issue(comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    const std::string what = "captured, launch " + std::to_string(launch);
    for (size_t i = 0; i < cases.size(); ++i) {
      cases[i]->verify(what);
      Case copy = *cases[i];
      copy.recv = copies[i];
      copy.verify(what + ", the copy captured after the collectives");
    }
    eager.verify("eager, after launch " + std::to_string(launch));
    free_case(eager);
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  for (Case* c : cases) free_case(*c);
  for (void* p : copies) CUDA_OK(cudaFree(p));
  CUDA_OK(cudaStreamDestroy(s));
}

// Rank 1 calls 0.5 s late: the others' queries answer cudaErrorNotReady until then.
void not_ready_until_every_rank_calls(ncclComm_t comm, uint64_t seed, int rank, int np) {
  constexpr double kLate = 0.5;
  cudaStream_t s = make_stream();
  Case c{Kind::all_reduce, ncclFloat32, 99, false, 0, 7001};
  c.prepare(seed, rank, np);
  cudaEvent_t done = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kLate));
    NCCL_OK(c.issue(comm, s));
    CUDA_OK(cudaEventRecord(done, s));
    CUDA_OK(cudaStreamSynchronize(s));
  } else {
    NCCL_OK(c.issue(comm, s));
    CUDA_OK(cudaEventRecord(done, s));
    EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady) << "rank 1 has not called yet";
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "rank 1 has not called yet";
    // Not an error: a launch's check after it sees none.
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorNotReady recorded as the last error";
    int not_ready = 0;
    cudaError_t q = cudaErrorNotReady;
    while ((q = cudaEventQuery(done)) == cudaErrorNotReady && seconds_since(t0) < 30) {
      ++not_ready;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const double at = seconds_since(t0);
    EXPECT_EQ(q, cudaSuccess);
    EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
    EXPECT_GE(at, kLate * 0.9) << "complete before rank 1 called";
    EXPECT_GT(not_ready, 10);
    std::printf(
        "[emu-nccl] rank %d: %d queries answered cudaErrorNotReady, complete after "
        "%.3f s (rank 1 called after %.1f s)\n",
        rank, not_ready, at, kLate);
  }
  c.verify("after the late rank's call");
  free_case(c);
  CUDA_OK(cudaEventDestroy(done));
  CUDA_OK(cudaStreamDestroy(s));
}

// Rank 0 calls, the others not (yet): its synchronisation waits until another thread aborts
// the communicator. Then the others call, so that rank 0's worker, still inside the emulation's
// MPI exchange, completes it and every rank can finalise MPI.
void abort_ends_the_wait(uint64_t seed, int rank, int np) {
  ncclComm_t comm = make_comm(rank, np);
  ASSERT_NE(comm, nullptr);
  cudaStream_t s = make_stream();
  Case c{Kind::all_reduce, ncclFloat32, 10, false, 0, 8001};
  c.prepare(seed, rank, np);
  if (rank == 0) {
    NCCL_OK(c.issue(comm, s));
    constexpr double kAbortAfter = 0.3;
    const auto t0 = Clock::now();
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kAbortAfter));
      EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    });
    const cudaError_t e = cudaStreamSynchronize(s);  // waits for the peers, until the abort
    const double waited = seconds_since(t0);
    aborter.join();
    EXPECT_EQ(e, cudaSuccess);
    EXPECT_GE(waited, kAbortAfter * 0.9) << "the synchronisation did not wait for the peers";
    EXPECT_LT(waited, 10.0);
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_NE(async, ncclSuccess) << "an aborted communicator reports an error";
    std::printf(
        "[emu-nccl] rank 0: the synchronisation ended %.3f s after the call, by "
        "ncclCommAbort after %.1f s\n",
        waited, kAbortAfter);
    MPI_Barrier(MPI_COMM_WORLD);
    // The others have called and completed: the left-behind worker has sent its buffer.
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    NCCL_OK(c.issue(comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  free_case(c);
  CUDA_OK(cudaStreamDestroy(s));
}

// Rank 0 all-reduces 5 elements, the others 6: every rank prints the diagnostic (the parent
// checks it) and waits until it aborts.
// `done` (recorded after a mismatched collective) answers cudaErrorNotReady to every query for
// 0.3 s, however few polls a loaded machine allows (the queries also start the collective:
// streams run lazily, and its workers then compare headers); ncclCommAbort ends the wait.
void expect_hang_until_abort(ncclComm_t comm, cudaStream_t s, cudaEvent_t done,
                             const char* completed) {
  const auto t0 = Clock::now();
  int not_ready = 0, queries = 0;
  while (seconds_since(t0) < 0.3) {
    not_ready += cudaEventQuery(done) == cudaErrorNotReady;
    ++queries;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady) << completed;
  EXPECT_EQ(not_ready, queries);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess) << "the abort did not end the wait";
}

// Mismatched calls hang until ncclCommAbort. Sizes: rank 0's all-reduce has 5 elements, the
// others' 6. Graphs: rank 0 launches its all-reduce from a graph, the others issue it eagerly
// (the same call otherwise, but NCCL's graph uniformity is broken).
enum class Mismatch { sizes, graphs };

void mismatch_hangs_until_abort(uint64_t seed, int rank, int np, Mismatch mismatch) {
  ncclComm_t comm = make_comm(rank, np);
  ASSERT_NE(comm, nullptr);
  cudaStream_t s = make_stream();
  const bool graphs = mismatch == Mismatch::graphs;
  const size_t count = graphs ? 7 : rank == 0 ? 5 : 6;
  const uint64_t salt = graphs ? 9101 : 9001;
  Case c{Kind::all_reduce, ncclFloat32, count, false, 0, salt};
  c.prepare(seed, rank, np);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (graphs && rank == 0) {
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    NCCL_OK(c.issue(comm, s));
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, s));
  } else {
    NCCL_OK(c.issue(comm, s));
  }
  cudaEvent_t done = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(done, s));
  expect_hang_until_abort(comm, s, done, "a mismatched call completed");
  if (exec) {
    CUDA_OK(cudaGraphExecDestroy(exec));
  }
  if (graph) {
    CUDA_OK(cudaGraphDestroy(graph));
  }
  free_case(c);
  CUDA_OK(cudaEventDestroy(done));
  CUDA_OK(cudaStreamDestroy(s));
  MPI_Barrier(MPI_COMM_WORLD);
}

struct Mpi {
  Mpi() {
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  ~Mpi() { MPI_Finalize(); }
  int rank = 0, size = 1;
};

void run_collectives_rank(int np) {
  const Mpi mpi;
  ASSERT_EQ(mpi.size, np);
  CUDA_OK(cudaSetDevice(mpi.rank));
  const uint64_t seed = test_seed();  // the parent's, on every rank
  ncclComm_t comm = make_comm(mpi.rank, np);
  ASSERT_NE(comm, nullptr);
  cudaStream_t s = make_stream();
  every_collective(comm, s, seed, mpi.rank, np);
  grouped_calls(comm, s, seed, mpi.rank, np);
  stream_order(comm, seed, mpi.rank, np);
  not_ready_until_every_rank_calls(comm, seed, mpi.rank, np);
  captured_collectives(comm, seed, mpi.rank, np);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  CUDA_OK(cudaStreamDestroy(s));
  abort_ends_the_wait(seed, mpi.rank, np);
  mismatch_hangs_until_abort(seed, mpi.rank, np, Mismatch::sizes);
  mismatch_hangs_until_abort(seed, mpi.rank, np, Mismatch::graphs);
}

void run_duplicate_rank() {
  const Mpi mpi;
  CUDA_OK(cudaSetDevice(0));  // the only device (PACKBERT_EMU_DEVICES=1)
  ncclUniqueId id{};
  if (mpi.rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
  }
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, mpi.size, id, mpi.rank), ncclInvalidUsage);
  EXPECT_EQ(comm, nullptr);
  const std::string last = ncclGetLastError(nullptr);
  EXPECT_NE(last.find("Duplicate GPU detected"), std::string::npos) << last;
}

// Starts mpirun on this binary, running the current test in every rank; returns the output.
std::string run_ranks(int np, const std::string& extra_env) {
  return run_test_in_ranks(np, "PACKBERT_EMU_NCCL_CHILD", extra_env);
}

class EmuNcclRanks : public testing::TestWithParam<int> {};

TEST_P(EmuNcclRanks, CollectivesStreamOrderQueriesAbort) {
  const int np = GetParam();
  if (std::getenv("PACKBERT_EMU_NCCL_CHILD")) {
    run_collectives_rank(np);
    return;
  }
  const std::string out = run_ranks(np, "");
  // The two mismatches' diagnostics, from every rank.
  size_t lines = 0;
  for (size_t at = out.find("ranks disagree on the order of their calls"); at != std::string::npos;
       at = out.find("ranks disagree on the order of their calls", at + 1))
    ++lines;
  EXPECT_EQ(lines, 2 * static_cast<size_t>(np)) << "each mismatch's diagnostic, once per rank";
  EXPECT_NE(out.find("ncclAllReduce of 5 elements"), std::string::npos);
  EXPECT_NE(out.find("ncclAllReduce of 6 elements"), std::string::npos);
  EXPECT_NE(out.find("ncclAllReduce of 7 elements of type 7, root 0, in a graph (captured "
                     "collective #1)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ncclAllReduce of 7 elements of type 7, root 0, not in a graph"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Np, EmuNcclRanks, testing::Values(2, 3),
                         [](const testing::TestParamInfo<int>& i) {
                           return "np" + std::to_string(i.param);
                         });

TEST(EmuNccl, TwoRanksOnOneDeviceAreRefused) {
  if (std::getenv("PACKBERT_EMU_NCCL_CHILD")) {
    run_duplicate_rank();
    return;
  }
  run_ranks(2, " -x PACKBERT_EMU_DEVICES=1");
}

// One rank, no MPI: a collective its stream has not reached when the communicator is aborted
// completes when the stream gets there (its data is what the buffer held), instead of waiting
// forever for a worker that is gone. A run that fails and aborts still frees its memory, and
// cudaFree waits for every stream.
TEST(EmuNccl, CollectivesReachedAfterAbortComplete) {
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  cudaStream_t s = make_stream();
  std::vector<float> host(257, 1.5f);
  float* d = static_cast<float*>(dev_alloc(host.size() * 4));
  ASSERT_EQ(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(d, d, host.size(), ncclFloat32, ncclSum, comm, s), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(d, d, host.size(), ncclFloat32, ncclSum, comm, s), ncclSuccess);
  ASSERT_EQ(ncclCommAbort(comm), ncclSuccess);  // neither has been reached: streams are lazy
  const auto t0 = Clock::now();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
}  // namespace packbert::test
