// Mini-sequence Transformer (MST) and activation recomputation on the CPU (default) or CUDA
// backend (--device cuda, on a GPU machine: scripts/device_check.sh runs it there): for
// BERT-Large width (H 1024, I 4096, 16 heads, V 30528) at long sequence lengths, the measured
// activation arena (high-water mark, by kind of buffer) and the step time of forward + backward
// for M = 1, 2, 4, 8 chunks and each recompute mode. Prints tables; asserts nothing about time.
//
//   bench_mst [--device cpu|cuda] [--lens 512,2048,8192] [--layers 2] [--chunks 1,2,4,8]
//             [--warmup 1] [--reps 1] [--check24 1]  (threads: OMP_NUM_THREADS; time: the
//                                                    fastest of --reps steps after --warmup)
//             [--mlm-chunk-rows 0]                   (BertOptions::mlm_chunk_rows; 0 = from M)
//             [--memory-gib G]                       (device memory for the longest-sequence
//                                                    estimate; default: the GPU's, else 139.8,
//                                                    an H200)
//
// A full 24-layer BERT-Large step is ~1 TFLOP at 512 tokens (hours at 8192 on 2 cores), so the
// timed runs use --layers (2) layers of BERT-Large width, and each row also gives the 24-layer
// peak from the closed-form formula (tests/model/mst_formula.h, which test_model_mst checks
// against the arena to the byte). --check24 measures a 24-layer arena at 512 tokens once (a
// forward with gradients on carves the whole step's arena, backward buffers included) and
// compares it with the formula.
//
// The batch is one sequence of `len` tokens (unpadded), 15% of them masked (76 at 512, as in
// MLPerf). M > 1 implies recompute = mlp (MST recomputes the MLP intermediate in backward), so
// rows "none" and "mlp" coincide for M > 1 and only "mlp" is printed there.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <memory>
#include <vector>

#ifdef PACKBERT_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_backend.h"
#endif
#include "../model/mst_formula.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/device.h"
#include "model/batch.h"
#include "model/bert.h"
#include "model/params.h"
#include "train/batching.h"

namespace {

using namespace packbert;
using Clock = std::chrono::steady_clock;

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoll(item.c_str()));
  return out;
}

Sample make_sample(std::mt19937_64& rng, int64_t id, int len, int masked, int64_t vocab) {
  Sample s;
  s.id = id;
  std::uniform_int_distribution<int32_t> tok(999, static_cast<int32_t>(vocab - 1));
  const int len_a = len / 2;
  for (int i = 0; i < len; ++i) {
    s.input_ids.push_back(i == 0 ? 101 : (i == len_a || i == len - 1) ? 102 : tok(rng));
    s.segment_ids.push_back(i > len_a ? 1 : 0);
  }
  std::vector<int32_t> pos;
  for (int i = 1; i < len - 1; ++i)
    if (i != len_a) pos.push_back(i);
  std::shuffle(pos.begin(), pos.end(), rng);
  pos.resize(static_cast<size_t>(masked));
  std::sort(pos.begin(), pos.end());
  for (int32_t p : pos) {
    s.masked_lm_positions.push_back(p);
    s.masked_lm_ids.push_back(tok(rng));
  }
  s.next_sentence_label = 1;
  return s;
}

