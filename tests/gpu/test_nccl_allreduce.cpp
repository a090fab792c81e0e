// gpu label: the gradient reducer's NCCL transport (comm/nccl_transport.h).
//
//   - One rank without MPI: no NCCL call, the device buffer untouched, the bookkeeping and its
//     errors as on the CPU.
//   - A communicator of one rank (nccl_on_one_rank), the whole path on one GPU: events on a
//     compute stream that lags the host (a host function sleeps before each tensor's write, so a
//     bucket reduced before its event would hold the stale fill), the communication stream,
//     ncclAllReduce, finish() ordering the compute stream; a destructor with a round in flight
//     aborts instead of waiting; a host pointer is refused.
//   - Rounds inside a CUDA graph (NCCL only): recorded once with the backward's writes, replayed
//     twice, the eager rounds' bits (in the multi-rank test below).
//   - The trainer at one rank: the nccl transport (no host copy) and the mpi one (staged through
//     the host) give the same gradients and parameters.
//   - 2, 3 and 4 ranks under mpirun, one GPU each (skipped with a clear message when the machine
//     has fewer GPUs: NCCL cannot put two ranks on one GPU; the emulated build has 8), the nccl
//     transport against the mpi one ("mpi via host") at the same rank count, on one table and
//     uneven ownership (shard_bounds with ranks that own nothing): all-reduce and reduce-scatter
//     rounds against the exact sum within the fp32 bound gamma_np * sum |x|, bitwise the same
//     whatever the readiness order and timing and on every rank; ShardExchange::all_gather of
//     f32, bf16 and f16 bit for bit (and the same bits from both transports), also in groups
//     each read right after its own wait (start_gathers / wait_gather); ShardExchange::sum
//     of an f64 device tensor. The test starts mpirun on its own binary; the ranks find
//     PACKBERT_NCCL_TEST_CHILD set and run the body.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
#include "comm/shard_exchange.h"
#include "mpi_self_test.h"
#include "test_util.h"
#include "trainer_test_util.h"
#include "train/trainer.h"

namespace packbert::test {
namespace {

constexpr float kStale = 1e30f;                 // what a tensor holds before the backward writes it
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
    o.validate = false;  // a validating backend cannot record graphs (no op here reads
                         // indices)
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
      std::printf(
          "[nccl-1] bucket %zu bytes, round %d: %d buckets, %d started / %d complete "
          "before finish\n",
          bucket_bytes, round, s.buckets, s.started_before_finish, s.completed_before_finish);
    }
    // Reduce-scatter (one grouped ncclReduce per owner: here the one rank owns everything) and
    // all_gather (grouped ncclBroadcast) of the f32 buffer and of a bf16 one: nothing changes.
    cuda_ok(cudaMemcpyAsync(grads.data(), fill.p, fill.n * 4, cudaMemcpyHostToDevice, stream.s),
            "fill");
    ar.begin(GradCollective::reduce_scatter);
    backward(stream.s, grads.data(), values, t, reverse_order(t.spans.size()), ar, false);
    ar.finish();
    ShardExchange(ar).all_gather(device_view(grads.data(), t.n));
    const std::vector<float> rs = read_back(stream.s, grads.data(), static_cast<size_t>(t.n));
    ASSERT_EQ(std::memcmp(rs.data(), want.data(), want.size() * 4), 0) << "reduce-scatter";
    const auto half_bytes = static_cast<size_t>(t.n) * 2;
    void* half = cuda_alloc(half_bytes);
    cuda_ok(cudaMemsetAsync(half, 0x5A, half_bytes, stream.s), "fill");
    ShardExchange(ar).all_gather(Tensor(half, DType::bf16, {t.n}, Device::cuda));
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
  TrainerOptions o = tiny_trainer_options(rng, 64, 1e-2, 10);
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
    std::printf(
        "[nccl-trainer] step %lld: loss %.6f vs %.6f, gradient rel L2 %.2e (%s), %d "
        "buckets\n",
        static_cast<long long>(s), a.loss, b.loss, err, gn == gh ? "bitwise" : "not bitwise",
        b.allreduce.buckets);
    expect_measure("step " + std::to_string(s) + ": gradient nccl vs host", err, 1e-6);
    expect_measure("step " + std::to_string(s) + ": loss nccl vs host (rel)",
                   std::abs(a.loss - b.loss) / std::abs(a.loss), 1e-6);
    EXPECT_GT(b.allreduce.buckets, 1);
    EXPECT_EQ(b.allreduce.started_before_finish, b.allreduce.buckets);
  }
  expect_measure("3 steps: weights nccl vs host", rel_l2(nccl.params(), host.params()), 1e-6);
}

