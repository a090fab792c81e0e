// emulated label: CUDA graphs by stream capture in the emulated runtime (kernels/cuda_emu,
// capture.cpp's "Stream capture"), against CUDA's definitions:
//   - a captured sequence (kernels through PB_LAUNCH, a pinned host-to-device copy, a memset, an
//     event record, a cub scan, a pinned device-to-host copy) runs nothing while captured, and
//     each launch of its graph gives what the same calls give run eagerly and what a host
//     reference computes, reading its inputs' contents at the launch (they change between
//     launches) and the kernel arguments copied at the capture;
//   - host functions, asynchronous items (the NCCL emulation's collectives, and a test item held
//     incomplete until released) run again at every launch, each a fresh run the stream waits
//     for; an executable graph destroyed while a launch is pending; launches of one executable
//     graph on two streams run in launch order;
//   - fork/join capture over two and three streams; an unjoined fork is
//     cudaErrorStreamCaptureUnjoined;
//   - each call CUDA forbids during a capture returns its error and invalidates the capture
//     (cudaStreamIsCapturing: Invalidated; cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated
//     and no graph), after which the stream works again; which calls a capture's mode forbids to
//     which thread;
//   - the runtime's counters: a capture counts its launches once, a graph launch adds one graph
//     launch and nothing else.
// Inputs are random, from the test seed (PACKBERT_TEST_SEED reproduces a run).
#include <cub/cub.cuh>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/device_seams.cuh"
#include "kernels/cuda_emu/runtime.h"
#include "test_util.h"

namespace {

using packbert::test::test_seed;

template <typename T>
struct Dev {
  explicit Dev(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess); }
  ~Dev() { EXPECT_EQ(cudaFree(p), cudaSuccess); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void set(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  T* p = nullptr;
  size_t n;
};

template <typename T>
struct Pinned {
  explicit Pinned(size_t n) : n(n) { EXPECT_EQ(cudaMallocHost(&p, n * sizeof(T)), cudaSuccess); }
  ~Pinned() { EXPECT_EQ(cudaFreeHost(p), cudaSuccess); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  std::vector<T> get() const { return std::vector<T>(p, p + n); }
  T* p = nullptr;
  size_t n;
};

cudaStreamCaptureStatus capture_status(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  return status;
}

// A stream for one test. A test that fails inside a capture leaves it through here, so that the
// next test does not start inside it.
struct Stream {
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
  }
  ~Stream() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(s, &g);
      if (g) cudaGraphDestroy(g);
    }
    cudaStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s; }
  cudaStream_t s = nullptr;
};

struct Event {
  Event() { EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess); }
  ~Event() { cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  operator cudaEvent_t() const { return e; }
  cudaEvent_t e = nullptr;
};

struct Graph {
  ~Graph() {
    if (exec) {
      EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    }
    if (graph) {
      EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    }
  }
  // Ends the capture on s and instantiates its graph.
  void end(cudaStream_t s) {
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    ASSERT_NE(graph, nullptr);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

unsigned blocks_for(int n) { return static_cast<unsigned>((n + 127) / 128); }

__global__ void affine(const uint32_t* x, uint32_t* acc, uint32_t a, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) acc[i] += a * x[i] + static_cast<uint32_t>(i);
}

__global__ void combine(const uint32_t* scan, const uint32_t* z, uint32_t* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = scan[i] * 3u + (z[i] ^ (static_cast<uint32_t>(i) * 2654435761u));
}

__global__ void add_const(uint32_t* x, uint32_t c, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] += c;
}

__global__ void sum_into(const uint32_t* a, const uint32_t* b, uint32_t* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = a[i] + 2u * b[i];
}

__global__ void times(const uint32_t* x, uint32_t* y, uint32_t m, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = x[i] * m;
}

__global__ void floats_from(const uint32_t* x, float* f, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) f[i] = static_cast<float>(x[i] % 4096u) - 2048.f;
}

__global__ void uints_from(const float* f, uint32_t* x, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = static_cast<uint32_t>(static_cast<int32_t>(f[i]) + 5000);
}

// ---- the sequence: copy in, memset, kernel, event record, cub scan, kernel, copy out ----------
std::vector<uint32_t> reference(const std::vector<uint32_t>& in, const std::vector<uint32_t>& z,
                                uint32_t a) {
  const size_t n = in.size();
  std::vector<uint32_t> acc(n), y(n);
  for (size_t i = 0; i < n; ++i) acc[i] = a * in[i] + static_cast<uint32_t>(i);
  uint32_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t scan = sum;
    sum += acc[i];
    y[i] = scan * 3u + (z[i] ^ (static_cast<uint32_t>(i) * 2654435761u));
  }
  return y;
}

struct Sequence {
  explicit Sequence(int n)
      : n(n), in(n), out(n), x(n), acc(n), scan(n), z(n), y(n), temp(temp_bytes()) {
    cudaGetLastError();  // an earlier test's, cleared: issue checks its own
  }

