// Shard reader throughput, one reader thread, with full per-sample validation: format x max
// length, beside the target of 100,000 samples/s per reader thread. A table, never a timed
// assertion. Usage: bench_shard_reader [samples per shard, default 200000]
//
// Each shard is written to a temporary directory, read once to warm the page cache (the
// number measured is the reader's own cost, not the disk's), then read again and timed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/shards/shard.h"
#include "test_util.h"

namespace {

using namespace packbert;

constexpr double kTargetSamplesPerSecond = 100000;

// Lengths drawn like real pretraining data: at 512 from the MLPerf Wikipedia histogram
// (a wide spread, mean ~ 256: half of a 512 row is padding); at 128 mostly full rows, with Google's
// short_seq_prob = 0.1 share of shorter ones.
class LengthDistribution {
 public:
  explicit LengthDistribution(int max_len) : max_len_(max_len) {
    if (max_len == 512) {
      std::ifstream f(std::string(PACKBERT_REPO_DATA) +
                      "/../tests/data/wikipedia-seqlen-histogram-512.txt");
      std::string line;
      std::vector<double> weights;
      while (std::getline(f, line))
        if (!line.empty() && line[0] != '#') weights.push_back(std::stod(line));
      if (weights.size() == 512) {
        for (int len = 0; len < 5; ++len) weights[len] = 0;  // random_sample needs >= 5
        histogram_ = std::discrete_distribution<int>(weights.begin(), weights.end());
        from_histogram_ = true;
      }
    }
  }
  int operator()(std::mt19937_64& rng) {
    if (from_histogram_) return histogram_(rng) + 1;  // line i holds length i
    if (std::uniform_real_distribution<double>(0, 1)(rng) < 0.1)
      return std::uniform_int_distribution<int>(5, max_len_ - 1)(rng);
    return std::uniform_int_distribution<int>(max_len_ - 8, max_len_)(rng);
  }
  const char* source() const { return from_histogram_ ? "wikipedia histogram" : "90% near L"; }

 private:
  int max_len_;
  bool from_histogram_ = false;
  std::discrete_distribution<int> histogram_;
};

struct Timing {
  int64_t samples = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

Timing read_shard(const std::string& path) {
  const auto start = std::chrono::steady_clock::now();
  ShardReader reader(path, SampleRules{});
  Timing t;
  Sample s;
  while (reader.next(s)) {
    ++t.samples;
    t.tokens += s.length();
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t samples = argc > 1 ? std::atoll(argv[1]) : 200000;
  if (samples <= 0) {
    std::fprintf(stderr, "usage: %s [samples per shard > 0]\n", argv[0]);
    return 2;
  }
  test::TempDir dir;
  std::mt19937_64 rng(test::test_seed());
  std::printf(
      "shard reader throughput: 1 reader thread, every sample validated, "
      "second of two reads (page cache warm)\n\n");
  std::printf("%-10s %5s %9s %10s %8s %12s %8s %10s  %s\n", "format", "L", "samples", "mean len",
              "seconds", "samples/s", "MB/s", "vs target", "lengths");
  for (const int max_len : {128, 512}) {
    const int max_predictions = max_len == 128 ? 20 : 76;  // MLPerf's values
    LengthDistribution lengths(max_len);
    for (const ShardFormat format : {ShardFormat::fixed, ShardFormat::var_length}) {
      const std::string path =
          dir.file(std::string(to_string(format)) + "_" + std::to_string(max_len) + ".h5");
      ShardWriteOptions opts;
      opts.format = format;
      opts.max_seq_len = max_len;
      opts.max_predictions = max_predictions;
      {
        ShardWriter writer(path, opts);
        for (int64_t i = 0; i < samples; ++i) {
          const int len = lengths(rng);
          writer.append(test::random_sample(rng, len, len, max_predictions));
        }
        writer.close();
      }
      read_shard(path);  // warm-up
      const Timing t = read_shard(path);
      const double per_second = t.samples / t.seconds;
      const double megabytes = static_cast<double>(std::filesystem::file_size(path)) / 1e6;
      std::printf("%-10s %5d %9lld %10.1f %8.3f %12.0f %8.0f %9.2fx  %s\n", to_string(format),
                  max_len, static_cast<long long>(t.samples),
                  static_cast<double>(t.tokens) / t.samples, t.seconds, per_second,
                  megabytes / t.seconds, per_second / kTargetSamplesPerSecond, lengths.source());
      std::fflush(stdout);
      std::filesystem::remove(path);
    }
  }
  std::printf("\ntarget: %.0f samples/s per reader thread (vs target >= 1.00x meets it)\n",
              kTargetSamplesPerSecond);
  return 0;
}
