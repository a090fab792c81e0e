// Histogram packing: efficiency and runtime of every algorithm on a length histogram (default:
// the MLPerf Wikipedia one at L=512), then the online packer on step-sized batches. A table,
// never a timed assertion. Usage: bench_packing [histogram file] [repeats, default 20]
//
// Runtimes are the median of the repeats (NNLSHP: one run, it takes ~0.5 s).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "data/packing/packing.h"
#include "test_util.h"

namespace {

using namespace packbert;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string k_text(int k) { return k > 0 ? std::to_string(k) : "none"; }

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1]
                                    : std::string(PACKBERT_REPO_DATA) +
                                          "/../tests/data/wikipedia-seqlen-histogram-512.txt";
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 20;
  const LengthHistogram h = load_histogram(path);
  const int L = h.max_len;
  const int64_t n = h.num_sequences(), t = h.num_tokens();
  std::printf("histogram %s: L=%d, %lld sequences, %lld tokens, speed-up limit %.4f\n\n",
              path.c_str(), L, static_cast<long long>(n), static_cast<long long>(t),
              double(n) * L / t);
  std::printf("%-9s %5s %9s %12s %14s %9s %10s %12s\n", "algorithm", "K", "max/pack", "packs",
              "efficiency %", "speed-up", "padding %", "runtime ms");
  struct Case {
    const char* algorithm;
    int k;
  };
  const Case cases[] = {{"spfhp", 3},  {"lpfhp", 3},    {"nnlshp", 3},     {"exact-fit", 3},
                        {"spfhp", 12}, {"lpfhp", 12},   {"exact-fit", 12}, {"spfhp", 0},
                        {"lpfhp", 0},  {"exact-fit", 0}};
  for (const Case& c : cases) {
    const PackingLimits limits{L, c.k};
    if (std::string(c.algorithm) == "nnlshp" &&
        nnlshp_strategy_count(L, c.k) > kNnlshpMaxStrategies)
      continue;
    std::vector<double> ms;
    PackingResult r;
    const int runs = std::string(c.algorithm) == "nnlshp" ? 1 : repeats;
    for (int i = 0; i < runs; ++i) {
      r = pack_with(c.algorithm, h, limits);
      ms.push_back(r.runtime_ms);
    }
    check_packing(h, r);
    const PackingMetrics m = packing_metrics(r);
    std::printf("%-9s %5s %9d %12lld %14.4f %9.5f %10.4f %12.3f\n", c.algorithm,
                k_text(c.k).c_str(), m.max_seqs_in_pack, static_cast<long long>(m.packs),
                100 * m.efficiency, m.speedup, 100 * m.padding_fraction, median(ms));
  }

  // Online: one rank's samples of one step, lengths drawn from the histogram.
  std::printf("\nonline (pack_online, lengths drawn from the histogram, K=3)\n");
  std::printf("%8s %12s %14s %14s\n", "samples", "packs/step", "efficiency %", "us per call");
  std::mt19937_64 rng(test::test_seed());
  std::discrete_distribution<int> draw(h.counts.begin(), h.counts.end());
  for (int batch : {8, 16, 32, 64, 128}) {
    const int steps = 2000;
    std::vector<double> us;
    int64_t packs = 0, tokens = 0;
    for (int s = 0; s < steps; ++s) {
      std::vector<SeqRef> samples(batch);
      for (int i = 0; i < batch; ++i) {
        samples[i] = {i, draw(rng)};
        tokens += samples[i].length;
      }
      const auto t0 = std::chrono::steady_clock::now();
      packs += static_cast<int64_t>(pack_online(samples, {L, 3}).size());
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("%8d %12.2f %14.2f %14.1f\n", batch, double(packs) / steps,
                100.0 * tokens / (double(packs) * L), median(us));
  }
  return 0;
}