  static size_t temp_bytes() {
    size_t bytes = 0;
    EXPECT_EQ(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<uint32_t*>(nullptr),
                                            static_cast<uint32_t*>(nullptr), 1),
              cudaSuccess);
    return bytes;
  }

  // New contents for the inputs: the pinned host buffer and the device buffer z.
  void fresh_inputs(std::mt19937_64& rng) {
    host_in.resize(static_cast<size_t>(n));
    host_z.resize(static_cast<size_t>(n));
    for (auto& v : host_in) v = static_cast<uint32_t>(rng());
    for (auto& v : host_z) v = static_cast<uint32_t>(rng());
    std::memcpy(in.p, host_in.data(), host_in.size() * 4);
    z.set(host_z);
  }

  void issue(cudaStream_t s, uint32_t a, cudaEvent_t event) {
    const size_t bytes = static_cast<size_t>(n) * 4;
    EXPECT_EQ(cudaMemcpyAsync(x.p, in.p, bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(acc.p, 0, bytes, s), cudaSuccess);
    PB_LAUNCH(blocks_for(n), 128, 0, s, affine)(x.p, acc.p, a, n);
    EXPECT_EQ(cudaEventRecord(event, s), cudaSuccess);
    size_t temp_size = temp.n;
    EXPECT_EQ(cub::DeviceScan::ExclusiveSum(temp.p, temp_size, acc.p, scan.p, n, s), cudaSuccess);
    PB_LAUNCH(blocks_for(n), 128, 0, s, combine)(scan.p, z.p, y.p, n);
    EXPECT_EQ(cudaMemcpyAsync(out.p, y.p, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }

  int n;
  Pinned<uint32_t> in, out;
  Dev<uint32_t> x, acc, scan, z, y;
  Dev<unsigned char> temp;
  std::vector<uint32_t> host_in, host_z;
};

TEST(EmuGraphs, ReplaysGiveTheEagerResultsAndReadCurrentInputs) {
  std::mt19937_64 rng(test_seed());
  const int n = 1 + static_cast<int>(rng() % 2000);
  Sequence seq(n);
  Stream s;
  Event event;
  seq.fresh_inputs(rng);
  std::fill(seq.out.p, seq.out.p + n, 0xdeadbeefu);
  seq.y.set(std::vector<uint32_t>(static_cast<size_t>(n), 0xfeedf00du));
  const std::vector<uint32_t> acc_before = seq.acc.get();

  uint32_t a = static_cast<uint32_t>(rng()) | 1u;
  const uint32_t captured_a = a;
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusActive);
  seq.issue(s, a, event);
  g.end(s);
  a += 12345u;  // the graph keeps the argument of its capture
  EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusNone);

  // Nothing ran while captured.
  EXPECT_EQ(seq.out.get(), std::vector<uint32_t>(static_cast<size_t>(n), 0xdeadbeefu));
  EXPECT_EQ(seq.y.get(), std::vector<uint32_t>(static_cast<size_t>(n), 0xfeedf00du));
  EXPECT_EQ(seq.acc.get(), acc_before);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(seq.out.get(), std::vector<uint32_t>(static_cast<size_t>(n), 0xdeadbeefu));

  const int launches = 2 + static_cast<int>(rng() % 4);
  for (int r = 0; r < launches; ++r) {
    if (r > 0) seq.fresh_inputs(rng);  // the replay reads the buffers as they are now
    const std::vector<uint32_t> want = reference(seq.host_in, seq.host_z, captured_a);
    ASSERT_EQ(cudaGraphLaunch(g.exec, s), cudaSuccess);
    EXPECT_NE(seq.out.get(), want) << "the launch ran before the host waited for it";
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<uint32_t> replayed = seq.out.get();
    EXPECT_EQ(replayed, want) << "launch " << r;

    // The same calls run eagerly give the same bits.
    std::fill(seq.out.p, seq.out.p + n, 0u);
    seq.issue(s, captured_a, event);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(seq.out.get(), replayed) << "launch " << r;
    EXPECT_EQ(cudaEventQuery(event), cudaSuccess);  // recorded eagerly again
    std::fill(seq.out.p, seq.out.p + n, 0u);
  }
}

// Host functions and a memset captured, with a kernel and a device-to-host copy: none runs at
// the capture, each runs once per launch.
void count_call(void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }

