// `packbert prepare` throughput, end to end (read, tokenize, plan, mask, write HDF5): the whole
// demo corpus at dupe factor 5, max_seq_len 128, in both shard formats, on 1 and 2 threads.
// Prints a table beside the target; never asserts on time.
//
//   build/tests/bench_prepare [repeats]     (the best of `repeats` runs is shown, default 1)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "data/prepare/prepare.h"
#include "test_util.h"

int main(int argc, char** argv) {
  using namespace packbert;
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  spdlog::set_level(spdlog::level::warn);  // the per-file info lines would break the table
  const std::string data = PACKBERT_REPO_DATA;
  constexpr double kTargetSeconds = 20;

  std::printf(
      "prepare: data/kjv-bible-docs.txt.gz, dupe factor 5, max_seq_len 128, "
      "max_predictions 20, 1 shard (%u hardware threads)\n",
      std::thread::hardware_concurrency());
  std::printf("target: the whole demo corpus at dupe factor 5 in under %.0f s on 2 cores\n\n",
              kTargetSeconds);
  std::printf("%-10s %7s %10s %9s %10s %12s %9s  %s\n", "format", "threads", "text MB", "seconds",
              "text MB/s", "samples", "samples/s", "vs target");
  for (ShardFormat format : {ShardFormat::fixed, ShardFormat::var_length}) {
    for (int threads : {1, 2}) {
      PrepareStats best;
      for (int r = 0; r < repeats; ++r) {
        test::TempDir dir;
        PrepareOptions o;
        o.inputs = {data + "/kjv-bible-docs.txt.gz"};
        o.vocab = data + "/vocab.txt";
        o.output_dir = dir.file("out");
        o.max_seq_len = 128;
        o.max_predictions_per_seq = 20;
        o.dupe_factor = 5;
        o.format = format;
        o.threads = threads;
        const PrepareStats st = run_prepare(o);
        if (r == 0 || st.seconds < best.seconds) best = st;
      }
      const double mb = best.input_bytes / 1e6;
      std::printf("%-10s %7d %10.2f %9.2f %10.2f %12lld %9.0f  %s (%.0fx margin)\n",
                  to_string(format), threads, mb, best.seconds, mb / best.seconds,
                  static_cast<long long>(best.train_samples), best.train_samples / best.seconds,
                  best.seconds < kTargetSeconds ? "meets" : "MISSES",
                  kTargetSeconds / best.seconds);
    }
  }
  return 0;
}