// ---- several ranks ----------------------------------------------------------------------

uint64_t hash_bytes(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <typename T>
uint64_t hash_of(const std::vector<T>& v) {
  return hash_bytes(v.data(), v.size() * sizeof(T));
}

// Whether every rank holds the same hash.
bool same_on_every_rank(uint64_t h) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<uint64_t> all(static_cast<size_t>(size));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return std::all_of(all.begin(), all.end(), [&](uint64_t x) { return x == h; });
}

// gamma_k = k u / (1 - k u): a sum of k + 1 terms in floating point of unit roundoff u, in any
// order, is within gamma_k * sum |x_i| of the exact sum (Higham, Accuracy and Stability, 4.2).
// The tests use gamma_np, one more than the np - 1 additions need.
double gamma_k(int k, double u) { return k * u / (1 - k * u); }

// Uneven ownership: np - 1 random cuts, then one rank (drawn) owns nothing, and at np >= 3 a
// second one too. Every rank draws the same bounds from the shared stream.
std::vector<int64_t> uneven_bounds(std::mt19937_64& rng, int np, int64_t n) {
  std::uniform_int_distribution<int64_t> cut(0, n);
  std::vector<int64_t> b(static_cast<size_t>(np) + 1, 0);
  for (int r = 1; r < np; ++r) b[static_cast<size_t>(r)] = cut(rng);
  b.back() = n;
  std::sort(b.begin(), b.end());
  const int empties = np >= 3 ? 2 : 1;
  for (int e = 0; e < empties; ++e) {
    const auto r = static_cast<size_t>(std::uniform_int_distribution<int>(0, np - 1)(rng));
    if (r + 1 < b.size() - 1)
      b[r + 1] = b[r];  // rank r owns [b[r], b[r]): nothing
    else
      b[r] = n;  // the last rank: its start moves to the end
  }
  return b;
}

int owner_of(const std::vector<int64_t>& bounds, int64_t i) {
  // The last r with bounds[r] <= i: empty ranges before it are skipped.
  return static_cast<int>(std::upper_bound(bounds.begin(), bounds.end(), i) - bounds.begin()) - 1;
}

// The elements some bucket covers (all_gather moves those only).
std::vector<char> bucket_cover(const std::vector<GradBucket>& buckets, int64_t n) {
  std::vector<char> in(static_cast<size_t>(n), 0);
  for (const GradBucket& b : buckets)
    std::fill(in.begin() + b.offset, in.begin() + b.offset + b.size, 1);
  return in;
}

// Random bits of one 16-bit element (any pattern: NaNs too, all_gather moves bits) or of an f32
// one (finite: exponent below 255).
std::vector<uint16_t> random_halves(uint64_t seed, int rank, int64_t n) {
  std::mt19937_64 rng(mix(seed ^ 0x16u, static_cast<uint64_t>(rank)));
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) x = static_cast<uint16_t>(rng());
  return v;
}
std::vector<float> random_finite(uint64_t seed, int rank, int64_t n) {
  std::mt19937_64 rng(mix(seed ^ 0x32u, static_cast<uint64_t>(rank)));
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    uint32_t b = static_cast<uint32_t>(rng());
    if (((b >> 23) & 0xFFu) == 0xFFu) b &= ~(1u << 30);
    std::memcpy(&x, &b, 4);
  }
  return v;
}

// Doubles over a wide range of magnitudes (cancellation included).
std::vector<double> random_doubles(uint64_t seed, int rank, int64_t n) {
  std::mt19937_64 rng(mix(seed ^ 0x64u, static_cast<uint64_t>(rank)));
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> e(-30, 30);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = std::ldexp(u(rng), e(rng));
  return v;
}