double mib(size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

size_t kind(const ActivationBytes& k, ActivationKind which) { return k[static_cast<int>(which)]; }

struct Row {
  int64_t chunks;
  Recompute recompute;
  ActivationBytes bytes{};
  size_t peak = 0;
  double seconds = 0;
  bool formula_ok = false;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lens = {512, 2048, 8192};
  std::vector<int64_t> chunk_list = {1, 2, 4, 8};
  int64_t layers = 2;
  int warmup = 1, reps = 1;
  bool check24 = true;
  int64_t mlm_chunk_rows = 0;
  std::string device = "cpu";
  double memory_gib = 0;
  [[maybe_unused]] bool check24_given = false;  // read by the cuda branch
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--device")) device = argv[i + 1];
    if (!std::strcmp(argv[i], "--memory-gib")) memory_gib = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--check24")) check24_given = true;
    if (!std::strcmp(argv[i], "--lens")) lens = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--chunks")) chunk_list = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--layers")) layers = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--check24")) check24 = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--mlm-chunk-rows")) mlm_chunk_rows = std::atoll(argv[i + 1]);
  }
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  BertConfig config = bert_preset("large");
  config.layers = layers;
  config.max_position_embeddings = std::max<int64_t>(512, max_len);
  BertConfig large24 = config;
  large24.layers = 24;

  const ParamTable table(config);
  std::vector<float> params(static_cast<size_t>(table.total()));
  std::vector<float> grads(params.size());
  init_parameters(table, InitOptions{1, 0.02f}, params.data());
  std::unique_ptr<Backend> be;
  Tensor pv = view(params.data(), {table.total()});
  Tensor gv = view(grads.data(), {table.total()});
  std::shared_ptr<void> device_params, device_grads;
  if (device == "cuda") {
#ifdef PACKBERT_HAVE_CUDA
    if (cuda_device_count() == 0) {
      std::printf("skipped: %s\n", describe_devices().c_str());  // "no CUDA device (why)"
      return 0;
    }
    CudaBackendOptions co;
    co.validate_indices = false;
    co.validate_pointers = false;
    be = make_cuda_backend(0, co);
    const size_t bytes = static_cast<size_t>(table.total()) * sizeof(float);
    device_params.reset(cuda_alloc(bytes), cuda_free);
    device_grads.reset(cuda_alloc(bytes), cuda_free);
    pv = Tensor(device_params.get(), DType::f32, {table.total()}, Device::cuda);
    gv = Tensor(device_grads.get(), DType::f32, {table.total()}, Device::cuda);
    be->copy(pv, view(params.data(), {table.total()}));
    be->zero(gv);
    if (!check24_given) check24 = false;  // the arena formula does not depend on the device
    if (memory_gib <= 0) {
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        memory_gib = static_cast<double>(total_b) / (1 << 30);
    }
#else
    std::printf("skipped: no CUDA device (this build has no CUDA backend)\n");
    return 0;
#endif
  } else {
    be = make_cpu_backend();
  }
  if (memory_gib <= 0) memory_gib = 139.8;  // an H200
  std::printf(
      "MST / recompute on the %s backend: BERT-Large width (H %lld, I %lld, %lld heads, "
      "V %lld), %lld layers timed, %d warm-up + %d timed step(s) per row, %d threads\n",
      be->name(), static_cast<long long>(config.hidden),
      static_cast<long long>(config.intermediate), static_cast<long long>(config.heads),
      static_cast<long long>(config.vocab_size), static_cast<long long>(layers), warmup, reps,
      cpu::num_threads());
  std::printf(
      "Memory: MiB of the activation arena (measured high-water, by kind); 'L24' = the "
      "24-layer peak from the formula.\nTime: seconds per forward + backward (the "
      "fastest timed step).\n");

  std::mt19937_64 rng(7);
  bool all_ok = true;
  for (int64_t len : lens) {
    const int fifteen = static_cast<int>((len * 15 + 50) / 100);
    const int masked = std::max(1, len <= 512 ? std::min(76, fifteen) : fifteen);
    const std::vector<Sample> samples = {
        make_sample(rng, 12345, static_cast<int>(len), masked, config.real_vocab_size)};
    const Batch batch = make_batch(samples, BatchLayout::unpadded, static_cast<int>(len));
    std::printf("\n== sequence length %lld (one sequence, %d masked tokens) ==\n",
                static_cast<long long>(len), masked);
    std::printf("%4s %-9s | %9s | %8s %8s %8s %8s %8s %8s %8s %6s | %9s | %8s %6s | %9s\n", "M",
                "recompute", "peak MiB", "hidden", "attn", "ln", "mlp", "logits", "heads", "grad",
                "batch", "mlp+mlm", "step s", "xM=1", "L24 MiB");
    std::vector<Row> rows;
    for (int64_t m : chunk_list)
      for (Recompute r : {Recompute::none, Recompute::mlp, Recompute::layer}) {
        if (m > 1 && r == Recompute::none) continue;  // M > 1 is recompute = mlp
        Row row{m, r};
        BertOptions o;
        o.mst_chunks = m;
        o.recompute = r;
        o.mlm_chunk_rows = mlm_chunk_rows;
        Bert bert(config, *be, pv, gv, o);
        for (int w = 0; w < warmup; ++w) {
          bert.forward(batch, masked, 1, 1, 42);
          bert.backward();
        }
        row.seconds = 1e30;  // the fastest of the timed steps (the machine may be shared)
        for (int k = 0; k < reps; ++k) {
          const auto t0 = Clock::now();
          bert.forward(batch, masked, 1, 1, 42);
          bert.backward();
#ifdef PACKBERT_HAVE_CUDA
          cuda_synchronize(*be);
#endif
          row.seconds =
              std::min(row.seconds, std::chrono::duration<double>(Clock::now() - t0).count());
        }
        const ActivationReport rep = bert.activation_report();
        row.bytes = rep.peak_by_kind;
        row.peak = rep.peak_bytes;
        const ActivationBytes want =
            test::predicted_activation_bytes(config, batch.rows, 1, masked, m, r, mlm_chunk_rows);
        row.formula_ok = want == rep.peak_by_kind && test::total_bytes(want) == rep.peak_bytes;
        all_ok = all_ok && row.formula_ok;
        const size_t l24 = test::total_bytes(
            test::predicted_activation_bytes(large24, batch.rows, 1, masked, m, r, mlm_chunk_rows));
        const double base = rows.empty() ? row.seconds : rows.front().seconds;
        std::printf(
            "%4lld %-9s | %9.1f | %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %6.2f | %9.1f "
            "| %8.2f %6.2f | %9.1f%s\n",
            static_cast<long long>(m), recompute_name(r), mib(row.peak),
            mib(kind(row.bytes, ActivationKind::hidden)),
            mib(kind(row.bytes, ActivationKind::attention)),
            mib(kind(row.bytes, ActivationKind::layernorm)),
            mib(kind(row.bytes, ActivationKind::mlp)),
            mib(kind(row.bytes, ActivationKind::mlm_logits)),
            mib(kind(row.bytes, ActivationKind::heads)),
            mib(kind(row.bytes, ActivationKind::grad_scratch)), mib(rep.batch_buffer_bytes),
            mib(test::intermediate_bytes(row.bytes)), row.seconds, row.seconds / base, mib(l24),
            row.formula_ok ? "" : "  FORMULA MISMATCH");
        std::fflush(stdout);
        rows.push_back(row);
      }
    auto find = [&](int64_t m, Recompute r) -> const Row* {
      for (const Row& x : rows)
        if (x.chunks == m && x.recompute == r) return &x;
      return nullptr;
    };
    const Row* m1 = find(1, Recompute::none);
    const Row* m1_mlp = find(1, Recompute::mlp);
    const Row* m8 = find(8, Recompute::mlp);
    const Row* m8_layer = find(8, Recompute::layer);
    if (m1 && m8) {
      const double x = static_cast<double>(test::intermediate_bytes(m1->bytes)) /
                       static_cast<double>(test::intermediate_bytes(m8->bytes));
      std::printf("MLP+MLM intermediate peak at M=8 vs M=1: %.1fx lower (target >= 4x) %s\n", x,
                  x >= 4 ? "[met]" : "[NOT MET]");
      if (m1_mlp)
        std::printf("  same, both recomputing (M=1 recompute=mlp vs M=8): %.1fx lower\n",
                    static_cast<double>(test::intermediate_bytes(m1_mlp->bytes)) /
                        static_cast<double>(test::intermediate_bytes(m8->bytes)));
      std::printf(
          "whole arena at M=8 vs M=1: %.2fx lower (%lld layers); 24 layers (formula): "
          "%.2fx\n",
          static_cast<double>(m1->peak) / static_cast<double>(m8->peak),
          static_cast<long long>(layers),
          static_cast<double>(test::total_bytes(test::predicted_activation_bytes(
              large24, batch.rows, 1, masked, 1, Recompute::none))) /
              static_cast<double>(test::total_bytes(test::predicted_activation_bytes(
                  large24, batch.rows, 1, masked, 8, Recompute::mlp))));
      std::printf("step time M=8 / M=1: %.3f (GPU target <= 1.05; CPU ratio for information)\n",
                  m8->seconds / m1->seconds);
    }
    if (m1 && m8_layer)
      std::printf(
          "M=8 recompute=layer vs M=1 none: arena %.2fx lower (24 layers, formula: "
          "%.2fx), step time %.3fx\n",
          static_cast<double>(m1->peak) / static_cast<double>(m8_layer->peak),
          static_cast<double>(test::total_bytes(test::predicted_activation_bytes(
              large24, batch.rows, 1, masked, 1, Recompute::none))) /
              static_cast<double>(test::total_bytes(test::predicted_activation_bytes(
                  large24, batch.rows, 1, masked, 8, Recompute::layer))),
          m8_layer->seconds / m1->seconds);
  }

  if (check24) {
    // One 24-layer BERT-Large arena at 512 tokens, measured: forward() with gradients on
    // carves the step's whole arena (backward scratch included) and notes its use.
    std::printf("\n== 24-layer BERT-Large at 512 tokens: measured arena vs formula ==\n");
    BertConfig c24 = bert_preset("large");
    const ParamTable t24(c24);
    std::vector<float> p24(static_cast<size_t>(t24.total()));
    std::vector<float> g24(p24.size());
    init_parameters(t24, InitOptions{1, 0.02f}, p24.data());
    const std::vector<Sample> samples = {make_sample(rng, 99, 512, 76, c24.real_vocab_size)};
    const Batch batch = make_batch(samples, BatchLayout::unpadded, 512);
    for (auto [m, r] : {std::pair<int64_t, Recompute>{1, Recompute::none},
                        {8, Recompute::mlp},
                        {8, Recompute::layer}}) {
      BertOptions o;
      o.mst_chunks = m;
      o.recompute = r;
      Bert bert(c24, *be, view(p24.data(), {t24.total()}), view(g24.data(), {t24.total()}), o);
      const auto t0 = Clock::now();
      bert.forward(batch, 76, 1, 1, 42);
      const double fwd = std::chrono::duration<double>(Clock::now() - t0).count();
      const ActivationReport rep = bert.activation_report();
      const ActivationBytes want = test::predicted_activation_bytes(c24, 512, 1, 76, m, r);
      const bool ok = want == rep.peak_by_kind && test::total_bytes(want) == rep.peak_bytes;
      all_ok = all_ok && ok;
      std::printf(
          "M=%lld recompute=%-5s: measured %.1f MiB, formula %.1f MiB %s "
          "(forward %.1f s)\n",
          static_cast<long long>(m), recompute_name(r), mib(rep.peak_bytes),
          mib(test::total_bytes(want)), ok ? "[equal]" : "[MISMATCH]", fwd);
      std::fflush(stdout);
    }
  }
  // The longest BERT-Large sequence (24 layers, batch of one, 15% masked) whose step fits in
  // the device memory: fp32 parameters, gradients and LAMB's two moments (the position table
  // grows with the length: 16 H bytes per position) plus the activation arena of the formula
  // (linear in the length: attention keeps log-sum-exp, not probabilities). Lengths stop at
  // the dropout key's position range (kernels/common/philox.h).
  {
    const ParamTable t24(large24);
    const double fixed =
        4.0 * sizeof(float) *
        static_cast<double>(t24.total() - large24.max_position_embeddings * large24.hidden);
    const double budget = memory_gib * double(1 << 30);
    auto longest = [&](int64_t m, Recompute r) {
      int64_t lo = 0, hi = kDropoutMaxPosition;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        const int64_t masked = std::max<int64_t>(1, (mid * 15 + 50) / 100);
        const double positions = 4.0 * sizeof(float) * static_cast<double>(mid * large24.hidden);
        const double act = static_cast<double>(
            test::total_bytes(test::predicted_activation_bytes(large24, mid, 1, masked, m, r)));
        if (fixed + positions + act <= budget)
          lo = mid;
        else
          hi = mid - 1;
      }
      return lo;
    };
    const int64_t base = longest(1, Recompute::none), best = longest(8, Recompute::layer);
    auto capped = [](int64_t n) {
      return n >= static_cast<int64_t>(kDropoutMaxPosition) ? " (the key's limit)" : "";
    };
    std::printf(
        "\nlongest 24-layer BERT-Large sequence in %.1f GiB (formula; weights, gradients "
        "and moments %.1f GiB without the position table): M=1 none %lld tokens, "
        "M=8 mlp %lld, M=8 layer %lld%s: %.1fx longer with MST + recomputation "
        "(target >= 4x, %s)\n",
        memory_gib, fixed / double(1 << 30), static_cast<long long>(base),
        static_cast<long long>(longest(8, Recompute::mlp)), static_cast<long long>(best),
        capped(best), static_cast<double>(best) / static_cast<double>(std::max<int64_t>(base, 1)),
        device == "cuda" ? "predicted for this GPU, not run at that length" : "predicted, not run");
  }
  std::printf("\nformula vs measured arena: %s\n", all_ok ? "equal in every row" : "MISMATCH");
  return all_ok ? 0 : 1;
}