TEST(EmuGraphs, NothingRunsDuringCaptureAndEachLaunchRunsEverything) {
  std::mt19937_64 rng(test_seed() + 1);
  const int n = 1 + static_cast<int>(rng() % 500);
  std::vector<uint32_t> start(static_cast<size_t>(n));
  for (auto& v : start) v = static_cast<uint32_t>(rng());
  Dev<uint32_t> x(static_cast<size_t>(n)), flag(1);
  x.set(start);
  flag.set({7u});
  Pinned<uint32_t> out(static_cast<size_t>(n));
  std::fill(out.p, out.p + n, 1u);
  std::atomic<int> calls{0};
  const uint32_t c = static_cast<uint32_t>(rng());
  Stream s;
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s, count_call, &calls), cudaSuccess);
  PB_LAUNCH(blocks_for(n), 128, 0, s, add_const)(x.p, c, n);
  ASSERT_EQ(cudaMemsetAsync(flag.p, 0, 4, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.p, x.p, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s, count_call, &calls), cudaSuccess);
  g.end(s);
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(x.get(), start);
  EXPECT_EQ(flag.get(), std::vector<uint32_t>{7u});
  EXPECT_EQ(out.get(), std::vector<uint32_t>(static_cast<size_t>(n), 1u));

  for (int r = 1; r <= 3; ++r) {
    flag.set({7u});
    ASSERT_EQ(cudaGraphLaunch(g.exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(calls.load(), 2 * r);
    EXPECT_EQ(flag.get(), std::vector<uint32_t>{0u});
    std::vector<uint32_t> want = start;
    for (auto& v : want) v += static_cast<uint32_t>(r) * c;  // the kernel adds c at each launch
    EXPECT_EQ(x.get(), want);
    EXPECT_EQ(out.get(), want);
  }
}

// ---- asynchronous items ------------------------------------------------------------------------
// An item held incomplete until the test releases its run: each launch issues a fresh run,
// which the stream's later work waits for.
struct HeldItem {
  std::atomic<int> issued{0}, started{0}, released{0};
  void enqueue(cudaStream_t s) {
    ASSERT_EQ(packbert::emu::enqueue_async(s, "held item",
                                           [this] {
                                             const int run = ++issued;
                                             return packbert::emu::AsyncRun{
                                                 [this] { ++started; },
                                                 [this, run] { return released.load() >= run; }};
                                           }),
              cudaSuccess);
  }
};

TEST(EmuGraphs, AsynchronousItemsRunAfreshAtEachLaunch) {
  std::mt19937_64 rng(test_seed() + 2);
  const int n = 1 + static_cast<int>(rng() % 300);
  std::vector<uint32_t> start(static_cast<size_t>(n));
  for (auto& v : start) v = static_cast<uint32_t>(rng());
  Dev<uint32_t> x(static_cast<size_t>(n));
  x.set(start);
  const uint32_t c = static_cast<uint32_t>(rng()) | 1u;
  HeldItem held;
  Stream s;
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  held.enqueue(s);
  PB_LAUNCH(blocks_for(n), 128, 0, s, add_const)(x.p, c, n);
  g.end(s);
  EXPECT_EQ(held.issued.load(), 0) << "a captured item is issued at the launch";

  for (int r = 1; r <= 3; ++r) {
    ASSERT_EQ(cudaGraphLaunch(g.exec, s), cudaSuccess);
    EXPECT_EQ(held.issued.load(), r);
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
    EXPECT_EQ(held.started.load(), r);
    std::vector<uint32_t> before = start;
    for (auto& v : before) v += static_cast<uint32_t>(r - 1) * c;
    EXPECT_EQ(x.get(), before) << "the kernel after the item waits for it";
    held.released = r;
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<uint32_t> after = before;
    for (auto& v : after) v += c;
    EXPECT_EQ(x.get(), after);
  }
}

// An executable graph and its graph destroyed while a launch of it waits: the launch still runs.
TEST(EmuGraphs, DestroyingAnExecutableGraphLeavesItsPendingLaunch) {
  std::mt19937_64 rng(test_seed() + 3);
  const int n = 1 + static_cast<int>(rng() % 300);
  std::vector<uint32_t> start(static_cast<size_t>(n));
  for (auto& v : start) v = static_cast<uint32_t>(rng());
  Dev<uint32_t> x(static_cast<size_t>(n));
  x.set(start);
  const uint32_t c = static_cast<uint32_t>(rng());
  HeldItem held;
  Stream s;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  held.enqueue(s);
  PB_LAUNCH(blocks_for(n), 128, 0, s, add_const)(x.p, c, n);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  held.released = 2;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<uint32_t> want = start;
  for (auto& v : want) v += 2u * c;
  EXPECT_EQ(x.get(), want);
}

// CUDA orders each launch of an executable graph behind its previous launch, on any stream: a
// launch on b waits for the one on a, which no one else waits for here (the streams are lazy).
TEST(EmuGraphs, LaunchesOfOneGraphOnTwoStreamsRunInOrder) {
  std::mt19937_64 rng(test_seed() + 4);
  const int n = 1 + static_cast<int>(rng() % 300);
  std::vector<uint32_t> start(static_cast<size_t>(n));
  for (auto& v : start) v = static_cast<uint32_t>(rng());
  Dev<uint32_t> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  x.set(start);
  const uint32_t m = static_cast<uint32_t>(rng()) | 1u;
  Stream capture, a, b;
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal), cudaSuccess);
  PB_LAUNCH(blocks_for(n), 128, 0, capture, times)(x.p, y.p, m, n);   // y = x * m
  PB_LAUNCH(blocks_for(n), 128, 0, capture, times)(y.p, x.p, 1u, n);  // x = y
  g.end(capture);
  ASSERT_EQ(cudaGraphLaunch(g.exec, a), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(g.exec, b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  std::vector<uint32_t> want = start;
  for (auto& v : want) v *= m * m;
  EXPECT_EQ(x.get(), want);
}

// A one-rank NCCL all-reduce captured between two kernels: each launch issues a fresh
// collective (its own index on the communicator) and the kernel after it waits for it.
TEST(EmuGraphs, CapturedCollectivesRunAtEachLaunch) {
  std::mt19937_64 rng(test_seed() + 5);
  const int n = 1 + static_cast<int>(rng() % 400);
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  Dev<uint32_t> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  Dev<float> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  {
    Stream s;
    Graph g;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    PB_LAUNCH(blocks_for(n), 128, 0, s, floats_from)(x.p, send.p, n);
    ASSERT_EQ(ncclAllReduce(send.p, recv.p, static_cast<size_t>(n), ncclFloat32, ncclSum, comm, s),
              ncclSuccess);
    PB_LAUNCH(blocks_for(n), 128, 0, s, uints_from)(recv.p, y.p, n);
    g.end(s);
    for (int r = 0; r < 3; ++r) {
      std::vector<uint32_t> in(static_cast<size_t>(n)), want(static_cast<size_t>(n));
      for (size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<uint32_t>(rng());
        want[i] = static_cast<uint32_t>(static_cast<int32_t>(in[i] % 4096u) - 2048 + 5000);
      }
      x.set(in);
      ASSERT_EQ(cudaGraphLaunch(g.exec, s), cudaSuccess);
      // An eager collective between launches keeps its place in the order of issue.
      ASSERT_EQ(
          ncclAllReduce(recv.p, recv.p, static_cast<size_t>(n), ncclFloat32, ncclSum, comm, s),
          ncclSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(y.get(), want) << "launch " << r;
    }
  }
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// ---- fork and join ------------------------------------------------------------------------------
TEST(EmuGraphs, ForkJoinCaptureReplays) {
  std::mt19937_64 rng(test_seed() + 6);
  const int n = 1 + static_cast<int>(rng() % 600);
  const auto un = static_cast<size_t>(n);
  Pinned<uint32_t> in(un), out(un);
  Dev<uint32_t> x(un), p(un), q(un), sum(un);
  const uint32_t cp = static_cast<uint32_t>(rng()), mq = static_cast<uint32_t>(rng()) | 1u;
  Stream origin, side, other;
  Event fork, join;
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(x.p, in.p, un * 4, cudaMemcpyHostToDevice, origin), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, origin), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
  EXPECT_EQ(capture_status(side), cudaStreamCaptureStatusActive) << "the wait joins the capture";
  EXPECT_EQ(capture_status(other), cudaStreamCaptureStatusNone);
  PB_LAUNCH(blocks_for(n), 128, 0, side, times)(x.p, q.p, mq, n);  // side: q = x * mq
  ASSERT_EQ(cudaMemcpyAsync(p.p, x.p, un * 4, cudaMemcpyDeviceToDevice, origin), cudaSuccess);
  PB_LAUNCH(blocks_for(n), 128, 0, origin, add_const)(p.p, cp, n);  // origin: p = x + cp
  ASSERT_EQ(cudaEventRecord(join, side), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(origin, join, 0), cudaSuccess);
  PB_LAUNCH(blocks_for(n), 128, 0, origin, sum_into)(p.p, q.p, sum.p, n);
  ASSERT_EQ(cudaMemcpyAsync(out.p, sum.p, un * 4, cudaMemcpyDeviceToHost, origin), cudaSuccess);
  g.end(origin);
  EXPECT_EQ(capture_status(side), cudaStreamCaptureStatusNone);

  for (int r = 0; r < 3; ++r) {
    std::vector<uint32_t> want(un);
    for (size_t i = 0; i < un; ++i) {
      in.p[i] = static_cast<uint32_t>(rng());
      want[i] = (in.p[i] + cp) + 2u * (in.p[i] * mq);
    }
    // Any stream may launch it, one that took no part in the capture too.
    const cudaStream_t on = r == 1 ? other.s : origin.s;
    ASSERT_EQ(cudaGraphLaunch(g.exec, on), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(on), cudaSuccess);
    EXPECT_EQ(out.get(), want) << "launch " << r;
  }
}

// A fork of a fork, joined back through its parent.
TEST(EmuGraphs, NestedForksJoinThroughTheirParent) {
  std::mt19937_64 rng(test_seed() + 7);
  const int n = 1 + static_cast<int>(rng() % 300);
  const auto un = static_cast<size_t>(n);
  std::vector<uint32_t> start(un);
  for (auto& v : start) v = static_cast<uint32_t>(rng());
  Dev<uint32_t> x(un), y(un), z(un);
  x.set(start);
  Stream a, b, c;
  Event e1, e2, e3, e4;
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e1, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, e1, 0), cudaSuccess);
  PB_LAUNCH(blocks_for(n), 128, 0, b, times)(x.p, y.p, 3u, n);  // y = 3x
  ASSERT_EQ(cudaEventRecord(e2, b), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(c, e2, 0), cudaSuccess);
  PB_LAUNCH(blocks_for(n), 128, 0, c, times)(y.p, z.p, 5u, n);  // z = 5y
  ASSERT_EQ(cudaEventRecord(e3, c), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, e3, 0), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e4, b), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(a, e4, 0), cudaSuccess);
  PB_LAUNCH(blocks_for(n), 128, 0, a, add_const)(z.p, 1u, n);  // z += 1
  g.end(a);
  for (cudaStream_t s : {a.s, b.s, c.s}) EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaGraphLaunch(g.exec, a), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  std::vector<uint32_t> want = start;
  for (auto& v : want) v = v * 15u + 1u;
  EXPECT_EQ(z.get(), want);
}