template <typename T>
std::vector<T> read_device(cudaStream_t stream, const void* dev, size_t n) {
  std::vector<T> out(n);
  cuda_ok(cudaMemcpyAsync(out.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost, stream),
          "read back");
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return out;
}

template <typename T>
void write_device(cudaStream_t stream, void* dev, const std::vector<T>& v) {
  cuda_ok(cudaMemcpyAsync(dev, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
          "write");
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// What one transport produced, for the comparison of the two.
struct TransportResult {
  std::vector<uint64_t> allreduce;  // per bucket size: the hash of the all-reduced buffer
  std::vector<uint64_t> gathered;   // the hashes of the f32, bf16 and f16 gathers
};

// One rank's part under mpirun: the reducer with the given transport against the double sum of
// every rank's values, on the shared table.
TransportResult run_transport(GradTransport transport, int rank, int np, int device, uint64_t seed,
                              const Table& t, const std::vector<int64_t>& bounds, Stream& stream) {
  TransportResult result;
  const char* tname = transport == GradTransport::nccl ? "nccl" : "mpi";
  const std::string tag = std::string(tname) + " np" + std::to_string(np);
  const auto n = static_cast<size_t>(t.n);
  // The exact sums (double holds a sum of np <= 4 floats of [-1, 1) to within 2^-50 relative)
  // and the magnitudes sum |x_r| of the bound.
  std::vector<double> sum(n, 0.0), mag(n, 0.0);
  for (int r = 0; r < np; ++r) {
    const std::vector<float> v = rank_values(t, seed, r);
    for (size_t i = 0; i < n; ++i) sum[i] += v[i], mag[i] += std::abs(v[i]);
  }
  // Derived: an fp32 sum of np terms, in any order, is within gamma_np(2^-24) sum |x_r| of the
  // exact sum; an element no rank wrote (a gap: 0 everywhere) must come back exactly 0.
  const double g32 = gamma_k(np, std::ldexp(1.0, -24));
  const std::vector<float> fill = initial_fill(t);
  const Pinned values(rank_values(t, seed, rank)), start(fill);
  DevBuf<float> grads({t.n});
  std::mt19937_64 own(mix(seed, 1000 + static_cast<uint64_t>(rank)));  // per-rank orders

  // Checks the elements `check` selects against the sum; those outside every bucket must be
  // untouched. Returns the worst error relative to the bound (<= 1 passes).
  const auto check_sums = [&](const std::vector<float>& got, const std::vector<char>& check,
                              const std::vector<char>& in_bucket, const std::string& what) {
    size_t bad = 0, untouched_bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!in_bucket[i]) {
        untouched_bad += std::memcmp(&got[i], &fill[i], 4) != 0;
        continue;
      }
      if (!check[i]) continue;
      const double err = std::abs(static_cast<double>(got[i]) - sum[i]);
      if (mag[i] == 0) {
        bad += !(got[i] == 0.f);
      } else {
        const double ratio = err / (g32 * mag[i]);
        if (!(ratio <= 1)) ++bad;
        worst = std::max(worst, std::isnan(ratio) ? 1e300 : ratio);
      }
    }
    EXPECT_EQ(bad, 0u) << what;
    EXPECT_EQ(untouched_bad, 0u) << what << ": elements outside every bucket changed";
    expect_bound(what + ": |sum - exact| / (gamma_np sum|x|)", worst, 1.0);
  };

  for (size_t bucket_bytes : {size_t{4 * 1000 + 12}, size_t{96} << 10}) {
    SCOPED_TRACE(testing::Message() << tname << ", rank " << rank << ", bucket " << bucket_bytes);
    GradReducerOptions o = reducer_options(bucket_bytes, false, device);
    o.device_transport = transport;
    o.shard_bounds = bounds;
    GradReducer ar(MPI_COMM_WORLD, *stream.backend, device_view(grads.data(), t.n), t.spans, o);
    EXPECT_EQ(ar.size(), np);
    EXPECT_STREQ(ar.transport_name(), transport == GradTransport::nccl ? "nccl" : "mpi via host");
    const std::vector<char> in_bucket = bucket_cover(ar.buckets(), t.n);
    const std::vector<char> everything(n, 1);
    const std::string name = tag + ", bucket " + std::to_string(bucket_bytes) + " bytes";

    // All-reduce: a lagging backward in reverse order, then each rank its own order.
    std::vector<uint64_t> hashes;
    for (int round = 0; round < 2; ++round) {
      cuda_ok(cudaMemcpyAsync(grads.data(), start.p, start.n * 4, cudaMemcpyHostToDevice, stream.s),
              "fill");
      std::vector<int> order = reverse_order(t.spans.size());
      if (round == 1) std::shuffle(order.begin(), order.end(), own);
      ar.begin();
      backward(stream.s, grads.data(), values, t, order, ar, round == 0);
      ar.finish();
      const std::vector<float> got = read_back(stream.s, grads.data(), n);
      check_sums(got, everything, in_bucket, name + ", all-reduce round " + std::to_string(round));
      hashes.push_back(hash_of(got));
    }
    EXPECT_EQ(hashes[1], hashes[0]) << "order and timing changed the bits";
    EXPECT_TRUE(same_on_every_rank(hashes[0])) << "the ranks' all-reduced bits differ";
    result.allreduce.push_back(hashes[0]);

    // All-reduce rounds inside a CUDA graph (comm/grad_reducer.h, Graphs), as full graphs run
    // them: the backward's writes, the ready() calls and complete() recorded at the first
    // round, replayed at the next two, the gradient reset to the stale fill before each (a
    // replay that did not move the data would leave this rank's own values): the eager
    // rounds' bits. The MPI transport cannot be captured.
    EXPECT_EQ(ar.capturable(), transport == GradTransport::nccl);
    if (ar.capturable()) {
      BackendGraph graph;
      for (int round = 0; round < 3; ++round) {
        cuda_ok(
            cudaMemcpyAsync(grads.data(), start.p, start.n * 4, cudaMemcpyHostToDevice, stream.s),
            "fill");
        ar.begin();
        if (round == 0) {
          graph = stream.backend->record_and_replay([&] {
            backward(stream.s, grads.data(), values, t, reverse_order(t.spans.size()), ar, false);
            ar.complete();
          });
        } else {
          stream.backend->replay(graph);
        }
        ar.graph_launched();
        const GradReduceStats st = ar.finish();
        EXPECT_EQ(st.graph, round == 0 ? 1 : 2);
        EXPECT_EQ(st.started_before_finish, st.buckets);
        const std::vector<float> got = read_back(stream.s, grads.data(), n);
        check_sums(got, everything, in_bucket, name + ", graph round " + std::to_string(round));
        EXPECT_EQ(hash_of(got), hashes[0]) << "graph round " << round << ": other bits";
      }
    }

    // Reduce-scatter: this rank's parts hold the sum, then all_gather brings every part to
    // every rank.
    for (int round = 0; round < 2; ++round) {
      cuda_ok(cudaMemcpyAsync(grads.data(), start.p, start.n * 4, cudaMemcpyHostToDevice, stream.s),
              "fill");
      std::vector<int> order = reverse_order(t.spans.size());
      if (round == 1) std::shuffle(order.begin(), order.end(), own);
      ar.begin(GradCollective::reduce_scatter);
      backward(stream.s, grads.data(), values, t, order, ar, round == 0);
      ar.finish();
      const std::vector<float> got = read_back(stream.s, grads.data(), n);
      std::vector<char> mine(n, 0);
      for (size_t k = 0; k < ar.buckets().size(); ++k) {
        const GradBucket s = ar.shard(static_cast<int>(k));
        std::fill(mine.begin() + s.offset, mine.begin() + s.offset + s.size, 1);
      }
      check_sums(got, mine, in_bucket, name + ", reduce-scatter round " + std::to_string(round));
      ShardExchange(ar).all_gather(device_view(grads.data(), t.n));
      const std::vector<float> all = read_back(stream.s, grads.data(), n);
      check_sums(all, everything, in_bucket,
                 name + ", reduce-scatter + all_gather round " + std::to_string(round));
      EXPECT_TRUE(same_on_every_rank(hash_of(all))) << "the ranks' gathered sums differ";
    }

    // all_gather of f32, bf16 and f16 buffers of random bits: element i of a bucket from its
    // owner, bit for bit; the elements outside every bucket keep this rank's own.
    const std::vector<float> f32_mine = random_finite(seed, rank, t.n);
    std::vector<float> f32_want = f32_mine;
    std::vector<uint16_t> h_mine = random_halves(seed, rank, t.n), h_want = h_mine;
    std::vector<std::vector<float>> f32_of(static_cast<size_t>(np));
    std::vector<std::vector<uint16_t>> h_of(static_cast<size_t>(np));
    for (int r = 0; r < np; ++r) {
      f32_of[static_cast<size_t>(r)] = random_finite(seed, r, t.n);
      h_of[static_cast<size_t>(r)] = random_halves(seed, r, t.n);
    }
    for (size_t i = 0; i < n; ++i) {
      if (!in_bucket[i]) continue;
      const auto o = static_cast<size_t>(owner_of(bounds, static_cast<int64_t>(i)));
      f32_want[i] = f32_of[o][i];
      h_want[i] = h_of[o][i];
    }
    {
      write_device(stream.s, grads.data(), f32_mine);
      ShardExchange(ar).all_gather(device_view(grads.data(), t.n));
      const std::vector<float> got = read_device<float>(stream.s, grads.data(), n);
      EXPECT_EQ(std::memcmp(got.data(), f32_want.data(), n * 4), 0) << "f32 all_gather";
      if (bucket_bytes == 4012) result.gathered.push_back(hash_of(got));
    }
    // The same f32 gather in three groups of ranges (ShardExchange::start_gathers, as the
    // sharded optimizer gathers layer by layer), each read on the backend's stream right after
    // its wait_gather and before the later groups are waited for: each group must arrive whole
    // (on NCCL the reader waits for that group's event only; the emulated streams run as late
    // as CUDA allows, so a reader that does not wait sees the old bits).
    {
      write_device(stream.s, grads.data(), f32_mine);
      std::mt19937_64 cut_rng(mix(seed ^ 0x9au, static_cast<uint64_t>(bucket_bytes)));
      int64_t c1 = std::uniform_int_distribution<int64_t>(1, t.n - 2)(cut_rng);
      int64_t c2 = std::uniform_int_distribution<int64_t>(1, t.n - 2)(cut_rng);
      if (c1 > c2) std::swap(c1, c2);
      const int64_t cuts[] = {0, c1, c2, t.n};
      std::vector<std::vector<std::pair<Tensor, ShardExchange::Ranges>>> groups;
      for (int g = 0; g < 3; ++g)
        groups.push_back({{device_view(grads.data(), t.n), {{cuts[g], cuts[g + 1]}}}});
      float* reader = static_cast<float*>(cuda_alloc(n * 4));
      ShardExchange exchange(ar);
      exchange.start_gathers(groups);
      for (int g = 0; g < 3; ++g) {
        exchange.wait_gather(g);
        const auto first = static_cast<size_t>(cuts[g]);
        const auto count = static_cast<size_t>(cuts[g + 1] - cuts[g]);
        cuda_ok(cudaMemcpyAsync(reader + first, grads.data() + first, count * 4,
                                cudaMemcpyDeviceToDevice, stream.s),
                "read a group");
      }
      const std::vector<float> got = read_device<float>(stream.s, reader, n);
      cuda_free(reader);
      EXPECT_EQ(std::memcmp(got.data(), f32_want.data(), n * 4), 0)
          << "f32 all_gather in groups, cut at " << c1 << " and " << c2;
    }
    void* half = cuda_alloc(n * 2);
    for (DType dt : {DType::bf16, DType::f16}) {
      write_device(stream.s, half, h_mine);
      ShardExchange(ar).all_gather(Tensor(half, dt, {t.n}, Device::cuda));
      const std::vector<uint16_t> got = read_device<uint16_t>(stream.s, half, n);
      EXPECT_EQ(std::memcmp(got.data(), h_want.data(), n * 2), 0)
          << dtype_name(dt) << " all_gather";
      if (bucket_bytes == 4012) result.gathered.push_back(hash_of(got));
    }
    cuda_free(half);

    // allreduce_sum of an f64 device tensor. Derived: an fp64 sum of np terms is within
    // gamma_np-1(2^-53) sum |x_r| of the exact sum, and the long double reference within
    // gamma_np-1(2^-64) of it: gamma_np(2^-53) covers both.
    if (bucket_bytes == 4012) {
      constexpr int64_t kValues = 37;
      std::vector<long double> exact(kValues, 0.0L), dmag(kValues, 0.0L);
      for (int r = 0; r < np; ++r) {
        const std::vector<double> v = random_doubles(seed, r, kValues);
        for (size_t i = 0; i < v.size(); ++i) exact[i] += v[i], dmag[i] += std::abs(v[i]);
      }
      void* d = cuda_alloc(kValues * 8);
      write_device(stream.s, d, random_doubles(seed, rank, kValues));
      ShardExchange(ar).sum(Tensor(d, DType::f64, {kValues}, Device::cuda));
      const std::vector<double> got = read_device<double>(stream.s, d, kValues);
      cuda_free(d);
      const double g64 = gamma_k(np, std::ldexp(1.0, -53));
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double ratio = static_cast<double>(std::abs(got[i] - exact[i]) / (g64 * dmag[i]));
        worst = std::max(worst, std::isnan(ratio) ? 1e300 : ratio);
      }
      expect_bound(tag + ", allreduce_sum f64: |sum - exact| / (gamma_np sum|x|)", worst, 1.0);
      EXPECT_TRUE(same_on_every_rank(hash_of(got))) << "the ranks' f64 sums differ";
    }
  }
  return result;
}

