// Multi-rank test of the bucketed gradient reducer (src/comm/grad_reducer.h), run under
// mpirun with 1-4 ranks by ctest (label mpi). Exits non-zero on the first failed check.
//
// Every rank fills the gradient buffer with its own random values (seeded by the seed and its
// rank, so every rank can also compute every other rank's values), and for several bucket sizes
// (one of them cutting buckets inside tensors at odd positions) runs rounds that mark the tensors
// ready in reverse order with random pauses (a backward pass), in a random order of each rank's
// own, and all at once. Checks:
//   - the result equals the sum over ranks computed in double (per element within 1e-6 of the
//     sum of magnitudes, and relative L2 error <= 1e-6); gaps stay 0; elements outside the
//     tensors' span are never touched;
//   - bitwise the same in every round (timing and order do not matter) and on every rank;
//   - --hash-file: rank 0 writes one hash per bucket size, so two runs can be compared bitwise;
//   - MetricSums of doubles; an MPI error surfaces as packbert::Error naming the call;
//   - reduce-scatter: each rank's shard of every bucket holds the sum over ranks;
//     ShardExchange::all_gather then gives every rank the whole sum (f32), and moves 16-bit
//     buffers bit for bit.
// Prints per bucket size how many buckets had started, and completed, before finish(): the
// overlap with the simulated compute (reported, never asserted: it depends on timing).
//
//   mpirun -np 4 mpi_allreduce_driver [--seed S] [--hash-file PATH]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kernels/base/error.h"
#include "kernels/backend.h"
#include "comm/grad_reducer.h"
#include "comm/metric_sums.h"
#include "comm/shard_exchange.h"
#include "core/mpi_check.h"