// A stream that joined the capture and is not joined back: cudaStreamEndCapture fails with
// cudaErrorStreamCaptureUnjoined, gives no graph, and ends the capture on both streams. Also
// when the forked stream only waited (the emulation's stricter reading: a fork is joined back
// whether or not it captured work).
TEST(EmuGraphs, UnjoinedForkIsAnError) {
  std::mt19937_64 rng(test_seed() + 8);
  const int n = 1 + static_cast<int>(rng() % 300);
  Dev<uint32_t> x(static_cast<size_t>(n));
  std::vector<uint32_t> start(static_cast<size_t>(n));
  for (auto& v : start) v = static_cast<uint32_t>(rng());
  x.set(start);
  for (const bool side_work : {true, false}) {
    Stream origin, side;
    Event fork, late;
    ASSERT_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(fork, origin), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
    if (side_work) {
      // Joined before its last work only: still unjoined.
      ASSERT_EQ(cudaEventRecord(late, side), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(origin, late, 0), cudaSuccess);
      PB_LAUNCH(blocks_for(n), 128, 0, side, add_const)(x.p, 1u, n);
    }
    PB_LAUNCH(blocks_for(n), 128, 0, origin, add_const)(x.p, 2u, n);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&rng);  // overwritten
    EXPECT_EQ(cudaStreamEndCapture(origin, &graph), cudaErrorStreamCaptureUnjoined);
    EXPECT_EQ(graph, nullptr);
    EXPECT_EQ(capture_status(origin), cudaStreamCaptureStatusNone);
    EXPECT_EQ(capture_status(side), cudaStreamCaptureStatusNone);
    EXPECT_EQ(x.get(), start) << "nothing captured ran";
    // Both streams work again.
    PB_LAUNCH(blocks_for(n), 128, 0, side, add_const)(x.p, 3u, n);
    PB_LAUNCH(blocks_for(n), 128, 0, origin, add_const)(x.p, 4u, n);
    ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(origin), cudaSuccess);
    for (auto& v : start) v += 7u;
    EXPECT_EQ(x.get(), start);
  }
}