// The body each rank runs under mpirun: both transports on the same table and ownership.
void run_rank(int np) {
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  struct Finalize {
    ~Finalize() { MPI_Finalize(); }
  } finalize;
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size, np) << "mpirun started " << size << " ranks";
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int device = local ? std::atoi(local) : rank;
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  const uint64_t seed = test_seed();  // the parent passes its seed to every rank
  std::mt19937_64 rng(seed);          // the same table and bounds on every rank
  const Table t = random_table(rng, 40, 6000);
  const std::vector<int64_t> bounds = uneven_bounds(rng, np, t.n);
  if (rank == 0) {
    std::printf("[nccl-%d] %lld elements, shard bounds", np, static_cast<long long>(t.n));
    for (int64_t b : bounds) std::printf(" %lld", static_cast<long long>(b));
    std::printf("\n");
  }
  Stream stream(device);
  const TransportResult nccl =
      run_transport(GradTransport::nccl, rank, np, device, seed, t, bounds, stream);
  const TransportResult mpi =
      run_transport(GradTransport::mpi, rank, np, device, seed, t, bounds, stream);
  // Gathers move bits: the two transports agree exactly. Sums agree to rounding (each checked
  // against the exact sum above); whether bitwise is printed, not required (MPI's order is its
  // own).
  EXPECT_EQ(nccl.gathered, mpi.gathered) << "nccl and mpi all_gather differ";
  if (rank == 0)
    std::printf("[nccl-%d] all-reduce nccl vs mpi: %s\n", np,
                nccl.allreduce == mpi.allreduce ? "bitwise the same" : "not bitwise the same");
}

