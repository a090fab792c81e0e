// The CUDA backend's bf16 attention (tensor-core FMHA, fmha_mma_*.cu, through the length-bucketed
// grouped launch) on BERT-Large shapes: 16 heads, head dim 64,
//   - fixed length: 32 sequences of 512 (the shape scripts/bench_flash_sdpa.py times with
//     PyTorch's flash SDPA; the row names match, so the two tables can be set side by side);
//   - variable length: sequences drawn from the MLPerf Wikipedia length histogram
//     (tests/data/wikipedia-seqlen-histogram-512.txt) up to the same 16384 tokens, unpadded.
// Forward, and forward + backward. Time: CUDA events, median of --reps after warm-up.
// TFLOP/s counts only real work, FlashAttention's convention: forward 4 d heads sum(len^2)
// (Q K^T and P V over each sequence's own keys, nothing for padding or masked pairs), backward
// 2.5x the forward (5 products instead of 2), so forward + backward is 3.5x.
// Also the fp32 kernels (same launch) for reference. Prints a table; asserts nothing about time.
// Without a device (or without CUDA in the build) it prints "skipped: no CUDA device", exits 0.
//
//   bench_fmha_gpu [--reps 20] [--dropout 0.0] [--histogram path] [--batch 32]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/common/lowp_convert.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/fmha.h"
#include "data/packing/packing.h"

namespace {

using namespace packbert;

constexpr int kHeads = 16, kHeadDim = 64, kMaxLen = 512;
constexpr int64_t kHidden = int64_t{kHeads} * kHeadDim;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_fmha_gpu: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Device buffers freed at exit.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) : p(cuda_alloc(bytes)) {}
  ~Dev() { cuda_free(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};
std::vector<std::unique_ptr<Dev>> g_buffers;

Tensor alloc(DType t, std::initializer_list<int64_t> dims) {
  Tensor x(nullptr, t, dims, Device::cuda);
  g_buffers.push_back(std::make_unique<Dev>(std::max<size_t>(x.bytes(), 16)));
  x.data = g_buffers.back()->p;
  return x;
}

// Random values in [-1, 1] (never 0) in the tensor's dtype: one block uploaded, then tiled.
Tensor random_tensor(std::mt19937_64& rng, DType t, std::initializer_list<int64_t> dims) {
  Tensor x = alloc(t, dims);
  const size_t n = static_cast<size_t>(x.numel()), es = dtype_size(t);
  const size_t block = std::min<size_t>(n, size_t{1} << 20);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<unsigned char> host(block * es);
  for (size_t i = 0; i < block; ++i) {
    float f;
    do f = u(rng);
    while (f == 0.f);
    if (t == DType::f32) {
      std::memcpy(&host[i * es], &f, 4);
    } else {
      const uint16_t h = t == DType::bf16 ? lowp::float_to_bf16(f) : lowp::float_to_f16(f);
      std::memcpy(&host[i * es], &h, 2);
    }
  }
  auto* d = static_cast<unsigned char*>(x.data);
  check(cudaMemcpy(d, host.data(), block * es, cudaMemcpyHostToDevice), "upload");
  for (size_t at = block; at < n; at += block)
    check(cudaMemcpy(d + at * es, d, std::min(block, n - at) * es, cudaMemcpyDeviceToDevice),
          "tile");
  return x;
}

template <typename T>
Tensor upload(const std::vector<T>& v, std::initializer_list<int64_t> dims) {
  Tensor t = alloc(DTypeOf<T>::value, dims);
  if (t.bytes()) check(cudaMemcpy(t.data, v.data(), t.bytes(), cudaMemcpyHostToDevice), "upload");
  return t;
}

// Sequences of these lengths end to end (unpadded), on the device.
SeqLayout make_layout(const std::vector<int32_t>& lens, std::mt19937_64& rng) {
  const int64_t seqs = static_cast<int64_t>(lens.size());
  std::vector<int32_t> start(lens.size());
  std::vector<int64_t> sample(lens.size());
  int64_t rows = 0;
  int32_t max_len = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    start[s] = static_cast<int32_t>(rows);
    sample[s] = static_cast<int64_t>(rng() >> 20);
    rows += lens[s];
    max_len = std::max(max_len, lens[s]);
  }
  std::vector<int32_t> tseq(static_cast<size_t>(rows)), tpos(static_cast<size_t>(rows));
  for (size_t s = 0; s < lens.size(); ++s)
    for (int32_t p = 0; p < lens[s]; ++p) {
      tseq[static_cast<size_t>(start[s] + p)] = static_cast<int32_t>(s);
      tpos[static_cast<size_t>(start[s] + p)] = p;
    }
  SeqLayout l;
  l.rows = rows;
  l.num_seqs = static_cast<int32_t>(seqs);
  l.max_len = max_len;
  l.seq_start = upload(start, {seqs});
  l.seq_len = upload(lens, {seqs});
  l.sample_id = upload(sample, {seqs});
  l.token_seq = upload(tseq, {rows});
  l.token_pos = upload(tpos, {rows});
  return l;
}

// Median milliseconds of f over reps, after 2 warm-ups. The backend's stream is blocking and
// joins its auxiliary streams before each op returns, so events on the legacy stream bracket
// all of an op's work.
double median_ms(const std::function<void()>& f, int reps) {
  f();
  f();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> ms;
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(a, nullptr), "record");
    f();
    check(cudaEventRecord(b, nullptr), "record");
    check(cudaEventSynchronize(b), "sync");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string name;
  double ms, flops;
};