// ---- what a capture forbids ---------------------------------------------------------------------
// Each case runs inside a capture of its own, on a stream with a kernel and an event record
// captured, and the call's error must invalidate the capture.
struct Forbidden {
  const char* name;
  cudaStreamCaptureMode mode;
  unsigned stream_flags;
  cudaError_t want;
  // s: the capturing stream; captured: an event recorded in the capture; eager: one recorded
  // before it; dev, pinned: memory allocated before it.
  std::function<cudaError_t(cudaStream_t s, cudaEvent_t captured, cudaEvent_t eager, uint32_t* dev,
                            uint32_t* pinned)>
      call;
};

void PrintTo(const Forbidden& f, std::ostream* os) { *os << f.name; }

std::vector<Forbidden> forbidden_calls() {
  constexpr auto global = cudaStreamCaptureModeGlobal;
  constexpr auto relaxed = cudaStreamCaptureModeRelaxed;
  constexpr unsigned nonblocking = cudaStreamNonBlocking, blocking = cudaStreamDefault;
  return {
      {"cudaStreamSynchronize", relaxed, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t s, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t*) {
         return cudaStreamSynchronize(s);
       }},
      {"cudaStreamQuery", relaxed, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t s, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t*) {
         return cudaStreamQuery(s);
       }},
      {"cudaEventSynchronize", relaxed, nonblocking, cudaErrorCapturedEvent,
       [](cudaStream_t, cudaEvent_t e, cudaEvent_t, uint32_t*, uint32_t*) {
         return cudaEventSynchronize(e);
       }},
      {"cudaEventQuery", relaxed, nonblocking, cudaErrorCapturedEvent,
       [](cudaStream_t, cudaEvent_t e, cudaEvent_t, uint32_t*, uint32_t*) {
         return cudaEventQuery(e);
       }},
      {"cudaDeviceSynchronize", relaxed, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t*) {
         return cudaDeviceSynchronize();
       }},
      {"cudaMemcpy_blocking", relaxed, blocking, cudaErrorStreamCaptureImplicit,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t* h) {
         return cudaMemcpy(h, d, 4, cudaMemcpyDeviceToHost);
       }},
      {"cudaMemcpy_global", global, nonblocking, cudaErrorStreamCaptureImplicit,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t*) {
         uint32_t h = 0;
         return cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost);
       }},
      {"cudaMemset_blocking", relaxed, blocking, cudaErrorStreamCaptureImplicit,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t*) {
         return cudaMemset(d, 0, 4);
       }},
      {"cudaMemset_global", global, nonblocking, cudaErrorStreamCaptureImplicit,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t*) {
         return cudaMemset(d, 0, 4);
       }},
      {"cudaMemcpyAsync_pageable_source", relaxed, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t s, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t*) {
         std::vector<uint32_t> h(4, 1u);
         return cudaMemcpyAsync(d, h.data(), 16, cudaMemcpyHostToDevice, s);
       }},
      {"cudaMemcpyAsync_pageable_destination", relaxed, nonblocking,
       cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t s, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t*) {
         std::vector<uint32_t> h(4, 1u);
         return cudaMemcpyAsync(h.data(), d, 16, cudaMemcpyDeviceToHost, s);
       }},
      {"cudaMalloc", global, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t*) {
         void* p = nullptr;
         const cudaError_t e = cudaMalloc(&p, 64);
         EXPECT_EQ(p, nullptr);
         return e;
       }},
      {"cudaFree", global, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t*) { return cudaFree(d); }},
      {"cudaMallocHost", global, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t*) {
         void* p = nullptr;
         const cudaError_t e = cudaMallocHost(&p, 64);
         EXPECT_EQ(p, nullptr);
         return e;
       }},
      {"cudaFreeHost", global, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t* h) {
         return cudaFreeHost(h);
       }},
      {"legacy_stream_kernel_blocking", relaxed, blocking, cudaErrorStreamCaptureImplicit,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t*) {
         PB_LAUNCH(1, 1, 0, nullptr, add_const)(d, 1u, 1);
         return cudaGetLastError();
       }},
      {"legacy_stream_kernel_global", global, nonblocking, cudaErrorStreamCaptureImplicit,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t* d, uint32_t*) {
         PB_LAUNCH(1, 1, 0, cudaStreamLegacy, add_const)(d, 1u, 1);
         return cudaGetLastError();
       }},
      {"legacy_stream_synchronize", global, nonblocking, cudaErrorStreamCaptureImplicit,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t*) {
         return cudaStreamSynchronize(nullptr);
       }},
      {"legacy_stream_event_record", relaxed, blocking, cudaErrorStreamCaptureImplicit,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t eager, uint32_t*, uint32_t*) {
         return cudaEventRecord(eager, nullptr);
       }},
      {"wait_for_an_uncaptured_event", relaxed, nonblocking, cudaErrorStreamCaptureIsolation,
       [](cudaStream_t s, cudaEvent_t, cudaEvent_t eager, uint32_t*, uint32_t*) {
         return cudaStreamWaitEvent(s, eager, 0);
       }},
      {"uncaptured_event_synchronize_global", global, nonblocking,
       cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t, cudaEvent_t, cudaEvent_t eager, uint32_t*, uint32_t*) {
         return cudaEventSynchronize(eager);
       }},
      {"cudaStreamDestroy", relaxed, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t s, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t*) {
         return cudaStreamDestroy(s);
       }},
      {"cudaGraphLaunch_into_the_capture", relaxed, nonblocking, cudaErrorStreamCaptureUnsupported,
       [](cudaStream_t s, cudaEvent_t, cudaEvent_t, uint32_t*, uint32_t*) {
         cudaStream_t other = nullptr;
         cudaGraph_t g = nullptr;
         cudaGraphExec_t exec = nullptr;
         EXPECT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
         EXPECT_EQ(cudaStreamBeginCapture(other, cudaStreamCaptureModeRelaxed), cudaSuccess);
         EXPECT_EQ(cudaStreamEndCapture(other, &g), cudaSuccess);
         EXPECT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
         const cudaError_t e = cudaGraphLaunch(exec, s);
         EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
         EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
         EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
         return e;
       }},
  };
}

