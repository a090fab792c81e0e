// Local (sliding-window) attention against global attention on one long sequence: the time of
// attention_forward + attention_backward over one sequence of --len tokens (8192), 12 heads of
// dim 64 (BERT-Base's), with window --window (128, ModernBERT's local layers: keys within 64
// positions) and with window 0 (global), on the CPU backend (fp32) and, when a device exists,
// the CUDA backend (bf16 on tensor cores, and fp32). Prints a table with each time and the ratio
// global / local; asserts nothing about time.
//
// What the ratio of the work can reach: the pairs a local window computes are len (w + 1)
// against len^2 (64x at 8192 / 128), but each backend works in blocks of query rows against
// every key any of them attends: the CPU 128 rows against 128 + w keys (32x), the tensor-core
// kernels 64 rows against the 64-key tiles 64 + w keys touch (at most 4 tiles at w = 128: 32x),
// the fp32 kernels 16 rows against 32-key tiles. The time's ratio may pass the work's where the
// global blocks leave a cache (the CPU's score blocks: 8 MiB at 8192 tokens).
//
//   bench_attention_window [--len 8192] [--window 128] [--heads 12] [--reps 3] [--dropout 0.1]
//                          [--backends cpu,cuda]   (CPU threads: OMP_NUM_THREADS)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/backend.h"
#include "kernels/common/lowp_convert.h"
#include "kernels/device.h"

