// One training step (forward and backward; the optimizer's update is the same in every row and
// is timed by bench_gpu_step) of a ModernBERT-class preset, its alternating local and global
// layers against the same model with every layer global (model.local_window = 0), at each
// sequence length of --lens: samples all of that length, --tokens real tokens per step
// (8192: eight sequences of 1024, one of 8192), the unpadded layout. On the CPU backend (fp32)
// and, when a device exists, the CUDA backend (bf16). Prints a table with each step's time,
// tokens/s, the model FLOPs rate and the ratio all-global / local; asserts nothing about time.
//
// Model FLOPs: train/model_flops.h's step_flops (docs/performance.md#model-flops): attention
// over the (query, key) pairs each layer computes, windows included.
//
//   bench_modern_step [--preset modernbert-base] [--lens 1024,8192] [--tokens 8192]
//                     [--layers N]   (the preset's first N layers: its local / global pattern
//                                     kept; default all of them)
//                     [--reps 1] [--backends cpu,cuda]   (CPU threads: OMP_NUM_THREADS)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/backend.h"
#include "kernels/device.h"
#include "model/batch.h"
#include "model/bert.h"
#include "model/params.h"
#include "train/batching.h"
#include "train/model_flops.h"

namespace {

using namespace packbert;

struct Row {
  std::string backend, model;
  int64_t len = 0;
  double seconds = 0, flops = 0;
  int64_t tokens = 0;
};

// Seconds of the fastest of reps steps after one warm-up (the arena grows, pages fault in).
Row time_step(Backend& be, DType dtype, const BertConfig& config, const std::string& name,
              int64_t len, int64_t tokens, int reps) {
  const ParamTable table(config);
  const int64_t np = table.total();
  std::vector<float> host(static_cast<size_t>(np));
  init_parameters(table, InitOptions{1, 0.02f}, host.data());
  BackendBuffer params = be.alloc(DType::f32, {np}, "bench parameters");
  BackendBuffer grads = be.alloc(DType::f32, {np}, "bench gradients");
  be.copy(params.tensor(), Tensor(host.data(), DType::f32, {np}, Device::cpu));
  be.zero(grads.tensor());
  std::mt19937_64 rng(7);
  std::vector<Sample> samples;
  const int max_predictions = static_cast<int>(std::max<int64_t>(1, len * 15 / 100));
  for (int64_t n = 0; n < std::max<int64_t>(1, tokens / len); ++n)
    samples.push_back(
        bench::make_sample(rng, n, static_cast<int>(len), max_predictions, config.real_vocab_size));
  const Batch batch = make_batch(samples, BatchLayout::unpadded, static_cast<int>(len));
  BertOptions bo;
  bo.precision = dtype == DType::f32 ? Precision::fp32 : Precision::bf16;
  Bert bert(config, be, params.tensor(), grads.tensor(), bo);
  bert.grow_for(batch.shape());
  uint32_t step_no = 1;
  auto step = [&] {
    bert.forward(batch, batch.num_masked(), batch.num_seqs(), step_no++, 1);
    bert.backward();
    be.synchronize();
  };
  step();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  StepShape shape{{}, batch.num_masked()};
  for (const Sample& x : samples) shape.seq_lens.push_back(x.length());
  Row row{be.device() == Device::cpu ? "cpu" : "cuda",
          name,
          len,
          best,
          step_flops(config, shape).total(),
          batch.num_tokens()};
  std::printf("%-5s %-6s %-22s %6lld %10.1f %10.0f %9.3f\n", row.backend.c_str(), dtype_name(dtype),
              row.model.c_str(), static_cast<long long>(len), row.seconds * 1e3,
              static_cast<double>(row.tokens) / row.seconds, row.flops / row.seconds / 1e12);
  std::fflush(stdout);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "modernbert-base", lens = "1024,8192", backends = "cpu,cuda";
  int64_t tokens = 8192, layers = 0;
  int reps = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--preset"))
      preset = argv[i + 1];
    else if (!std::strcmp(argv[i], "--lens"))
      lens = argv[i + 1];
    else if (!std::strcmp(argv[i], "--tokens"))
      tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--layers"))
      layers = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--backends"))
      backends = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  BertConfig local = bert_preset(preset);
  if (layers > 0) local.layers = std::min(local.layers, layers);
  if (local.local_window <= 0) {
    std::fprintf(stderr, "preset %s has no local layers (model.local_window = 0)\n",
                 preset.c_str());
    return 2;
  }
  BertConfig global = local;
  global.local_window = 0;
  const std::string local_name = "window" + std::to_string(local.local_window) + "/global" +
                                 std::to_string(local.global_every);
  std::printf("%s (%s), %lld layers, %lld tokens per step, forward + backward, best of %d\n\n",
              preset.c_str(), describe(local).c_str(), static_cast<long long>(local.layers),
              static_cast<long long>(tokens), reps);
  std::printf("%-5s %-6s %-22s %6s %10s %10s %9s\n", "back", "dtype", "attention", "len", "step ms",
              "tokens/s", "TFLOP/s");
  std::vector<Row> rows;
  auto run = [&](Backend& be, DType dtype) {
    for (const std::string& s : bench::split_commas(lens)) {
      const int64_t len = std::atoll(s.c_str());
      rows.push_back(time_step(be, dtype, local, local_name, len, tokens, reps));
      rows.push_back(time_step(be, dtype, global, "all-global", len, tokens, reps));
    }
  };
  for (const std::string& b : bench::split_commas(backends)) {
    if (b == "cpu") {
      auto cpu = make_backend(Device::cpu);
      run(*cpu, DType::f32);
    } else if (b == "cuda" && cuda_device_count() > 0) {
      BackendOptions o;
      o.validate = false;  // the host-side layout checks: off for timing
      auto gpu = make_backend(Device::cuda, o);
      run(*gpu, DType::bf16);
    } else if (b == "cuda") {
      std::printf("CUDA backend: skipped, %s\n", describe_devices().c_str());
    }
  }
  std::printf("\nall-global step time / local-and-global step time:\n");
  for (size_t i = 0; i + 1 < rows.size(); i += 2)
    std::printf("  %-5s len %6lld: %.2fx (model FLOPs %.2fx)\n", rows[i].backend.c_str(),
                static_cast<long long>(rows[i].len), rows[i + 1].seconds / rows[i].seconds,
                rows[i + 1].flops / rows[i].flops);
  return 0;
}