class EmuGraphsForbidden : public testing::TestWithParam<Forbidden> {};

TEST_P(EmuGraphsForbidden, ReturnsItsErrorAndInvalidatesTheCapture) {
  const Forbidden& f = GetParam();
  std::mt19937_64 rng(test_seed() + 9);
  const int n = 1 + static_cast<int>(rng() % 200);
  std::vector<uint32_t> start(static_cast<size_t>(n));
  for (auto& v : start) v = static_cast<uint32_t>(rng());
  Dev<uint32_t> x(static_cast<size_t>(n));
  x.set(start);
  uint32_t* dev = nullptr;
  uint32_t* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 64), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  Stream s(f.stream_flags);
  Event captured, eager;
  ASSERT_EQ(cudaEventRecord(eager, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGetLastError();  // an earlier test's, cleared: some calls here answer with it

  ASSERT_EQ(cudaStreamBeginCapture(s, f.mode), cudaSuccess);
  PB_LAUNCH(blocks_for(n), 128, 0, s, add_const)(x.p, 1u, n);
  ASSERT_EQ(cudaEventRecord(captured, s), cudaSuccess);
  const cudaError_t got = f.call(s, captured, eager, dev, pinned);
  EXPECT_EQ(got, f.want) << cudaGetErrorName(got);
  EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusInvalidated);
  // The capture's streams refuse work until it ends.
  EXPECT_EQ(cudaMemsetAsync(x.p, 0, 4, s), cudaErrorStreamCaptureInvalidated);
  PB_LAUNCH(blocks_for(n), 128, 0, s, add_const)(x.p, 1u, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&rng);  // overwritten
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusNone);
  EXPECT_EQ(x.get(), start) << "nothing captured ran";

  // The stream works again, and the calls refused during the capture are allowed.
  cudaGetLastError();  // cudaStreamEndCapture's error, cleared
  PB_LAUNCH(blocks_for(n), 128, 0, s, add_const)(x.p, 5u, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (auto& v : start) v += 5u;
  EXPECT_EQ(x.get(), start);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Calls, EmuGraphsForbidden, testing::ValuesIn(forbidden_calls()),
                         [](const testing::TestParamInfo<Forbidden>& i) {
                           return std::string(i.param.name);
                         });

