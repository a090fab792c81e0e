// A whole BERT training step on one GPU -- forward, backward, the global gradient norm and the
// LAMB update -- on sequence lengths drawn from the MLPerf Wikipedia histogram: samples/s,
// real tokens/s, the step split by kind of op (op_timer.h), the model FLOPs utilisation counting
// only real tokens (beside a bf16/fp16/fp32 GEMM peak measured in the same run through the same
// backend, and the nominal dense bf16 peak of an H200), and the LAMB step over all parameters
// alone. Prints tables; asserts nothing about time. Without a device (or a CUDA build) it prints
// "skipped: no CUDA device" and exits 0.
//
//   bench_gpu_step [--model large] [--max-len 512] [--precision bf16|fp16|fp32|fp8]
//                  [--gelu erf|tanh]      (model.hidden_act: tanh, the MLPerf model, runs in
//                                          cuBLASLt's GELU epilogues)
//                  [--batch N]            (samples per step; 0 = the most that fit, from the
//                                          arena formula and the free memory, at most 4096)
//                  [--memory-fraction 0.85] (share of the free memory the arena may take)
//                  [--steps 5] [--warmup 2] [--layouts unpadded,padded]
//                  [--graphs off,segmented] (train.cuda_graphs, off | segmented | full: each
//                                          layout runs with each; a graphed run warms up 4
//                                          steps at least, so that both batch buffers' graphs
//                                          are recorded, and has no split: its ops are not
//                                          timed one by one)
//                  [--lengths-out FILE]   (one line "length masked" per sample, for
//                                          scripts/bench_hf_gpu.py: the same batch for
//                                          Hugging Face, padded to max_len)
//                  [--histogram path]
//
// One GPU, so no communication is exposed here (the NCCL all-reduce runs only with several
// ranks). The split comes from one extra step with a synchronisation around each op: it removes
// the overlap between ops (the attention's streams stay inside the op), so its total is a
// little above the free-running step printed beside it.
//
// FLOPs of a step (forward; the backward is twice that, so x3 in all): the encoder's GEMMs
// 2 tokens (4 H^2 + 2 H I) per layer, attention 4 H sum(len^2) per layer (QK^T and PV over the
// real lengths only), the MLM head 2 masked (H^2 + H V), the pooler and NSP classifier
// 2 samples (H^2 + 2 H). Padding counts for nothing: the padded layout does the same useful
// work more slowly.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "bench_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/batch.h"
#include "model/bert.h"
#include "model/params.h"
#include "op_timer.h"
#include "test_util.h"
#include "train/batching.h"

