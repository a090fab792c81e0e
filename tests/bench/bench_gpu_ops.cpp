// CUDA backend (fp32 step), every op on BERT-Large shapes (hidden 1024, 16 heads, FFN 4096,
// sequences of 512 end to end, dropout 0.1): time per op with CUDA events (median of --reps
// after warm-up), TFLOP/s or GB/s beside this GPU's peaks measured in the same run (a large
// fp32 cuBLASLt GEMM through the backend; a device-to-device copy, bytes read + written). Prints
// a table; asserts nothing about time. Without a device (or without CUDA in the build) it
// prints "skipped: no CUDA device" and exits 0.
//
//   bench_gpu_ops [--tokens 4096,16384] [--reps 10]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace {

using namespace packbert;

constexpr int64_t kHidden = 1024, kHeads = 16, kFfn = 4096, kVocab = 30528, kMaxPos = 512;
constexpr int kSeqLen = 512;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_gpu_ops: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// A device buffer freed at scope end.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) : p(cuda_alloc(bytes)) {}
  ~Dev() { cuda_free(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

std::vector<std::unique_ptr<Dev>> g_buffers;
std::vector<float> g_random_block;

// Random floats in [-scale, scale] (never zero): one random block uploaded, then tiled by
// device copies (fast for gigabytes; the data is random enough for timing).
Tensor random_f32(std::initializer_list<int64_t> dims, float scale = 1.f, bool positive = false) {
  Tensor t(nullptr, DType::f32, dims, Device::cuda);
  g_buffers.push_back(std::make_unique<Dev>(std::max<size_t>(t.bytes(), 4)));
  t.data = g_buffers.back()->p;
  const size_t n = static_cast<size_t>(t.numel()), block = g_random_block.size();
  auto* d = static_cast<float*>(t.data);
  std::vector<float> scaled(std::min(n, block));
  for (size_t i = 0; i < scaled.size(); ++i)
    scaled[i] = (positive ? std::abs(g_random_block[i]) : g_random_block[i]) * scale;
  check(cudaMemcpy(d, scaled.data(), scaled.size() * 4, cudaMemcpyHostToDevice), "upload");
  for (size_t at = scaled.size(); at < n; at += block)
    check(cudaMemcpy(d + at, d, std::min(block, n - at) * 4, cudaMemcpyDeviceToDevice), "tile");
  return t;
}

Tensor empty_f32(std::initializer_list<int64_t> dims) { return random_f32(dims); }

// A device tensor of any dtype with every byte `byte` (0x38: E4M3's 1.0; 0x3F: bf16's 0.75).
Tensor filled(DType dtype, std::initializer_list<int64_t> dims, int byte) {
  Tensor t(nullptr, dtype, dims, Device::cuda);
  g_buffers.push_back(std::make_unique<Dev>(std::max<size_t>(t.bytes(), 16)));
  t.data = g_buffers.back()->p;
  check(cudaMemset(t.data, byte, t.bytes()), "memset");
  return t;
}

template <typename T>
Tensor upload(const std::vector<T>& v, std::initializer_list<int64_t> dims) {
  Tensor t(nullptr, DTypeOf<T>::value, dims, Device::cuda);
  g_buffers.push_back(std::make_unique<Dev>(std::max<size_t>(t.bytes(), 8)));
  t.data = g_buffers.back()->p;
  check(cudaMemcpy(t.data, v.data(), t.bytes(), cudaMemcpyHostToDevice), "upload");
  return t;
}

// Median milliseconds of f over reps, after 2 warm-ups (scratch grows, plans are cached).
double median_ms(const std::function<void()>& f, int reps, cudaStream_t) {
  f();
  f();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> ms;
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int r = 0; r < reps; ++r) {
    // The backend's stream is blocking: events on the legacy stream order with it.
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
  std::string op, shape;
  double ms, flops, bytes;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> token_counts = {4096, 16384};
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--tokens")) {
      token_counts.clear();
      for (const char* p = argv[i + 1]; *p;) {
        token_counts.push_back(std::atoll(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("skipped: %s\n", describe_devices().c_str());  // "no CUDA device (why)"
    return 0;
  }
  std::printf("%s", describe_devices().c_str());
  CudaBackendOptions opt;
  opt.validate_indices = false;  // the host-side index checks synchronise: off for timing
  opt.validate_pointers = false;
  auto be = make_cuda_backend(0, opt);
  std::mt19937_64 rng(12345);
  {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    g_random_block.resize(size_t{1} << 22);
    for (auto& x : g_random_block) do
        x = u(rng);
      while (x == 0.f);
  }
  std::vector<Row> rows;

  // ---- peaks -------------------------------------------------------------------------------
  double peak_flops = 0, peak_bw = 0;
  {
    const int64_t n = 8192;
    const Tensor a = random_f32({n, n}), w = random_f32({n, n}), c = empty_f32({n, n});
    const double ms =
        median_ms([&] { be->linear_forward(a, w, Tensor(), Epilogue::none, c, Tensor()); },
                  std::max(3, reps / 2), nullptr);
    peak_flops = 2.0 * n * n * n / (ms * 1e-3);
    rows.push_back({"peak: fp32 GEMM (cuBLASLt)", "8192^3", ms, 2.0 * n * n * n, 0});
    const size_t bytes = size_t{1} << 30;
    Dev src(bytes), dst(bytes);
    check(cudaMemset(src.p, 1, bytes), "memset");
    const double cms = median_ms(
        [&] {
          check(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, nullptr), "copy");
        },
        reps, nullptr);
    peak_bw = 2.0 * bytes / (cms * 1e-3);
    rows.push_back({"peak: D2D copy (r+w)", "1 GiB", cms, 0, 2.0 * bytes});
  }

  // ---- FP8 against bf16 GEMMs (train.precision = "fp8"): the same products, BERT-Large's
  // shapes below; the FP8 ones as the model runs them (E4M3 x E4M3 forward with fast
  // accumulation, E5M2 x E4M3 into fp32 for the weight gradient).
  const std::string no_fp8 = be->fp8_unsupported();
  if (!no_fp8.empty()) std::printf("fp8 rows skipped: %s\n", no_fp8.c_str());
  const Tensor unit_scale = upload(std::vector<float>{1.f, 1.f}, {2});
  auto fp8_rows = [&](const std::string& what, const std::string& shape, int64_t n, int64_t k,
                      int64_t m) {
    const Tensor xb = filled(DType::bf16, {n, k}, 0x3F), wb = filled(DType::bf16, {m, k}, 0x3F);
    const Tensor ob = filled(DType::bf16, {n, m}, 0);
    rows.push_back(
        {"GEMM bf16 " + what, shape,
         median_ms([&] { be->linear_forward(xb, wb, Tensor(), Epilogue::none, ob, Tensor()); },
                   reps, nullptr),
         2.0 * n * k * m, 0});
    if (!no_fp8.empty()) return;
    const Tensor x8 = filled(DType::e4m3, {n, k}, 0x38), w8 = filled(DType::e4m3, {m, k}, 0x38);
    Fp8GemmOptions fast;
    fast.fast_accum = true;
    rows.push_back(
        {"GEMM fp8 e4m3 fast-accum " + what, shape,
         median_ms([&] { be->fp8_gemm(x8, unit_scale, w8, unit_scale, ob, fast); }, reps, nullptr),
         2.0 * n * k * m, 0});
    const Tensor g8 = filled(DType::e5m2, {n, k}, 0x3C), of = filled(DType::f32, {n, m}, 0);
    Fp8GemmOptions acc;
    acc.accumulate = true;
    rows.push_back(
        {"GEMM fp8 e5m2xe4m3 fp32+= " + what, shape,
         median_ms([&] { be->fp8_gemm(g8, unit_scale, w8, unit_scale, of, acc); }, reps, nullptr),
         2.0 * n * k * m, 0});
  };
  fp8_rows("peak", "8192^3", 8192, 8192, 8192);
  for (const int64_t want_tokens : token_counts) {
    const int64_t t = std::max<int64_t>(1, want_tokens / kSeqLen) * kSeqLen;
    const std::string shape = std::to_string(t) + " tok";
    fp8_rows("qkv", shape, t, kHidden, 3 * kHidden);
    fp8_rows("ffn1", shape, t, kHidden, kFfn);
    fp8_rows("ffn2", shape, t, kFfn, kHidden);
  }

  for (const int64_t want_tokens : token_counts) {
    const int64_t seqs = std::max<int64_t>(1, want_tokens / kSeqLen), t = seqs * kSeqLen;
    const std::string shape = std::to_string(t) + " tok";
    // Layout: sequences of 512 end to end.
    std::vector<int32_t> start(seqs), len(seqs, kSeqLen), tseq(t), tpos(t);
    std::vector<int64_t> sample(seqs);
    for (int64_t s = 0; s < seqs; ++s) {
      start[s] = static_cast<int32_t>(s * kSeqLen);
      sample[s] = static_cast<int64_t>(rng() >> 20);
      for (int p = 0; p < kSeqLen; ++p)
        tseq[s * kSeqLen + p] = static_cast<int32_t>(s), tpos[s * kSeqLen + p] = p;
    }
    SeqLayout l;
    l.rows = t;
    l.num_seqs = static_cast<int32_t>(seqs);
    l.max_len = kSeqLen;
    l.seq_start = upload(start, {seqs});
    l.seq_len = upload(len, {seqs});
    l.sample_id = upload(sample, {seqs});
    l.token_seq = upload(tseq, {t});
    l.token_pos = upload(tpos, {t});
    Dropout drop;
    drop.p = 0.1f;
    drop.seed = 7;
    drop.step = 3;
    drop.site = DropoutSite::ffn_output;
    Dropout attn_drop = drop;
    attn_drop.site = DropoutSite::attention_probs;
    const int64_t h = kHidden;
    const double tf = static_cast<double>(t);

    // Linear layers.
    const Tensor x = random_f32({t, h}), wqkv = random_f32({3 * h, h}, 0.03f),
                 bqkv = random_f32({3 * h});
    const Tensor qkv = empty_f32({t, 3 * h});
    rows.push_back(
        {"linear_forward qkv +bias", shape,
         median_ms([&] { be->linear_forward(x, wqkv, bqkv, Epilogue::bias, qkv, Tensor()); }, reps,
                   nullptr),
         2 * tf * h * 3 * h, 0});
    const Tensor w1 = random_f32({kFfn, h}, 0.03f), b1 = random_f32({kFfn}),
                 f = empty_f32({t, kFfn}), pre = empty_f32({t, kFfn});
    rows.push_back({"linear_forward ffn1 +bias_gelu", shape,
                    median_ms([&] { be->linear_forward(x, w1, b1, Epilogue::bias_gelu, f, pre); },
                              reps, nullptr),
                    2 * tf * h * kFfn, 0});
    const Tensor w2 = random_f32({h, kFfn}, 0.03f), o = empty_f32({t, h});
    rows.push_back(
        {"linear_forward ffn2", shape,
         median_ms([&] { be->linear_forward(f, w2, Tensor(), Epilogue::none, o, Tensor()); }, reps,
                   nullptr),
         2 * tf * h * kFfn, 0});
    const Tensor dout = random_f32({t, h}), dfx = empty_f32({t, kFfn}), dw2 = random_f32({h, kFfn}),
                 db2 = random_f32({h});
    LinearBackwardOptions ffn2_opt;
    ffn2_opt.x_gelu_pre = pre;
    rows.push_back({"linear_backward ffn2 dx(dgelu) dw db", shape,
                    median_ms([&] { be->linear_backward(f, w2, dout, dfx, dw2, db2, ffn2_opt); },
                              reps, nullptr),
                    4 * tf * h * kFfn, 0});
    const Tensor dx1 = random_f32({t, h}), dw1 = random_f32({kFfn, h}), db1 = random_f32({kFfn});
    LinearBackwardOptions ffn1_opt;
    ffn1_opt.dx_accumulate = true;
    rows.push_back({"linear_backward ffn1 dx+= dw db", shape,
                    median_ms([&] { be->linear_backward(x, w1, dfx, dx1, dw1, db1, ffn1_opt); },
                              reps, nullptr),
                    4 * tf * h * kFfn, 0});

    // Attention.
    const Tensor ctx = empty_f32({t, h}), lse = empty_f32({t, kHeads}),
                 dqkv = empty_f32({t, 3 * h});
    const double attn_flops = 4.0 * tf * kSeqLen * h;  // QK^T and PV
    rows.push_back(
        {"attention_forward p=0.1", shape,
         median_ms([&] { be->attention_forward(l, qkv, kHeads, 0, attn_drop, ctx, lse); }, reps,
                   nullptr),
         attn_flops, 0});
    rows.push_back(
        {"attention_backward p=0.1", shape,
         median_ms(
             [&] { be->attention_backward(l, qkv, ctx, lse, dout, kHeads, 0, attn_drop, dqkv); },
             reps, nullptr),
         2.5 * attn_flops, 0});

    // ModernBERT-class ops: rotary position embeddings on q and k (bytes: 2h of each row read
    // and written), and a gated MLP's activation of FFN1's 4h columns (GeGLU, I = 2h).
    rows.push_back(
        {"rotary_embedding (q, k in place)", shape,
         median_ms([&] { be->rotary_embedding(l, qkv, kHeads, 10000.f, false); }, reps, nullptr), 0,
         4.0 * tf * 2 * h * 2});
    const int64_t gi = kFfn / 2;
    const Tensor gout = empty_f32({t, gi}), dgout = random_f32({t, gi});
    rows.push_back({"glu_forward gelu", shape,
                    median_ms([&] { be->glu_forward(pre, GluAct::gelu, gout); }, reps, nullptr), 0,
                    4.0 * tf * 3 * gi});
    rows.push_back(
        {"glu_backward gelu", shape,
         median_ms([&] { be->glu_backward(pre, dgout, GluAct::gelu, dfx); }, reps, nullptr), 0,
         4.0 * tf * 5 * gi});

    // LayerNorm family (bytes: each [t, h] tensor read or written once).
    const Tensor bias = random_f32({h}), gamma = random_f32({h}), beta = random_f32({h});
    const Tensor y = empty_f32({t, h}), ln_in = empty_f32({t, h}), mean = empty_f32({t}),
                 rstd = empty_f32({t});
    rows.push_back({"residual_layernorm_forward", shape,
                    median_ms(
                        [&] {
                          be->residual_layernorm_forward(l, o, bias, x, {gamma, beta}, drop, y,
                                                         ln_in, mean, rstd);
                        },
                        reps, nullptr),
                    0, 4.0 * tf * h * 4});
    const Tensor dx = empty_f32({t, h}), dres = empty_f32({t, h}), dg = random_f32({h}),
                 dbeta = random_f32({h}), dbias = random_f32({h});
    rows.push_back({"residual_layernorm_backward", shape,
                    median_ms(
                        [&] {
                          be->residual_layernorm_backward(l, dout, ln_in, mean, rstd, {gamma, beta},
                                                          drop, dx, dres, false, dbias,
                                                          {dg, dbeta});
                        },
                        reps, nullptr),
                    0, 6.0 * tf * h * 4});

    // Embeddings.
    std::vector<int32_t> ids(t), segs(t);
    for (int64_t i = 0; i < t; ++i)
      ids[i] = static_cast<int32_t>(rng() % kVocab), segs[i] = static_cast<int32_t>(rng() & 1);
    const Tensor dids = upload(ids, {t}), dsegs = upload(segs, {t});
    EmbeddingParams ep{random_f32({kVocab, h}), random_f32({kMaxPos, h}), random_f32({2, h}), gamma,
                       beta};
    EmbeddingParams eg{random_f32({kVocab, h}), random_f32({kMaxPos, h}), random_f32({2, h}),
                       random_f32({h}), random_f32({h})};
    Dropout emb_drop = drop;
    emb_drop.site = DropoutSite::embedding;
    rows.push_back(
        {"embedding_forward", shape,
         median_ms([&] { be->embedding_forward(l, dids, dsegs, ep, emb_drop, y, mean, rstd); },
                   reps, nullptr),
         0, 4.0 * tf * h * 4});
    const Tensor dscratch = random_f32({t, h});
    rows.push_back({"embedding_backward", shape,
                    median_ms(
                        [&] {
                          be->embedding_backward(l, dids, dsegs, ep, emb_drop, mean, rstd, dscratch,
                                                 eg);
                        },
                        reps, nullptr),
                    0, 8.0 * tf * h * 4});

    // Heads: 15% masked.
    const int64_t m = std::max<int64_t>(1, t * 15 / 100);
    std::vector<int32_t> masked(m), labels(m);
    for (int64_t i = 0; i < m; ++i)
      masked[i] = static_cast<int32_t>(i * t / m), labels[i] = static_cast<int32_t>(rng() % kVocab);
    const Tensor dmasked = upload(masked, {m}), dlabels = upload(labels, {m});
    const Tensor mx = empty_f32({m, h});
    rows.push_back({"gather_rows (15%)", shape,
                    median_ms([&] { be->gather_rows(y, dmasked, mx); }, reps, nullptr), 0,
                    2.0 * m * h * 4});
    rows.push_back({"gather_rows_backward", shape,
                    median_ms([&] { be->gather_rows_backward(mx, dmasked, dx); }, reps, nullptr), 0,
                    (2.0 * m + tf) * h * 4});
    const Tensor logits = empty_f32({m, kVocab}), loss = random_f32({1}),
                 correct = upload(std::vector<int32_t>{0}, {1});
    const Tensor dmx = empty_f32({m, h}), mlm_bias = random_f32({kVocab});
    rows.push_back({"mlm_loss fwd+bwd (decoder)", shape,
                    median_ms(
                        [&] {
                          be->mlm_loss(mx, ep.word, mlm_bias, dlabels, 1.f / m, logits, loss,
                                       correct, dmx, eg.word, Tensor());
                        },
                        reps, nullptr),
                    6.0 * m * h * kVocab, 0});
    rows.push_back(
        {"softmax_cross_entropy in place", shape,
         median_ms(
             [&] { be->softmax_cross_entropy(logits, dlabels, 1.f / m, loss, correct, logits); },
             reps, nullptr),
         0, 2.0 * m * kVocab * 4});
  }

  // Optimizer over a BERT-Large-sized flat buffer (~335M parameters).
  {
    std::vector<LambTensor> table;
    int64_t at = 0;
    auto add = [&](int64_t size, int64_t decay) {
      table.push_back({at, size, decay});
      at += size;
    };
    add(kVocab * kHidden, 1);
    add(kMaxPos * kHidden, 1);
    add(2 * kHidden, 1);
    for (int layer = 0; layer < 24; ++layer) {
      add(3 * kHidden * kHidden, 1);
      add(3 * kHidden, 0);
      add(kHidden * kHidden, 1);
      add(kHidden, 0);
      add(4 * kHidden, 0);  // two LayerNorms
      add(kFfn * kHidden, 1);
      add(kFfn, 0);
      add(kHidden * kFfn, 1);
      add(kHidden, 0);
    }
    const int64_t n = at, nt = static_cast<int64_t>(table.size());
    const Tensor dtable = lamb_table(table.data(), nt);  // host memory (Backend::lamb_step)
    const Tensor p = random_f32({n}), g = random_f32({n}), mm = random_f32({n}, 0.01f),
                 vv = random_f32({n}, 0.01f, /*positive=*/true);
    const Tensor norms = empty_f32({2 * nt}), gn = random_f32({1}), out = empty_f32({1});
    const std::string shape = std::to_string(n / 1000000) + "M params";
    rows.push_back(
        {"l2_norm", shape, median_ms([&] { be->l2_norm(g, out); }, reps, nullptr), 0, 4.0 * n});
    LambConfig cfg;
    cfg.lr = 1e-9f;  // keep the parameters finite over the repetitions
    rows.push_back(
        {"lamb_step", shape,
         median_ms([&] { be->lamb_step(dtable, cfg, gn, p, g, mm, vv, norms); }, reps, nullptr), 0,
         4.0 * n * 7});  // read w g m v (twice w), write g m v w
  }
  cuda_synchronize(*be);

  std::printf("\n%-38s %-14s %10s %10s %10s %8s\n", "op", "shape", "ms", "TFLOP/s", "GB/s",
              "% peak");
  for (const Row& r : rows) {
    const double s = r.ms * 1e-3;
    const double tfl = r.flops > 0 ? r.flops / s / 1e12 : 0,
                 gbs = r.bytes > 0 ? r.bytes / s / 1e9 : 0;
    const double pct =
        r.flops > 0 ? 100.0 * r.flops / s / peak_flops : 100.0 * r.bytes / s / peak_bw;
    std::printf("%-38s %-14s %10.3f %10s %10s %7.1f%%\n", r.op.c_str(), r.shape.c_str(), r.ms,
                r.flops > 0 ? std::to_string(tfl).substr(0, 6).c_str() : "-",
                r.bytes > 0 ? std::to_string(gbs).substr(0, 7).c_str() : "-", pct);
  }
  std::printf("peaks measured here: fp32 GEMM %.1f TFLOP/s, copy %.0f GB/s\n", peak_flops / 1e12,
              peak_bw / 1e9);
  g_buffers.clear();
  return 0;
}

#else  // built without CUDA

int main() {
  std::printf("skipped: no CUDA device (%s)\n", packbert::describe_devices().c_str());
  return 0;
}

#endif