// What each mode forbids to which thread: cudaMalloc stands for the unsafe calls.
TEST(EmuGraphs, CaptureModesDecideWhichThreadsMayMakeUnsafeCalls) {
  auto malloc_on_another_thread = [] {
    cudaError_t e = cudaErrorUnknown;
    std::thread([&e] {
      void* p = nullptr;
      e = cudaMalloc(&p, 64);
      if (e == cudaSuccess) {
        EXPECT_EQ(cudaFree(p), cudaSuccess);
      }
    }).join();
    return e;
  };
  auto malloc_here = [] {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, 64);
    if (e == cudaSuccess) {
      EXPECT_EQ(cudaFree(p), cudaSuccess);
    }
    return e;
  };
  struct Want {
    cudaStreamCaptureMode mode;
    bool here_allowed, other_allowed;
  };
  for (const Want w : {Want{cudaStreamCaptureModeRelaxed, true, true},
                       Want{cudaStreamCaptureModeThreadLocal, false, true},
                       Want{cudaStreamCaptureModeGlobal, false, false}}) {
    SCOPED_TRACE(w.mode);
    {
      Stream s;
      ASSERT_EQ(cudaStreamBeginCapture(s, w.mode), cudaSuccess);
      EXPECT_EQ(malloc_on_another_thread(),
                w.other_allowed ? cudaSuccess : cudaErrorStreamCaptureUnsupported);
      EXPECT_EQ(capture_status(s), w.other_allowed ? cudaStreamCaptureStatusActive
                                                   : cudaStreamCaptureStatusInvalidated);
      cudaGraph_t g = nullptr;
      EXPECT_EQ(cudaStreamEndCapture(s, &g),
                w.other_allowed ? cudaSuccess : cudaErrorStreamCaptureInvalidated);
      if (g) {
        EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
      }
    }
    {
      Stream s;
      ASSERT_EQ(cudaStreamBeginCapture(s, w.mode), cudaSuccess);
      EXPECT_EQ(malloc_here(), w.here_allowed ? cudaSuccess : cudaErrorStreamCaptureUnsupported);
      cudaGraph_t g = nullptr;
      EXPECT_EQ(cudaStreamEndCapture(s, &g),
                w.here_allowed ? cudaSuccess : cudaErrorStreamCaptureInvalidated);
      if (g) {
        EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
      }
    }
  }
  // A Relaxed capture on a non-blocking stream leaves the legacy stream to the host.
  Dev<uint32_t> x(1);
  x.set({41u});
  Stream s;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  cudaGetLastError();  // the refusals' above, cleared
  PB_LAUNCH(1, 1, 0, nullptr, add_const)(x.p, 1u, 1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(x.get(), std::vector<uint32_t>{42u});
  EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusActive);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
}