// Forward and forward + backward of one layout in one dtype.
void time_case(Backend& be, std::mt19937_64& rng, const std::string& name, DType dt,
               const std::vector<int32_t>& lens, float p, int reps, std::vector<Row>& rows) {
  const SeqLayout l = make_layout(lens, rng);
  const int64_t n = l.rows;
  const Tensor qkv = random_tensor(rng, dt, {n, 3 * kHidden});
  const Tensor dout = random_tensor(rng, dt, {n, kHidden});
  const Tensor out = alloc(dt, {n, kHidden}), dqkv = alloc(dt, {n, 3 * kHidden});
  const Tensor lse = alloc(DType::f32, {n, kHeads});
  Dropout d;
  d.p = p;
  d.seed = 11;
  d.step = 5;
  d.layer = 3;
  d.site = DropoutSite::attention_probs;
  double sq = 0;
  for (int32_t len : lens) sq += static_cast<double>(len) * len;
  const double fwd_flops = 4.0 * kHeadDim * kHeads * sq;
  const auto fwd = [&] { be.attention_forward(l, qkv, kHeads, 0, d, out, lse); };
  const auto bwd = [&] { be.attention_backward(l, qkv, out, lse, dout, kHeads, 0, d, dqkv); };
  rows.push_back({"fwd " + name, median_ms(fwd, reps), fwd_flops});
  rows.push_back({"fwd+bwd " + name,
                  median_ms(
                      [&] {
                        fwd();
                        bwd();
                      },
                      reps),
                  3.5 * fwd_flops});
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, batch = 32;
  float p = 0.f;
  std::string hist_path =
      std::string(PACKBERT_REPO_DATA) + "/../tests/data/wikipedia-seqlen-histogram-512.txt";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--batch")) batch = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dropout")) p = static_cast<float>(std::atof(argv[i + 1]));
    if (!std::strcmp(argv[i], "--histogram")) hist_path = argv[i + 1];
  }
  if (cuda_device_count() == 0) {
    std::printf("skipped: %s\n", describe_devices().c_str());  // "no CUDA device (why)"
    return 0;
  }
  std::printf("%s", describe_devices().c_str());
  CudaBackendOptions opt;
  opt.validate_indices = false;  // the full host-side layout check: off for timing
  opt.validate_pointers = false;
  auto be = make_cuda_backend(0, opt);
  std::mt19937_64 rng(2024);

  // Variable lengths: the histogram's distribution until the fixed case's token count.
  const LengthHistogram hist = load_histogram(hist_path);
  std::discrete_distribution<int> pick(hist.counts.begin(), hist.counts.end());
  std::vector<int32_t> var;
  int64_t tokens = 0;
  while (true) {
    const int32_t len = std::min(pick(rng) + 1, kMaxLen);
    if (tokens + len > int64_t{batch} * kMaxLen) break;
    var.push_back(len);
    tokens += len;
  }
  const std::vector<int32_t> fixed(static_cast<size_t>(batch), kMaxLen);
  const std::string shape = "B" + std::to_string(batch) + " H16 d64";
  const std::string fixed_name = "L512 " + shape;
  const std::string var_name =
      "wiki " + std::to_string(var.size()) + " seqs " + std::to_string(tokens) + " tok H16 d64";

  std::vector<Row> rows;
  time_case(*be, rng, fixed_name, DType::bf16, fixed, p, reps, rows);
  time_case(*be, rng, var_name, DType::bf16, var, p, reps, rows);
  std::vector<Row> f32_rows;
  time_case(*be, rng, fixed_name, DType::f32, fixed, p, std::max(3, reps / 4), f32_rows);
  time_case(*be, rng, var_name, DType::f32, var, p, std::max(3, reps / 4), f32_rows);

  std::printf(
      "\nattention, dropout p = %.2f, median of %d (TFLOP/s: real work only, fwd = "
      "4 d heads sum len^2, fwd+bwd = 3.5 x fwd)\n",
      static_cast<double>(p), reps);
  std::printf("%-8s %-48s %10s %10s\n", "dtype", "case", "ms", "TFLOP/s");
  for (const Row& r : rows)
    std::printf("%-8s %-48s %10.3f %10.1f\n", "bf16", r.name.c_str(), r.ms,
                r.flops / (r.ms * 1e-3) / 1e12);
  for (const Row& r : f32_rows)
    std::printf("%-8s %-48s %10.3f %10.1f\n", "fp32", r.name.c_str(), r.ms,
                r.flops / (r.ms * 1e-3) / 1e12);
  std::printf(
      "\nbf16 / fp16 kernels, per block (compiled registers and blocks per SM: "
      "scripts/kernel_report.py)\n%-8s %8s %12s %16s\n",
      "kernel", "threads", "smem bytes", "live frag regs");
  for (const cuda::FmhaKernelBudget& b : cuda::fmha_kernel_budget())
    std::printf("%-8s %8d %12d %16d\n", b.kernel, b.threads, b.smem_bytes, b.live_regs);
  return 0;
}

#else  // no CUDA in this build

int main() {
  std::printf("skipped: no CUDA device (%s)\n", packbert::describe_devices().c_str());
  return 0;
}

#endif