namespace {

using namespace packbert;
using Clock = std::chrono::steady_clock;

constexpr double kH200DenseBf16 = 989.4e12;  // nominal dense bf16/fp16 tensor-core peak (SXM)

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A device buffer freed at scope end.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) : p(cuda_alloc(std::max<size_t>(bytes, 4))) {}
  ~Dev() { cuda_free(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

Tensor dev_tensor(Dev& d, DType t, std::initializer_list<int64_t> dims) {
  return Tensor(d.p, t, dims, Device::cuda);
}

struct StepFlops {
  double total = 0, gemm = 0, attention = 0, heads = 0;
};

StepFlops step_flops(const BertConfig& c, const std::vector<Sample>& samples) {
  double tokens = 0, sq = 0, masked = 0;
  for (const Sample& s : samples) {
    tokens += s.length();
    sq += static_cast<double>(s.length()) * s.length();
    masked += s.num_masked();
  }
  const double h = static_cast<double>(c.hidden), i = static_cast<double>(c.intermediate);
  const double v = static_cast<double>(c.vocab_size), layers = static_cast<double>(c.layers);
  const double n = static_cast<double>(samples.size());
  StepFlops f;
  f.gemm = 3 * 2 * tokens * (4 * h * h + 2 * h * i) * layers;
  f.attention = 3 * 4 * h * sq * layers;
  f.heads = 3 * (2 * masked * (h * h + h * v) + 2 * n * (h * h + 2 * h));
  f.total = f.gemm + f.attention + f.heads;
  return f;
}

// The GEMM peak of this precision through the backend: out[8192, 4096] = x[8192, 4096] w^T.
double measure_gemm_peak(Backend& be, DType t) {
  const int64_t n = 8192, k = 4096, m = 4096;
  Dev x(static_cast<size_t>(n * k) * dtype_size(t)), w(static_cast<size_t>(m * k) * dtype_size(t)),
      out(static_cast<size_t>(n * m) * dtype_size(t));
  const Tensor xt = dev_tensor(x, t, {n, k}), wt = dev_tensor(w, t, {m, k}),
               ot = dev_tensor(out, t, {n, m});
  be.zero(xt);
  be.zero(wt);
  for (int i = 0; i < 3; ++i) be.linear_forward(xt, wt, Tensor(), Epilogue::none, ot, Tensor());
  cuda_synchronize(be);
  const int reps = 20;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) be.linear_forward(xt, wt, Tensor(), Epilogue::none, ot, Tensor());
  cuda_synchronize(be);
  return 2.0 * static_cast<double>(n * k * m) * reps / seconds_since(t0);
}

int run(int argc, char** argv) {
  std::string model = "large", precision_name_arg = "bf16", layouts_arg = "unpadded,padded";
  std::string graphs_arg = "off,segmented";
  std::string gelu = "erf";
  std::string lengths_out, hist_path = bench::default_histogram_path(PACKBERT_REPO_DATA);
  int max_len = 512, steps = 5, warmup = 2;
  int64_t batch_given = 0;
  double memory_fraction = 0.85;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    if (!std::strcmp(argv[i], "--max-len")) max_len = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--precision")) precision_name_arg = argv[i + 1];
    if (!std::strcmp(argv[i], "--batch")) batch_given = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--memory-fraction")) memory_fraction = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--warmup")) warmup = std::max(0, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--layouts")) layouts_arg = argv[i + 1];
    if (!std::strcmp(argv[i], "--graphs")) graphs_arg = argv[i + 1];
    if (!std::strcmp(argv[i], "--lengths-out")) lengths_out = argv[i + 1];
    if (!std::strcmp(argv[i], "--histogram")) hist_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--gelu")) gelu = argv[i + 1];
  }
  PB_REQUIRE(gelu == "erf" || gelu == "tanh", "--gelu {}: expected erf or tanh", gelu);
  const Precision precision = parse_precision(precision_name_arg);
  const DType act = precision_dtype(precision);

  BertConfig config = bert_preset(model);
  config.max_position_embeddings = std::max<int64_t>(config.max_position_embeddings, max_len);
  config.hidden_act = gelu == "tanh" ? Gelu::tanh : Gelu::erf;
  CudaBackendOptions co;
  co.validate_indices = false;  // the step loop as the trainer runs it
  co.validate_pointers = false;
  auto cuda_be = make_cuda_backend(0, co);
  bench::TimedBackend timed(*cuda_be, [&] { cuda_synchronize(*cuda_be); });
  timed.set_enabled(false);

  // Parameters, gradients and LAMB's state: fp32 on the device.
  const ParamTable table(config);
  const int64_t np = table.total();
  std::vector<float> host_params(static_cast<size_t>(np));
  init_parameters(table, InitOptions{1, 0.02f}, host_params.data());
  Dev params(np * 4), grads(np * 4), lamb_m(np * 4), lamb_v(np * 4);
  const Tensor pv = dev_tensor(params, DType::f32, {np}), gv = dev_tensor(grads, DType::f32, {np});
  cuda_be->copy(pv, Tensor(host_params.data(), DType::f32, {np}, Device::cpu));
  cuda_be->zero(gv);
  cuda_be->zero(dev_tensor(lamb_m, DType::f32, {np}));
  cuda_be->zero(dev_tensor(lamb_v, DType::f32, {np}));
  std::vector<LambTensor> rows;
  for (const ParamTensor& t : table.tensors())
    rows.push_back({t.offset, t.size, t.no_decay ? 0 : 1});
  std::sort(rows.begin(), rows.end(),
            [](const LambTensor& a, const LambTensor& b) { return a.offset < b.offset; });
  const auto nt = static_cast<int64_t>(rows.size());
  Dev norms(2 * nt * 4), grad_norm(4);

  // The batch: as many samples as fit (the unpadded arena from the formula), or --batch.
  const LengthHistogram hist = load_histogram(hist_path);
  std::mt19937_64 rng(7);
  const std::vector<Sample> pool = bench::draw_samples(
      rng, hist, max_len, 0, batch_given > 0 ? batch_given : 4096, config.real_vocab_size);
  BertOptions bo;
  bo.precision = precision;
  Bert sizing(config, *cuda_be, pv, gv, bo);
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  auto fits = [&](int64_t n) {
    std::vector<Sample> s(pool.begin(), pool.begin() + n);
    return static_cast<double>(
               sizing.activation_bytes(make_batch(s, BatchLayout::unpadded, max_len).shape())) <=
           memory_fraction * static_cast<double>(free_b);
  };
  int64_t n = batch_given > 0 ? batch_given : 1;
  if (batch_given <= 0) {
    int64_t lo = 1, hi = static_cast<int64_t>(pool.size());
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (fits(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    n = lo;
  }
  const std::vector<Sample> samples(pool.begin(), pool.begin() + n);
  if (!lengths_out.empty()) {
    std::ofstream f(lengths_out);
    for (const Sample& s : samples) f << s.length() << ' ' << s.num_masked() << '\n';
  }
  const StepFlops flops = step_flops(config, samples);
  int64_t tokens = 0, masked = 0;
  for (const Sample& s : samples) tokens += s.length(), masked += s.num_masked();

  const double gemm_peak = measure_gemm_peak(*cuda_be, act);
  std::printf("BERT-%s (%s), %lld parameters, %s, GPU: %s\n", model.c_str(),
              describe(config).c_str(), static_cast<long long>(np), precision_name(precision),
              describe_devices().c_str());
  std::printf(
      "batch: %lld samples, %lld real tokens (%.1f%% of %lld padded), %lld masked; "
      "lengths: %s\n",
      static_cast<long long>(n), static_cast<long long>(tokens),
      100.0 * static_cast<double>(tokens) / static_cast<double>(n * max_len),
      static_cast<long long>(n * max_len), static_cast<long long>(masked), hist_path.c_str());
  std::printf(
      "model FLOPs per step (real tokens): %.2f TFLOP (GEMMs %.2f, attention %.2f, heads "
      "%.2f); %s GEMM peak measured here (cuBLASLt 8192x4096x4096): %.0f TFLOP/s\n\n",
      flops.total / 1e12, flops.gemm / 1e12, flops.attention / 1e12, flops.heads / 1e12,
      dtype_name(act), gemm_peak / 1e12);

  // LAMB alone: global norm + update over every parameter.
  LambConfig lc;
  lc.lr = 1e-6f;
  auto lamb = [&](Backend& be, const Tensor& lowp) {
    be.l2_norm(gv, dev_tensor(grad_norm, DType::f32, {1}));
    ++lc.step;
    be.lamb_step(lamb_table(rows.data(), nt), lc, dev_tensor(grad_norm, DType::f32, {1}), pv, gv,
                 dev_tensor(lamb_m, DType::f32, {np}), dev_tensor(lamb_v, DType::f32, {np}),
                 dev_tensor(norms, DType::f32, {2 * nt}), lowp);
    be.zero(gv);
  };

  std::printf("%-9s %-9s %8s %9s %10s %12s %9s %9s %8s %10s\n", "layout", "graphs", "rows",
              "step ms", "samples/s", "tokens/s", "TFLOP/s", "% peak", "% H200", "arena GiB");
  struct Split {
    std::string layout;
    bench::TimedBackend::Seconds s;
    double serial = 0;
  };
  std::vector<Split> splits;
  double lamb_ms = 0;
  for (const std::string& lname : bench::split_commas(layouts_arg))
    for (const std::string& gname : bench::split_commas(graphs_arg)) {
      const BatchLayout layout = parse_batch_layout(lname);
      const CudaGraphs graphs = parse_cuda_graphs(gname);
      const Batch batch =
          make_batch(samples, layout, max_len, packbert::test::pack_samples(samples, max_len));
      // Graphs on the backend itself: the timing wrapper records none.
      Backend& be = graphs == CudaGraphs::off ? static_cast<Backend&>(timed) : *cuda_be;
      BertOptions gbo = bo;
      gbo.cuda_graphs = graphs;
      std::unique_ptr<Bert> bert;
      try {
        bert = std::make_unique<Bert>(config, be, pv, gv, gbo);
        bert->grow_for(batch.shape());
      } catch (const std::exception& e) {
        std::printf("%-9s %-9s %8lld  does not fit: %s\n", lname.c_str(), gname.c_str(),
                    static_cast<long long>(batch.rows), e.what());
        continue;
      }
      uint32_t step_no = 1;
      auto step = [&] {
        bert->forward(batch, masked, n, step_no++, 1);
        bert->backward();
        lamb(be, bert->weights().lowp());
        if (bert->fp8()) bert->fp8_end_step({});  // fp8: scales updated, weights cast again
      };
      const int warm = graphs == CudaGraphs::off ? warmup : std::max(warmup, 4);
      for (int w = 0; w < warm; ++w) step();
      cuda_synchronize(*cuda_be);
      double best = 1e30;
      for (int k = 0; k < steps; ++k) {
        const auto t0 = Clock::now();
        step();
        cuda_synchronize(*cuda_be);
        best = std::min(best, seconds_since(t0));
      }
      const double rate = flops.total / best;
      std::printf("%-9s %-9s %8lld %9.1f %10.0f %12.0f %9.1f %8.1f%% %7.1f%% %10.2f\n",
                  lname.c_str(), gname.c_str(), static_cast<long long>(batch.rows), best * 1e3,
                  static_cast<double>(n) / best, static_cast<double>(tokens) / best, rate / 1e12,
                  100.0 * rate / gemm_peak, 100.0 * rate / kH200DenseBf16,
                  static_cast<double>(bert->activation_report().peak_bytes) / (1 << 30));
      std::fflush(stdout);
      if (graphs != CudaGraphs::off) continue;  // the split and LAMB alone: op by op only
      timed.set_enabled(true);
      timed.reset();
      const auto t0 = Clock::now();
      step();
      cuda_synchronize(*cuda_be);
      splits.push_back({lname, timed.seconds(), seconds_since(t0)});
      timed.set_enabled(false);
      if (lamb_ms == 0) {
        const int reps = 10;
        cuda_synchronize(*cuda_be);
        const auto l0 = Clock::now();
        for (int k = 0; k < reps; ++k) lamb(*cuda_be, bert->weights().lowp());
        cuda_synchronize(*cuda_be);
        lamb_ms = seconds_since(l0) * 1e3 / reps;
      }
    }

  std::printf("\nstep split, ms (one step with a synchronisation around every op):\n%-9s",
              "layout");
  for (size_t k = 0; k < static_cast<size_t>(bench::OpKind::count); ++k)
    std::printf(" %17s", bench::op_kind_name(static_cast<bench::OpKind>(k)));
  std::printf(" %10s %12s\n", "other", "comm exposed");
  for (const Split& sp : splits) {
    std::printf("%-9s", sp.layout.c_str());
    double sum = 0;
    for (double s : sp.s) {
      std::printf(" %17.2f", s * 1e3);
      sum += s;
    }
    std::printf(" %10.2f %12s\n", (sp.serial - sum) * 1e3, "0 (1 GPU)");
  }
  std::printf("\nLAMB step over all %lld parameters (norm + update%s): %.2f ms (target <= 3 ms)\n",
              static_cast<long long>(np),
              precision == Precision::fp32 ? "" : " + low-precision copy", lamb_ms);
  return 0;
}

}  // namespace
#endif

int main(int argc, char** argv) {
#ifdef PACKBERT_HAVE_CUDA
  if (packbert::cuda_device_count() == 0) {
    std::printf("skipped: %s\n", packbert::describe_devices().c_str());  // "no CUDA device (why)"
    return 0;
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_step: %s\n", e.what());
    return 1;
  }
#else
  (void)argc;
  (void)argv;
  std::printf("skipped: no CUDA device (this build has no CUDA backend)\n");
  return 0;
#endif
}