TEST(EmuGraphs, BeginAndEndCaptureMisuse) {
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeRelaxed),
            cudaErrorStreamCaptureUnsupported);
  {
    Stream s;
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorIllegalState) << "not capturing";
    EXPECT_EQ(cudaStreamBeginCapture(s, static_cast<cudaStreamCaptureMode>(3)),
              cudaErrorInvalidValue);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
    EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(g, nullptr);
  }
  {  // Only the stream that began a capture ends it.
    Stream origin, side;
    Event fork, join;
    ASSERT_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(fork, origin), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
    EXPECT_EQ(cudaStreamEndCapture(side, &g), cudaErrorStreamCaptureUnmatched);
    EXPECT_EQ(capture_status(side), cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(cudaEventRecord(join, side), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(origin, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(capture_status(side), cudaStreamCaptureStatusNone);
  }
  {  // A Global or ThreadLocal capture ends on the thread that began it; a Relaxed one anywhere.
    for (const auto mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                            cudaStreamCaptureModeRelaxed}) {
      Stream s;
      ASSERT_EQ(cudaStreamBeginCapture(s, mode), cudaSuccess);
      cudaError_t e = cudaErrorUnknown;
      cudaGraph_t from_thread = nullptr;
      std::thread([&] { e = cudaStreamEndCapture(s, &from_thread); }).join();
      if (mode == cudaStreamCaptureModeRelaxed) {
        EXPECT_EQ(e, cudaSuccess);
        EXPECT_NE(from_thread, nullptr);
        EXPECT_EQ(cudaGraphDestroy(from_thread), cudaSuccess);
      } else {
        EXPECT_EQ(e, cudaErrorStreamCaptureWrongThread);
        EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
      }
      EXPECT_EQ(capture_status(s), cudaStreamCaptureStatusNone);
    }
  }
  {  // The legacy stream's status while a blocking stream captures: an error, not an invalidation.
    Stream blocking(cudaStreamDefault);
    ASSERT_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(nullptr, &status), cudaErrorStreamCaptureImplicit);
    EXPECT_EQ(capture_status(blocking), cudaStreamCaptureStatusActive);
    EXPECT_EQ(cudaStreamEndCapture(blocking, &g), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
    EXPECT_EQ(cudaStreamIsCapturing(nullptr, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  }
  {  // Two captures cannot merge; an event of an ended capture stays a captured event.
    Stream a, b, c;
    Event ea;
    ASSERT_EQ(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(ea, a), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(b, ea, 0), cudaErrorStreamCaptureMerge);
    EXPECT_EQ(capture_status(a), cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(capture_status(b), cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(cudaEventQuery(ea), cudaErrorCapturedEvent);
    EXPECT_EQ(cudaStreamWaitEvent(c, ea, 0), cudaErrorCapturedEvent);
    EXPECT_EQ(capture_status(c), cudaStreamCaptureStatusNone);
    ASSERT_EQ(cudaEventRecord(ea, c), cudaSuccess);  // recorded outside a capture again
    EXPECT_EQ(cudaEventSynchronize(ea), cudaSuccess);
  }
  // Instantiation's arguments.
  EXPECT_EQ(cudaGraphInstantiate(nullptr, nullptr, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphLaunch(nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST(EmuGraphs, ErrorNamesAndStrings) {
  const std::pair<cudaError_t, const char*> names[] = {
      {cudaErrorIllegalState, "cudaErrorIllegalState"},
      {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported"},
      {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated"},
      {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge"},
      {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched"},
      {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined"},
      {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation"},
      {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit"},
      {cudaErrorCapturedEvent, "cudaErrorCapturedEvent"},
      {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread"},
  };
  for (const auto& [e, name] : names) {
    EXPECT_STREQ(cudaGetErrorName(e), name);
    EXPECT_STRNE(cudaGetErrorString(e), "unknown error") << name;
  }
  EXPECT_EQ(static_cast<int>(cudaErrorStreamCaptureUnsupported), 900);
  EXPECT_EQ(static_cast<int>(cudaErrorStreamCaptureWrongThread), 908);
  EXPECT_EQ(static_cast<int>(cudaErrorIllegalState), 401);
}

// ---- counters -----------------------------------------------------------------------------------
TEST(EmuGraphs, ACaptureCountsItsLaunchesOnceAndAGraphLaunchOnlyItself) {
  std::mt19937_64 rng(test_seed() + 10);
  const int n = 1 + static_cast<int>(rng() % 200);
  const int kernels = 1 + static_cast<int>(rng() % 5);
  Dev<uint32_t> x(static_cast<size_t>(n));
  x.set(std::vector<uint32_t>(static_cast<size_t>(n), 0u));
  Stream s;
  Graph g;
  const packbert::emu::Counters c0 = packbert::emu::counters();
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  for (int k = 0; k < kernels; ++k) PB_LAUNCH(blocks_for(n), 128, 0, s, add_const)(x.p, 1u, n);
  ASSERT_EQ(cudaMemsetAsync(x.p, 0, 4, s), cudaSuccess);
  g.end(s);
  const packbert::emu::Counters c1 = packbert::emu::counters();
  EXPECT_EQ(c1.launches - c0.launches, kernels + 1);
  EXPECT_EQ(c1.host_syncs - c0.host_syncs, 0);
  EXPECT_EQ(c1.graph_launches - c0.graph_launches, 0);

  const int launches = 1 + static_cast<int>(rng() % 4);
  for (int r = 1; r <= launches; ++r) {
    const packbert::emu::Counters before = packbert::emu::counters();
    ASSERT_EQ(cudaGraphLaunch(g.exec, s), cudaSuccess);
    const packbert::emu::Counters after = packbert::emu::counters();
    EXPECT_EQ(after.graph_launches - before.graph_launches, 1);
    EXPECT_EQ(after.launches - before.launches, 0);
    EXPECT_EQ(after.host_syncs - before.host_syncs, 0);
    EXPECT_EQ(after.pageable_copies - before.pageable_copies, 0);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const packbert::emu::Counters synced = packbert::emu::counters();
    EXPECT_EQ(synced.launches - after.launches, 0) << "the replay's kernels count nothing";
    EXPECT_EQ(synced.host_syncs - after.host_syncs, 1);
    std::vector<uint32_t> want(static_cast<size_t>(n), static_cast<uint32_t>(r * kernels));
    want[0] = 0u;
    EXPECT_EQ(x.get(), want);
  }
}

}  // namespace
