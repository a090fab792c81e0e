// BERT-mini forward + backward on the CPU backend in the padded, packed and unpadded layouts,
// on sequence lengths drawn from the Wikipedia length histogram: real tokens per second and the
// speed-up of removing padding. Prints a table; asserts nothing about time.
//
//   bench_model_cpu [--tokens 4096] [--reps 2] [--histogram path] [--model mini]
//                   [--max-len 128|512]   (default: both; threads: OMP_NUM_THREADS)
//                   [--print-lengths]     (print "max_len length masked" per drawn sample and
//                                          exit: scripts/bench_cpu_vs_torch.sh times PyTorch
//                                          on exactly these batches)
//
// After each max_len, a summary line sets the unpadded / padded speed-up against the issue's
// target (1.8x at 512) and against the ideal padded rows / unpadded rows (what removing padding
// would give if a step's time were proportional to its rows).
//
// At max_seq_len 128 the lengths are the 512 histogram's clipped to 128 (phase-1 data is
// generated with max_seq_length 128, so its long documents fill the slot the same way).
// Masked positions: 15% of the tokens, at most 20 (128) / 76 (512) as in MLPerf's data.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "data/packing.h"
#include "model/batch.h"
#include "model/bert.h"
#include "model/params.h"

namespace {

using namespace packbert;

Sample make_sample(std::mt19937_64& rng, int64_t id, int len, int max_predictions, int64_t vocab) {
  Sample s;
  s.id = id;
  std::uniform_int_distribution<int32_t> tok(999, static_cast<int32_t>(vocab - 1));
  const int len_a = std::max(1, len / 2);
  for (int i = 0; i < len; ++i) {
    s.input_ids.push_back(i == 0 ? 101 : tok(rng));
    s.segment_ids.push_back(i > len_a ? 1 : 0);
  }
  const int masked = std::min(max_predictions, std::max(1, (len * 15 + 50) / 100));
  std::vector<int32_t> pos;
  for (int i = 1; i < len; ++i) pos.push_back(i);
  std::shuffle(pos.begin(), pos.end(), rng);
  pos.resize(std::min<size_t>(pos.size(), static_cast<size_t>(masked)));
  std::sort(pos.begin(), pos.end());
  for (int32_t p : pos) {
    s.masked_lm_positions.push_back(p);
    s.masked_lm_ids.push_back(tok(rng));
  }
  s.next_sentence_label = static_cast<int8_t>(rng() & 1);
  return s;
}

// Samples with lengths drawn from the histogram (clipped to max_len) up to ~`tokens` tokens.
std::vector<Sample> draw(std::mt19937_64& rng, const LengthHistogram& h, int max_len,
                         int64_t tokens, int64_t vocab) {
  std::discrete_distribution<int> length(h.counts.begin(), h.counts.end());
  std::vector<Sample> out;
  int64_t total = 0;
  const int max_predictions = max_len <= 128 ? 20 : 76;
  while (total < tokens) {
    const int len = std::clamp(length(rng), 2, max_len);
    out.push_back(make_sample(rng, static_cast<int64_t>(out.size()), len, max_predictions, vocab));
    total += len;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 4096;
  int reps = 2;
  std::string model = "mini";
  int only_len = 0;  // 0: both 128 and 512
  bool print_lengths = false;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--print-lengths")) print_lengths = true;
  std::string hist_path =
      std::string(PACKBERT_REPO_DATA) + "/../tests/data/wikipedia-seqlen-histogram-512.txt";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--histogram")) hist_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    if (!std::strcmp(argv[i], "--max-len")) only_len = std::atoi(argv[i + 1]);
  }
  try {
    const LengthHistogram hist = load_histogram(hist_path);
    const BertConfig config = bert_preset(model);
    const ParamTable table(config);
    std::vector<float> params(static_cast<size_t>(table.total())), grads(params.size(), 0.f);
    init_parameters(table, InitOptions{1, 0.02f}, params.data());
    auto be = make_cpu_backend();
    if (!print_lengths) {
      std::printf("BERT-%s (%s), %lld parameters, %d threads, ~%lld real tokens per batch, "
                  "best of %d\n",
                  model.c_str(), describe(config).c_str(), static_cast<long long>(table.total()),
                  cpu::num_threads(), static_cast<long long>(tokens), reps);
      std::printf("lengths: %s\n\n", hist_path.c_str());
      std::printf("%7s  %-8s  %7s  %6s  %7s  %7s  %9s  %10s  %9s  %8s\n", "max_len", "layout",
                  "samples", "rows", "tokens", "masked", "step ms", "tokens/s", "arena MiB",
                  "vs padded");
    }
    std::mt19937_64 rng(7);
    for (int max_len : {128, 512}) {
      // Draw even when skipped, so the 512 batch is the same with or without --max-len 512.
      const auto samples = draw(rng, hist, max_len, tokens, config.real_vocab_size);
      if (print_lengths) {
        for (const Sample& smp : samples)
          std::printf("%d %d %d\n", max_len, smp.length(), smp.num_masked());
        continue;
      }
      if (only_len != 0 && only_len != max_len) continue;
      double padded_rate = 0, unpadded_rate = 0;
      int64_t padded_rows = 0, unpadded_rows = 0;
      for (BatchLayout layout : {BatchLayout::padded, BatchLayout::packed, BatchLayout::unpadded}) {
        const Batch b = make_batch(samples, layout, max_len);
        Bert bert(config, *be, view(params.data(), {table.total()}),
                  view(grads.data(), {table.total()}));
        double best = 1e30;
        for (int r = 0; r <= reps; ++r) {  // the first run warms the arena and scratch
          const auto t0 = std::chrono::steady_clock::now();
          bert.forward(b, b.num_masked(), b.num_seqs(), static_cast<uint32_t>(r), 1);
          bert.backward();
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r > 0) best = std::min(best, s);
        }
        const double rate = static_cast<double>(b.num_tokens()) / best;
        if (layout == BatchLayout::padded) padded_rate = rate, padded_rows = b.rows;
        if (layout == BatchLayout::unpadded) unpadded_rate = rate, unpadded_rows = b.rows;
        std::printf("%7d  %-8s  %7lld  %6lld  %7lld  %7lld  %9.1f  %10.0f  %9.1f  %7.2fx\n",
                    max_len, batch_layout_name(layout), static_cast<long long>(b.num_seqs()),
                    static_cast<long long>(b.rows), static_cast<long long>(b.num_tokens()),
                    static_cast<long long>(b.num_masked()), best * 1e3, rate,
                    bert.arena_high_water() / 1048576.0, rate / padded_rate);
      }
      const double ratio = unpadded_rate / padded_rate;
      const double ideal = static_cast<double>(padded_rows) / static_cast<double>(unpadded_rows);
      std::printf("%7d  unpadded / padded %.2fx  (target >= 1.8x at 512%s; ideal %.2fx = "
                  "padded rows / unpadded rows, %.0f%% of it)\n\n",
                  max_len, ratio, max_len == 512 ? (ratio >= 1.8 ? ": met" : ": NOT met") : "",
                  ideal, 100.0 * ratio / ideal);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model_cpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