namespace {

using namespace packbert;

constexpr int64_t kHeadDim = 64;

// Median seconds of f over reps, after one warm-up (scratch grows, pages fault in); sync waits
// for the backend's work.
double median_seconds(Backend& be, const std::function<void()>& f, int reps) {
  f();
  be.synchronize();
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.synchronize();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// A tensor of the backend's memory holding uniform values in [-1, 1] in dtype t (f32 or 16-bit).
BackendBuffer random_buffer(Backend& be, std::mt19937_64& rng, DType t,
                            std::initializer_list<int64_t> dims) {
  BackendBuffer b = be.alloc(t, dims, "bench input");
  const size_t n = static_cast<size_t>(b.tensor().numel());
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> f(n);
  for (float& x : f) x = u(rng);
  if (t == DType::f32) {
    be.upload({{b.tensor(), f.data()}});
  } else {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i)
      h[i] = t == DType::bf16 ? lowp::float_to_bf16(f[i]) : lowp::float_to_f16(f[i]);
    be.upload({{b.tensor(), h.data()}});
  }
  return b;
}

// One sequence of len tokens in the backend's memory.
struct OneSequence {
  BackendBuffer start, len, sample, tseq, tpos;
  SeqLayout view;
};
std::unique_ptr<OneSequence> one_sequence(Backend& be, int32_t len) {
  auto s = std::make_unique<OneSequence>();
  const std::vector<int32_t> start = {0}, lens = {len};
  const std::vector<int64_t> sample = {12345};
  std::vector<int32_t> tseq(static_cast<size_t>(len), 0), tpos(static_cast<size_t>(len));
  for (int32_t i = 0; i < len; ++i) tpos[static_cast<size_t>(i)] = i;
  s->start = be.alloc(DType::i32, {1});
  s->len = be.alloc(DType::i32, {1});
  s->sample = be.alloc(DType::i64, {1});
  s->tseq = be.alloc(DType::i32, {len});
  s->tpos = be.alloc(DType::i32, {len});
  be.upload({{s->start.tensor(), start.data()},
             {s->len.tensor(), lens.data()},
             {s->sample.tensor(), sample.data()},
             {s->tseq.tensor(), tseq.data()},
             {s->tpos.tensor(), tpos.data()}});
  SeqLayout& l = s->view;
  l.rows = len;
  l.num_seqs = 1;
  l.max_len = len;
  l.seq_start = s->start.tensor();
  l.seq_len = s->len.tensor();
  l.sample_id = s->sample.tensor();
  l.token_seq = s->tseq.tensor();
  l.token_pos = s->tpos.tensor();
  return s;
}

struct Row {
  std::string backend, dtype;
  int64_t window;
  double fwd, fwd_bwd;
};

// Forward, and forward + backward, of one sequence at each window.
void time_windows(Backend& be, DType t, int32_t len, int heads, const std::vector<int64_t>& windows,
                  float p, int reps, std::vector<Row>& rows) {
  std::mt19937_64 rng(2024);
  const int64_t hidden = heads * kHeadDim;
  const auto layout = one_sequence(be, len);
  const SeqLayout& l = layout->view;
  const BackendBuffer qkv = random_buffer(be, rng, t, {len, 3 * hidden});
  const BackendBuffer dout = random_buffer(be, rng, t, {len, hidden});
  const BackendBuffer out = be.alloc(t, {len, hidden}), dqkv = be.alloc(t, {len, 3 * hidden});
  const BackendBuffer lse = be.alloc(DType::f32, {len, heads});
  Dropout d;
  d.p = p;
  d.seed = 11;
  d.step = 5;
  d.layer = 3;
  d.site = DropoutSite::attention_probs;
  for (int64_t w : windows) {
    const auto fwd = [&] {
      be.attention_forward(l, qkv.tensor(), heads, w, d, out.tensor(), lse.tensor());
    };
    const auto bwd = [&] {
      be.attention_backward(l, qkv.tensor(), out.tensor(), lse.tensor(), dout.tensor(), heads, w, d,
                            dqkv.tensor());
    };
    const double f = median_seconds(be, fwd, reps);
    const double fb = median_seconds(
        be,
        [&] {
          fwd();
          bwd();
        },
        reps);
    rows.push_back({be.name(), dtype_name(t), w, f, fb});
    std::fprintf(stderr, "  %s %s window %lld: fwd %.4f s, fwd+bwd %.4f s\n", be.name(),
                 dtype_name(t), static_cast<long long>(w), f, fb);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int32_t len = 8192;
  int64_t window = 128;
  int heads = 12, reps = 3;
  float p = 0.1f;
  std::string backends = "cpu,cuda";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--len")) len = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--window")) window = std::max(1LL, std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--heads")) heads = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dropout")) p = static_cast<float>(std::atof(argv[i + 1]));
    if (!std::strcmp(argv[i], "--backends")) backends = argv[i + 1];
  }
  bool cpu_wanted = false, cuda_wanted = false;
  for (const std::string& b : bench::split_commas(backends)) {
    cpu_wanted = cpu_wanted || b == "cpu";
    cuda_wanted = cuda_wanted || b == "cuda";
  }
  const std::vector<int64_t> windows = {window, 0};
  std::vector<Row> rows;
  if (cpu_wanted) {
    auto cpu = make_backend(Device::cpu);
    time_windows(*cpu, DType::f32, len, heads, windows, p, reps, rows);
  }
  if (cuda_wanted && cuda_device_count() > 0) {
    BackendOptions o;
    o.validate = false;  // the host-side layout checks: off for timing
    auto gpu = make_backend(Device::cuda, o);
    time_windows(*gpu, DType::bf16, len, heads, windows, p, reps, rows);
    time_windows(*gpu, DType::f32, len, heads, windows, p, reps, rows);
  } else if (cuda_wanted) {
    std::printf("CUDA backend: skipped, %s\n", describe_devices().c_str());
  }
  std::printf(
      "\nattention, one sequence of %d tokens, %d heads of dim %lld, dropout p = %.2f, median of "
      "%d\n",
      len, heads, static_cast<long long>(kHeadDim), static_cast<double>(p), reps);
  std::printf("%-8s %-6s %8s %10s %12s %14s %16s\n", "backend", "dtype", "window", "fwd ms",
              "fwd+bwd ms", "fwd: global/w", "fwd+bwd: global/w");
  for (const Row& r : rows) {
    const Row* global = &r;
    for (const Row& g : rows)
      if (g.backend == r.backend && g.dtype == r.dtype && g.window == 0) global = &g;
    std::printf("%-8s %-6s %8lld %10.1f %12.1f %14.1f %16.1f\n", r.backend.c_str(), r.dtype.c_str(),
                static_cast<long long>(r.window), r.fwd * 1e3, r.fwd_bwd * 1e3, global->fwd / r.fwd,
                global->fwd_bwd / r.fwd_bwd);
  }
  return 0;
}
