// gpu label: the gradient reducer's NCCL transport (comm/nccl_transport.h).
//
//   - One rank without MPI: no NCCL call, the device buffer untouched, the bookkeeping and its
//     errors as on the CPU.
//   - A communicator of one rank (nccl_on_one_rank), the whole path on one GPU: events on a
//     compute stream that lags the host (a host function sleeps before each tensor's write, so a
//     bucket reduced before its event would hold the stale fill), the communication stream,
//     ncclAllReduce, finish() ordering the compute stream; a destructor with a round in flight
//     aborts instead of waiting; a host pointer is refused.
//   - The trainer at one rank: the nccl transport (no host copy) and the mpi one (staged through
//     the host) give the same gradients and parameters.
//   - Two ranks under mpirun, one GPU each (skipped with a clear message when the machine has
//     fewer GPUs: NCCL cannot put two ranks on one GPU): the sum against double, bitwise the same
//     whatever the readiness order and timing, and on both ranks. The test starts mpirun on
//     its own binary; the ranks find PACKBERT_NCCL_TEST_CHILD set and run the body.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <mpi.h>

#include "cuda_test_util.h"
#include "kernels/backend.h"
#include "comm/grad_reducer.h"
#include "test_util.h"
#include "train/trainer.h"

namespace packbert::test {
namespace {

constexpr float kStale = 1e30f;  // what a tensor holds before the backward writes it
constexpr uint32_t kOutsideBits = 0x7FC0BEEFu;  // elements outside the tensors' span

struct Table {
  std::vector<GradSpan> spans;
  int64_t n = 0;
};

// A leading region no tensor covers, `count` tensors of random sizes with gaps, an empty one, a
// trailing region.
Table random_table(std::mt19937_64& rng, int count, int64_t max_size) {
  std::uniform_int_distribution<int64_t> size(1, max_size), gap(0, 40);
  Table t;
  int64_t at = 100 + gap(rng);
  for (int i = 0; i < count; ++i) {
    const int64_t s = i == count / 2 ? 0 : size(rng);
    t.spans.push_back({at, s});
    at += s + gap(rng);
  }
  t.n = at + 77;
  return t;
}

uint64_t mix(uint64_t a, uint64_t b) {
  return (a ^ (b + 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
}

// Rank r's gradient: random in [-1, 1) inside the tensors, 0 in the gaps between them.
std::vector<float> rank_values(const Table& t, uint64_t seed, int rank) {
  std::mt19937_64 rng(mix(seed, static_cast<uint64_t>(rank)));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(t.n), 0.f);
  for (const GradSpan& s : t.spans)
    for (int64_t i = s.offset; i < s.offset + s.size; ++i) v[static_cast<size_t>(i)] = u(rng);
  return v;
}

// The buffer before a round: stale values in the tensors, 0 in the gaps, a marker outside.
std::vector<float> initial_fill(const Table& t) {
  std::vector<float> v(static_cast<size_t>(t.n), 0.f);
  float outside = 0;
  std::memcpy(&outside, &kOutsideBits, 4);
  const int64_t lo = t.spans.front().offset, hi = t.spans.back().offset + t.spans.back().size;
  for (int64_t i = 0; i < t.n; ++i)
    if (i < lo || i >= hi) v[static_cast<size_t>(i)] = outside;
  for (const GradSpan& s : t.spans)
    std::fill(v.begin() + s.offset, v.begin() + s.offset + s.size, kStale);
  return v;
}

// Pinned host memory, so that copies on a stream stay asynchronous to the host.
struct Pinned {
  explicit Pinned(const std::vector<float>& v) : n(v.size()) {
    cuda_ok(cudaMallocHost(&p, std::max<size_t>(n, 1) * 4), "cudaMallocHost");
    std::copy(v.begin(), v.end(), p);
  }
  ~Pinned() { cudaFreeHost(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  std::vector<float> values() const { return {p, p + n}; }
  float* p = nullptr;
  size_t n;
};

void CUDART_CB pause_stream(void*) { std::this_thread::sleep_for(std::chrono::microseconds(300)); }

// A simulated backward on the compute stream: for each tensor in `order`, a pause on the stream
// (it falls behind the host), the write of the tensor's values, then ready_tensor(). lag = false
// writes without pauses.
void backward(cudaStream_t stream, float* dev, const Pinned& values, const Table& t,
              const std::vector<int>& order, GradReducer& ar, bool lag) {
  for (int i : order) {
    const GradSpan& s = t.spans[static_cast<size_t>(i)];
    if (lag) cuda_ok(cudaLaunchHostFunc(stream, pause_stream, nullptr), "cudaLaunchHostFunc");
    if (s.size > 0)
      cuda_ok(cudaMemcpyAsync(dev + s.offset, values.p + s.offset, static_cast<size_t>(s.size) * 4,
                              cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync");
    ar.ready_tensor(i);
  }
}

std::vector<float> read_back(cudaStream_t stream, const float* dev, size_t n) {
  Pinned out{std::vector<float>(n)};
  // On the compute stream: after finish() it waits for the last bucket.
  cuda_ok(cudaMemcpyAsync(out.p, dev, n * 4, cudaMemcpyDeviceToHost, stream), "read back");
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return out.values();
}

// The reducer orders its work with a backend's stream: the tests write on that stream.
struct Stream {
  explicit Stream(int device = 0) {
    BackendOptions o;
    o.cuda_device = device;
    backend = make_backend(Device::cuda, o);
    s = static_cast<cudaStream_t>(backend->native_stream());
  }
  std::unique_ptr<Backend> backend;
  cudaStream_t s = nullptr;
};

Tensor device_view(float* p, int64_t n) { return Tensor(p, DType::f32, {n}, Device::cuda); }

GradReducerOptions reducer_options(size_t bucket_bytes, bool one_rank_nccl = false,
                                   int device = 0) {
  GradReducerOptions o;
  o.bucket_bytes = bucket_bytes;
  o.nccl_on_one_rank = one_rank_nccl;
  o.cuda_device = device;
  return o;
}

bool uses_nccl(const GradReducer& r) { return std::strcmp(r.transport_name(), "nccl") == 0; }

std::vector<int> reverse_order(size_t n) {
  std::vector<int> o(n);
  std::iota(o.rbegin(), o.rend(), 0);
  return o;
}

TEST(NcclAllreduceOneRank, NoNcclCallAndFullBookkeeping) {
  PB_REQUIRE_CUDA_DEVICE();
  // MPI is not initialized in this process: world size 1, no MPI, CUDA or NCCL call.
  std::mt19937_64 rng(test_seed());
  const Table t = random_table(rng, 20, 500);
  const std::vector<float> fill = initial_fill(t);
  DevBuf<float> grads({t.n}, fill);
  Stream stream;
  GradReducer ar(MPI_COMM_WORLD, *stream.backend, device_view(grads.data(), t.n), t.spans,
                 reducer_options(1000));
  EXPECT_EQ(ar.size(), 1);
  EXPECT_EQ(ar.rank(), 0);
  EXPECT_FALSE(uses_nccl(ar));
  ar.begin();
  for (int i : reverse_order(t.spans.size())) ar.ready_tensor(i);
  EXPECT_THROW(ar.ready_tensor(0), Error);  // twice
  const GradReduceStats s = ar.finish();
  EXPECT_EQ(s.buckets, static_cast<int>(ar.buckets().size()));
  EXPECT_EQ(s.started_before_finish, s.buckets);
  // Bitwise: the marker outside the tensors is a NaN, which never compares equal.
  const std::vector<float> after = grads.values();
  EXPECT_EQ(std::memcmp(after.data(), fill.data(), fill.size() * 4), 0);
  ar.begin();
  ar.ready_tensor(3);
  const std::string e = error_of([&] { ar.finish(); });
  EXPECT_NE(e.find("grad reducer: finish() but tensor 0"), std::string::npos) << e;
}

TEST(NcclAllreduceOneRank, CommunicatorOfOneRunsThePath) {
  PB_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(test_seed());
  const Table t = random_table(rng, 40, 3000);
  const uint64_t seed = rng();
  const std::vector<float> want = [&] {
    std::vector<float> v = rank_values(t, seed, 0);
    const std::vector<float> f = initial_fill(t);
    for (size_t i = 0; i < v.size(); ++i)
      if (f[i] != kStale && f[i] != 0.f) v[i] = f[i];  // outside the span: untouched
    return v;
  }();
  const Pinned values(rank_values(t, seed, 0)), fill(initial_fill(t));
  DevBuf<float> grads({t.n});
  Stream stream;
  for (size_t bucket_bytes : {size_t{4 * 1000 + 12}, size_t{64} << 10, size_t{1} << 20}) {
    SCOPED_TRACE(testing::Message() << "bucket " << bucket_bytes << " bytes");
    GradReducer ar(MPI_COMM_WORLD, *stream.backend, device_view(grads.data(), t.n), t.spans,
                   reducer_options(bucket_bytes, true));
    ASSERT_TRUE(uses_nccl(ar));
    for (int round = 0; round < 3; ++round) {
      cuda_ok(cudaMemcpyAsync(grads.data(), fill.p, fill.n * 4, cudaMemcpyHostToDevice, stream.s),
              "fill");
      std::vector<int> order = reverse_order(t.spans.size());
      if (round == 2) std::shuffle(order.begin(), order.end(), rng);
      ar.begin();
      backward(stream.s, grads.data(), values, t, order, ar, round < 2);
      const GradReduceStats s = ar.finish();
      EXPECT_EQ(s.buckets, static_cast<int>(ar.buckets().size()));
      const std::vector<float> got = read_back(stream.s, grads.data(), static_cast<size_t>(t.n));
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "round " << round;
      std::printf("[nccl-1] bucket %zu bytes, round %d: %d buckets, %d started / %d complete "
                  "before finish\n",
                  bucket_bytes, round, s.buckets, s.started_before_finish,
                  s.completed_before_finish);
    }
    // Reduce-scatter (one grouped ncclReduce per owner: here the one rank owns everything) and
    // all_gather (grouped ncclBroadcast) of the f32 buffer and of a bf16 one: nothing changes.
    cuda_ok(cudaMemcpyAsync(grads.data(), fill.p, fill.n * 4, cudaMemcpyHostToDevice, stream.s),
            "fill");
    ar.begin(GradCollective::reduce_scatter);
    backward(stream.s, grads.data(), values, t, reverse_order(t.spans.size()), ar, false);
    ar.finish();
    ar.all_gather(device_view(grads.data(), t.n));
    const std::vector<float> rs = read_back(stream.s, grads.data(), static_cast<size_t>(t.n));
    ASSERT_EQ(std::memcmp(rs.data(), want.data(), want.size() * 4), 0) << "reduce-scatter";
    const auto half_bytes = static_cast<size_t>(t.n) * 2;
    void* half = cuda_alloc(half_bytes);
    cuda_ok(cudaMemsetAsync(half, 0x5A, half_bytes, stream.s), "fill");
    ar.all_gather(Tensor(half, DType::bf16, {t.n}, Device::cuda));
    std::vector<uint16_t> halves(static_cast<size_t>(t.n));
    cuda_ok(cudaMemcpyAsync(halves.data(), half, half_bytes, cudaMemcpyDeviceToHost, stream.s),
            "read back");
    cuda_ok(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
    cuda_free(half);
    for (uint16_t x : halves) ASSERT_EQ(x, 0x5A5A);
    // Destroyed with a round in flight (an exception in the backward): aborts, never waits.
    ar.begin();
    backward(stream.s, grads.data(), values, t, {static_cast<int>(t.spans.size()) - 1}, ar, true);
  }
  cuda_ok(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
  // Host memory is not a device gradient buffer.
  std::vector<float> host(static_cast<size_t>(t.n));
  const std::string e = error_of([&] {
    GradReducer bad(MPI_COMM_WORLD, *stream.backend, device_view(host.data(), t.n), t.spans,
                    reducer_options(1 << 20, true));
  });
  EXPECT_NE(e.find("is not memory of GPU 0"), std::string::npos) << e;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(CudaTrainerAllreduce, NcclAndHostPathsAgreeOnOneRank) {
  PB_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(test_seed());
  StepBatch batch = random_step_batch(rng, 8, 2, 5, 64, 10);
  TrainerOptions o;
  o.config = bert_preset("tiny");
  o.max_seq_len = 64;
  o.init_seed = rng();
  o.dropout_seed = rng();
  o.lr.base_lr = 1e-2;
  o.lr.max_steps = 10;
  o.lr.num_warmup_steps = 1;
  o.device = Device::cuda;
  o.bucket_bytes = 64 << 10;  // many buckets
  o.gpu_transport = GradTransport::mpi;
  Trainer host(MPI_COMM_WORLD, o);
  o.gpu_transport = GradTransport::nccl;
  Trainer nccl(MPI_COMM_WORLD, o);
  for (int64_t s = 0; s < 3; ++s) {
    batch.step = s;
    std::vector<float> gh, gn;
    const StepMetrics a = host.step(batch, [&](const float* g, int64_t n) { gh.assign(g, g + n); });
    const StepMetrics b = nccl.step(batch, [&](const float* g, int64_t n) { gn.assign(g, g + n); });
    const double err = rel_l2(gn, gh);
    std::printf("[nccl-trainer] step %lld: loss %.6f vs %.6f, gradient rel L2 %.2e (%s), %d "
                "buckets\n",
                static_cast<long long>(s), a.loss, b.loss, err,
                gn == gh ? "bitwise" : "not bitwise", b.allreduce.buckets);
    expect_measure("step " + std::to_string(s) + ": gradient nccl vs host", err, 1e-6);
    expect_measure("step " + std::to_string(s) + ": loss nccl vs host (rel)",
                   std::abs(a.loss - b.loss) / std::abs(a.loss), 1e-6);
    EXPECT_GT(b.allreduce.buckets, 1);
    EXPECT_EQ(b.allreduce.started_before_finish, b.allreduce.buckets);
  }
  expect_measure("3 steps: weights nccl vs host", rel_l2(nccl.params(), host.params()), 1e-6);
}

// ---- two ranks ----------------------------------------------------------------------------

constexpr int kRanks = 2;

uint64_t hash_floats(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * 4; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The body each rank runs under mpirun.
void run_rank() {
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  struct Finalize {
    ~Finalize() { MPI_Finalize(); }
  } finalize;
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int device = local ? std::atoi(local) : rank;
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  const uint64_t seed = test_seed();  // the parent passes its seed to every rank
  std::mt19937_64 rng(seed);          // the same table on every rank
  const Table t = random_table(rng, 70, 40000);
  std::mt19937_64 own(mix(seed, 1000 + static_cast<uint64_t>(rank)));  // per-rank orders

  // The expected sum, in double from every rank's values; the marker outside the span.
  const std::vector<float> fill = initial_fill(t);
  std::vector<double> sum(static_cast<size_t>(t.n), 0.0), mag(static_cast<size_t>(t.n), 0.0);
  for (int r = 0; r < size; ++r) {
    const std::vector<float> v = rank_values(t, seed, r);
    for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i], mag[i] += std::abs(v[i]);
  }
  const Pinned values(rank_values(t, seed, rank)), start(fill);
  DevBuf<float> grads({t.n});
  Stream stream(device);
  for (size_t bucket_bytes : {size_t{4 * 1000 + 12}, size_t{256} << 10, size_t{4} << 20}) {
    SCOPED_TRACE(testing::Message() << "rank " << rank << ", bucket " << bucket_bytes);
    GradReducer ar(MPI_COMM_WORLD, *stream.backend, device_view(grads.data(), t.n), t.spans,
                   reducer_options(bucket_bytes, false, device));
    ASSERT_EQ(ar.size(), size);
    ASSERT_TRUE(uses_nccl(ar));
    std::vector<uint64_t> hashes;
    for (int round = 0; round < 3; ++round) {
      cuda_ok(cudaMemcpyAsync(grads.data(), start.p, start.n * 4, cudaMemcpyHostToDevice,
                              stream.s),
              "fill");
      std::vector<int> order = reverse_order(t.spans.size());
      if (round == 1) std::shuffle(order.begin(), order.end(), own);  // each rank its own order
      ar.begin();
      backward(stream.s, grads.data(), values, t, order, ar, round < 2);
      const GradReduceStats s = ar.finish();
      const std::vector<float> got = read_back(stream.s, grads.data(), static_cast<size_t>(t.n));
      double num = 0, den = 0;
      size_t bad = 0, outside_bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (fill[i] != kStale && fill[i] != 0.f) {  // outside the span: never touched
          outside_bad += std::memcmp(&got[i], &fill[i], 4) != 0;
          continue;
        }
        const double d = got[i] - sum[i];
        bad += !(std::abs(d) <= 1e-6 * std::max(mag[i], 1.0));
        num += d * d;
        den += sum[i] * sum[i];
      }
      EXPECT_EQ(bad, 0u) << "round " << round;
      EXPECT_EQ(outside_bad, 0u) << "round " << round;
      expect_measure("all-reduce vs double sum, round " + std::to_string(round),
                     std::sqrt(num / den), 1e-6);
      hashes.push_back(hash_floats(got));
      if (rank == 0)
        std::printf("[nccl-%d] bucket %zu bytes, round %d: %d buckets, %d started / %d complete "
                    "before finish\n",
                    size, bucket_bytes, round, s.buckets, s.started_before_finish,
                    s.completed_before_finish);
    }
    EXPECT_EQ(hashes[1], hashes[0]) << "order and timing changed the bits";
    EXPECT_EQ(hashes[2], hashes[0]) << "order and timing changed the bits";
    std::vector<uint64_t> all(static_cast<size_t>(size));
    MPI_Allgather(&hashes[0], 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 0; r < size; ++r)
      EXPECT_EQ(all[static_cast<size_t>(r)], hashes[0]) << "rank " << r;
  }
}

TEST(NcclAllreduceRanks, SumOverTwoRanksOneGpuEach) {
  if (std::getenv("PACKBERT_NCCL_TEST_CHILD")) {
    run_rank();
    return;
  }
  PB_REQUIRE_CUDA_DEVICE();
  const int gpus = cuda_device_count();
  if (gpus < kRanks) {
    std::cout << "skipped: no CUDA device for each of " << kRanks << " NCCL ranks (" << gpus
              << " present; NCCL cannot put two ranks on one GPU)" << std::endl;
    GTEST_SKIP() << "skipped: no CUDA device for each of " << kRanks << " ranks";
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string out;
  const int rc = run_command(
      std::string(PACKBERT_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " +
          std::to_string(kRanks) + " -x PACKBERT_NCCL_TEST_CHILD=1 -x PACKBERT_TEST_SEED=" +
          std::to_string(test_seed()) + " -x OMP_NUM_THREADS=1 " + self +
          " --gtest_filter=NcclAllreduceRanks.SumOverTwoRanksOneGpuEach 2>&1",
      &out);
  std::cout << out;
  EXPECT_EQ(rc, 0) << "the ranks failed (output above)";
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos);
  EXPECT_EQ(out.find("[  SKIPPED ]"), std::string::npos);
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(NcclAllreduce, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