namespace packbert {
namespace {

struct Args {
  uint64_t seed = 0;
  bool has_seed = false;
  std::string hash_file;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    PB_REQUIRE(i + 1 < argc, "{} needs a value", k);
    if (k == "--seed") {
      a.seed = std::strtoull(argv[++i], nullptr, 10);
      a.has_seed = true;
    } else if (k == "--hash-file") {
      a.hash_file = argv[++i];
    } else {
      PB_THROW("unknown argument '{}' (--seed S, --hash-file PATH)", k);
    }
  }
  return a;
}

#define CHECK_OR_FAIL(cond, ...) PB_REQUIRE(cond, "check failed: " __VA_ARGS__)

uint64_t mix(uint64_t a, uint64_t b) {
  return (a ^ (b + 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
}

// FNV-1a over the bytes: equal hashes = equal bits (for the purpose of this test).
uint64_t hash_floats(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The table (the same on every rank): a leading region no tensor covers, ~70 tensors of random
// sizes with gaps, two big ones spanning many buckets, an empty one, a trailing region.
struct Layout {
  std::vector<GradSpan> spans;
  int64_t n = 0;
  int64_t span_lo = 0, span_hi = 0;
  std::vector<char> covered;
};

Layout make_layout(uint64_t seed) {
  std::mt19937_64 rng(mix(seed, 1));
  std::uniform_int_distribution<int64_t> size(1, 20000), gap(0, 9);
  Layout l;
  int64_t at = 37;
  for (int i = 0; i < 70; ++i) {
    int64_t s = size(rng);
    if (i == 5 || i == 50) s = 300007;  // the word-embedding-like giants
    if (i == 30) s = 0;
    l.spans.push_back({at, s});
    at += s + gap(rng);
  }
  l.span_lo = l.spans.front().offset;
  l.span_hi = l.spans.back().offset + l.spans.back().size;
  l.n = l.span_hi + 53;
  l.covered.assign(static_cast<size_t>(l.n), 0);
  for (const GradSpan& s : l.spans) std::fill_n(l.covered.begin() + s.offset, s.size, 1);
  return l;
}

// Rank r's gradient: random in [-1, 1] (never 0) in the tensors, 0 in the gaps, and a marker
// outside the span that must survive.
std::vector<float> rank_grads(const Layout& l, uint64_t seed, int r) {
  std::mt19937_64 rng(mix(seed, 100 + static_cast<uint64_t>(r)));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> g(static_cast<size_t>(l.n), 0.f);
  for (int64_t i = 0; i < l.n; ++i) {
    if (i < l.span_lo || i >= l.span_hi) {
      g[static_cast<size_t>(i)] = 1000.f + static_cast<float>(r);
    } else if (l.covered[static_cast<size_t>(i)]) {
      float x;
      do x = u(rng);
      while (x == 0.f);
      g[static_cast<size_t>(i)] = x;
    }
  }
  return g;
}

void check_sum(const Layout& l, const std::vector<float>& got, uint64_t seed, int rank, int size,
               const std::string& what) {
  std::vector<double> sum(static_cast<size_t>(l.n), 0.0), mag(static_cast<size_t>(l.n), 0.0);
  for (int r = 0; r < size; ++r) {
    const auto g = rank_grads(l, seed, r);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i], mag[i] += std::fabs(g[i]);
  }
  double num = 0, den = 0;
  for (int64_t i = 0; i < l.n; ++i) {
    const size_t k = static_cast<size_t>(i);
    if (i < l.span_lo || i >= l.span_hi) {
      CHECK_OR_FAIL(got[k] == 1000.f + static_cast<float>(rank),
                    "{}: element {} outside the tensors' span changed to {}", what, i, got[k]);
      continue;
    }
    if (!l.covered[k]) {
      CHECK_OR_FAIL(got[k] == 0.f, "{}: gap element {} is {}", what, i, got[k]);
      continue;
    }
    const double err = std::fabs(got[k] - sum[k]);
    CHECK_OR_FAIL(!std::isnan(got[k]) && err <= 1e-6 * mag[k],
                  "{}: element {} is {}, the double sum is {} (error {:.3g} > 1e-6 * {:.3g})", what,
                  i, got[k], sum[k], err, mag[k]);
    num += err * err;
    den += sum[k] * sum[k];
  }
  const double rel = std::sqrt(num / den);
  CHECK_OR_FAIL(rel <= 1e-6, "{}: relative L2 error {:.3g} > 1e-6", what, rel);
}

// An MPI failure on a communicator with MPI_ERRORS_RETURN becomes an Error naming the call.
void check_mpi_errors_become_errors() {
  MPI_Comm self;
  PB_MPI_CHECK(MPI_Comm_dup(MPI_COMM_SELF, &self));
  PB_MPI_CHECK(MPI_Comm_set_errhandler(self, MPI_ERRORS_RETURN));
  int x = 0;
  bool thrown = false;
  try {
    PB_MPI_CHECK(MPI_Send(&x, 1, MPI_INT, 7, 0, self));  // rank 7 of a 1-rank communicator
  } catch (const Error& e) {
    thrown = std::string(e.what()).find("MPI_Send failed") != std::string::npos;
    CHECK_OR_FAIL(thrown, "the error names the call: {}", e.what());
  }
  CHECK_OR_FAIL(thrown, "MPI_Send to a rank that does not exist did not throw");
  MPI_Comm_free(&self);
}

// Reduce-scatter then all-gather, tensors cut by bucket boundaries, twice: equal parts of the
// buffer (the default), and unequal parts cut at tensor boundaries (as the sharded optimizer
// cuts them) where the last rank owns nothing.
void check_reduce_scatter(Backend& backend, uint64_t seed, int rank, int size, bool equal) {
  const int64_t n = int64_t{size} * 50021 + 17, bucket_elems = 4099;
  std::vector<GradSpan> spans;
  for (int64_t at = 0; at < n;) {
    const int64_t s = std::min<int64_t>(n - at, 1 + static_cast<int64_t>(mix(seed, at) % 9000));
    spans.push_back({at, s});
    at += s;
  }
  auto values = [&](int r) {
    std::mt19937_64 rng(mix(seed, 500 + static_cast<uint64_t>(r)));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> g(static_cast<size_t>(n));
    for (float& x : g) x = u(rng);
    return g;
  };
  std::vector<double> sum(static_cast<size_t>(n), 0.0), mag(sum.size(), 0.0);
  for (int r = 0; r < size; ++r) {
    const auto g = values(r);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i], mag[i] += std::fabs(g[i]);
  }
  std::vector<float> grads = values(rank);
  GradReducerOptions options;
  options.bucket_bytes = static_cast<size_t>(bucket_elems) * sizeof(float);
  if (!equal && size > 1) {
    // Tensor ends nearest to r * n / (size - 1); the last rank's part is empty.
    options.shard_bounds = {0};
    for (int r = 1; r < size; ++r) {
      const int64_t target = size > 1 ? n * r / (size - 1) : n;
      int64_t best = n;
      for (const GradSpan& s : spans)
        if (std::llabs(s.offset + s.size - target) < std::llabs(best - target))
          best = s.offset + s.size;
      options.shard_bounds.push_back(std::max(best, options.shard_bounds.back()));
    }
    options.shard_bounds.back() = n;
    options.shard_bounds.push_back(n);
  }
  GradReducer red(MPI_COMM_WORLD, backend, view(grads.data(), {n}), spans, options);
  red.begin(GradCollective::reduce_scatter);
  for (int i = static_cast<int>(spans.size()) - 1; i >= 0; --i) red.ready_tensor(i);
  red.finish();
  const auto near = [&](float got, size_t i) {
    return !std::isnan(got) && std::fabs(got - sum[i]) <= 1e-6 * mag[i];
  };
  std::vector<char> mine(static_cast<size_t>(n), 0);
  int64_t shard_total = 0;
  const std::vector<int64_t>& bounds = red.shard_bounds();
  const int64_t own_lo = bounds[static_cast<size_t>(rank)];
  const int64_t own_hi = bounds[static_cast<size_t>(rank) + 1];
  for (int k = 0; k < static_cast<int>(red.buckets().size()); ++k) {
    const GradBucket b = red.buckets()[static_cast<size_t>(k)], s = red.shard(k);
    const int64_t lo = std::max(b.offset, own_lo), hi = std::min(b.offset + b.size, own_hi);
    CHECK_OR_FAIL(s.size == std::max<int64_t>(0, hi - lo) && (s.size == 0 || s.offset == lo),
                  "rank {}: shard {} (offset {}, size {}) of bucket (offset {}, size {})", rank, k,
                  s.offset, s.size, b.offset, b.size);
    shard_total += s.size;
    for (int64_t i = s.offset; i < s.offset + s.size; ++i) {
      const auto j = static_cast<size_t>(i);
      CHECK_OR_FAIL(near(grads[j], j), "rank {}: reduce-scatter element {} is {}, the sum {}", rank,
                    i, grads[j], sum[j]);
      mine[j] = 1;
    }
  }
  CHECK_OR_FAIL(shard_total == own_hi - own_lo, "rank {}: shards hold {} of its {} elements", rank,
                shard_total, own_hi - own_lo);
  // Whatever is outside this rank's shards is overwritten by the gather: poison it.
  for (size_t i = 0; i < grads.size(); ++i)
    if (!mine[i]) grads[i] = std::nanf("");
  ShardExchange(red).all_gather(view(grads.data(), {n}));
  for (size_t i = 0; i < grads.size(); ++i)
    CHECK_OR_FAIL(near(grads[i], i), "rank {}: all_gather element {} is {}, the sum {}", rank, i,
                  grads[i], sum[i]);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = mine[i] ? static_cast<uint16_t>(mix(seed, i) >> 48) : uint16_t{0xFFFF};
  ShardExchange(red).all_gather(Tensor(bits.data(), DType::bf16, {n}));
  for (size_t i = 0; i < bits.size(); ++i)
    CHECK_OR_FAIL(bits[i] == static_cast<uint16_t>(mix(seed, i) >> 48),
                  "rank {}: bf16 all_gather element {} is {:#06x}", rank, i, bits[i]);
  if (rank == 0)
    std::cout << fmt::format("reduce-scatter + all_gather over {} buckets, {} parts: passed\n",
                             red.buckets().size(), equal ? "equal" : "tensor-aligned");
}

int run(const Args& args, int rank, int size) {
  uint64_t seed = args.seed;
  if (!args.has_seed) {
    seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  }
  if (rank == 0)
    std::cout << fmt::format("np {} seed {} (rerun with --seed {})\n", size, seed, seed);
  check_mpi_errors_become_errors();

  const Layout l = make_layout(seed);
  const std::vector<float> mine = rank_grads(l, seed, rank);
  // Bucket sizes: small (many buckets), odd (boundaries at odd places inside tensors), the
  // ~1 MB region, exactly the span (one bucket), far bigger than the buffer.
  const int64_t span_bytes = (l.span_hi - l.span_lo) * 4;
  const std::vector<size_t> bucket_bytes = {65536, 400004 + 4 * 7, 1 << 20,
                                            static_cast<size_t>(span_bytes), size_t{1} << 30};
  std::ofstream hashes;
  if (rank == 0 && !args.hash_file.empty()) hashes.open(args.hash_file);

  const auto backend = make_cpu_backend();
  for (size_t bytes : bucket_bytes) {
    std::vector<float> grads(static_cast<size_t>(l.n));
    GradReducerOptions options;
    options.bucket_bytes = bytes;
    GradReducer ar(MPI_COMM_WORLD, *backend, view(grads.data(), {l.n}), l.spans, options);
    CHECK_OR_FAIL(ar.size() == size && ar.rank() == rank, "rank {} of {}", ar.rank(), ar.size());
    // A boundary inside a tensor whenever buckets are smaller than the giants.
    if (bytes < 300007 * 4) {
      bool inside = false;
      for (const GradBucket& b : ar.buckets())
        for (const GradSpan& s : l.spans)
          inside = inside || (b.offset > s.offset && b.offset < s.offset + s.size);
      CHECK_OR_FAIL(inside, "bucket size {}: no bucket boundary inside a tensor", bytes);
    }
    uint64_t first_hash = 0;
    for (int round = 0; round < 3; ++round) {
      const std::string what = fmt::format("rank {} bucket {} B round {}", rank, bytes, round);
      grads = mine;
      std::mt19937_64 rng(mix(seed, 1000 + 16 * static_cast<uint64_t>(rank) + round));
      std::vector<int> order(l.spans.size());
      std::iota(order.begin(), order.end(), 0);
      std::reverse(order.begin(), order.end());  // backward: the last tensors first
      if (round == 1) std::shuffle(order.begin(), order.end(), rng);  // each rank its own order
      ar.begin();
      for (int i : order) {
        if (round < 2) {  // compute between the tensors: random, different on every rank
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        }
        if (round == 1)
          ar.ready(l.spans[i].offset, l.spans[i].size);
        else
          ar.ready_tensor(i);
      }
      if (round == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // more compute
      const GradReduceStats st = ar.finish();
      check_sum(l, grads, seed, rank, size, what);

      const uint64_t h = hash_floats(grads);
      if (round == 0) first_hash = h;
      CHECK_OR_FAIL(h == first_hash, "{}: result differs bitwise from round 0", what);
      // Outside the span every rank keeps its own marker: compare the span across ranks.
      std::vector<float> span(grads.begin() + l.span_lo, grads.begin() + l.span_hi);
      const uint64_t hs = hash_floats(span);
      std::vector<uint64_t> spans_all(static_cast<size_t>(size));
      MPI_Allgather(&hs, 1, MPI_UINT64_T, spans_all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
      for (int r = 0; r < size; ++r)
        CHECK_OR_FAIL(spans_all[static_cast<size_t>(r)] == hs,
                      "{}: rank {} received different bits", what, r);

      int counts[2] = {st.started_before_finish, st.completed_before_finish}, sums[2] = {0, 0};
      double wait = st.finish_wait_s, max_wait = 0;
      MPI_Reduce(counts, sums, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
      MPI_Reduce(&wait, &max_wait, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        std::cout << fmt::format(
            "bucket {:>10} B, {:>3} buckets, round {} ({}): started before finish {:5.1f}, "
            "completed before finish {:5.1f} (mean over ranks), finish wait max {:.2f} ms\n",
            bytes, st.buckets, round,
            round == 0   ? "reverse + pauses"
            : round == 1 ? "own order"
                         : "at once",
            static_cast<double>(sums[0]) / size, static_cast<double>(sums[1]) / size,
            1e3 * max_wait);
      }
      if (round == 0 && hashes.is_open()) hashes << bytes << " " << hs << "\n";
    }
  }

  check_reduce_scatter(*backend, seed, rank, size, true);
  check_reduce_scatter(*backend, seed, rank, size, false);

  // MetricSums: a few doubles summed over ranks.
  {
    MetricSums sums(MPI_COMM_WORLD);
    double m[3] = {1.0 + rank, 0.25 * rank, -2.0};
    sums.sum(m, 3, "MPI_Allreduce (test metrics)");
    const double n = size;
    CHECK_OR_FAIL(m[0] == n * (n + 1) / 2 && m[1] == 0.25 * n * (n - 1) / 2 && m[2] == -2.0 * n,
                  "MetricSums gave {}, {}, {}", m[0], m[1], m[2]);
  }
  if (rank == 0) std::cout << "all checks passed\n";
  return 0;
}

}  // namespace
}  // namespace packbert

int main(int argc, char** argv) {
  int provided = 0, rank = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    packbert::run(packbert::parse(argc, argv), rank, size);
  } catch (const std::exception& e) {
    // As packbert's main: report, then every rank goes down (no rank waits on this one).
    std::cerr << "[rank " << rank << "] error: " << e.what() << std::endl;
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    return 1;
  }
  MPI_Finalize();
  return 0;
}