class NcclAllreduceRanks : public testing::TestWithParam<int> {};

TEST_P(NcclAllreduceRanks, NcclAgainstMpiTransport) {
  const int np = GetParam();
  if (std::getenv("PACKBERT_NCCL_TEST_CHILD")) {
    run_rank(np);
    return;
  }
  PB_REQUIRE_CUDA_DEVICE();
  const int gpus = cuda_device_count();
  if (gpus < np) {
    std::cout << "skipped: no CUDA device for each of " << np << " NCCL ranks (" << gpus
              << " present; NCCL cannot put two ranks on one GPU)" << std::endl;
    GTEST_SKIP() << "skipped: no CUDA device for each of " << np << " ranks";
  }
  std::string pass;  // the emulation's settings reach the ranks
  for (const char* v : {"PACKBERT_EMU_MUTANT", "PACKBERT_EMU_DEVICES"})
    if (std::getenv(v)) pass += std::string(" -x ") + v;
  run_test_in_ranks(np, "PACKBERT_NCCL_TEST_CHILD", pass);
}

INSTANTIATE_TEST_SUITE_P(Np, NcclAllreduceRanks, testing::Values(2, 3, 4),
                         [](const testing::TestParamInfo<int>& i) {
                           return "np" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(NcclAllreduce, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
