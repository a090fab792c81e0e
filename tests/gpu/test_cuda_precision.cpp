// gpu label: mixed precision on the CUDA backend.
// - convert: every bf16 / f16 pattern widened and narrowed back, and random floats narrowed,
//   bit for bit the host converters (common/lowp_convert.h, the CPU emulation's);
// - lamb_step's low-precision copy on the device equals round(master) and the master weights
//   equal the fp32 step's;
// - the tiny model's bf16 step (native cuBLASLt GEMMs in bf16 with fp32 accumulation, native
//   LayerNorm and embedding kernels, the attention engineer's kernels for attention, the
//   adapter elsewhere) against the CPU backend's bf16 emulation: the loss to 1e-2 relative,
//   every gradient by relative L2; and the padded layout against the unpadded one on the GPU;
// - the native bf16 / f16 kernels of embedding_forward / backward and residual_layernorm_forward
//   / backward against the CPU's emulation, element by element (tolerance derived below), and
//   that they take no fp32 staging (the adapter's);
// - the native bf16 / f16 MLM decoder (mlm_loss) and row gather / scatter against the CPU's
//   emulation.
//
// Tolerance: 3e-2 per tensor, the bf16-vs-fp32 bound of tests/model/test_model_precision.cpp.
// Both sides store bf16 but round at different points: cuBLASLt sums in other orders (a 1-ulp
// flip of a stored bf16 value is 4e-3 relative), the GPU takes GELU of the rounded
// pre-activation, and native attention kernels round P to bf16 before P V. Those are
// independent bf16-sized errors along the same ~50-store path, so the same derivation holds.
#include <gtest/gtest.h>

#include <iostream>

#include "common/philox.h"
#include "device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "../model/model_test_util.h"
#include "common/lowp_convert.h"
#include "cuda_test_util.h"

namespace packbert::test {
namespace {

constexpr int kMaxSeqLen = 64;
constexpr double kLossTol = 1e-2;
constexpr double kGradTol = 3e-2;

std::vector<uint16_t> read16(const uint16_t* d, size_t n) {
  std::vector<uint16_t> h(n);
  cuda_ok(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost), "read16");
  return h;
}

TEST(CudaPrecision, ConvertMatchesTheHostConverters) {
  PB_REQUIRE_CUDA_DEVICE();
  auto gpu = make_cuda_backend(0, CudaBackendOptions{});
  const int64_t n = 65536;
  std::vector<uint16_t> patterns(n);
  for (int64_t i = 0; i < n; ++i) patterns[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
  uint16_t* d16 = static_cast<uint16_t*>(cuda_alloc(n * 2));
  uint16_t* back = static_cast<uint16_t*>(cuda_alloc(n * 2));
  DevBuf<float> wide({n});
  for (DType t : {DType::bf16, DType::f16}) {
    cuda_ok(cudaMemcpy(d16, patterns.data(), n * 2, cudaMemcpyHostToDevice), "upload");
    gpu->convert(wide.tensor(), Tensor(d16, t, {n}, Device::cuda));
    gpu->convert(Tensor(back, t, {n}, Device::cuda), wide.tensor());
    cuda_synchronize(*gpu);
    const std::vector<float> w = wide.values();
    const std::vector<uint16_t> b = read16(back, n);
    for (int64_t i = 0; i < n; ++i) {
      const auto p = static_cast<uint16_t>(i);
      const float want = t == DType::bf16 ? lowp::bf16_to_float(p) : lowp::f16_to_float(p);
      const uint16_t want_back = t == DType::bf16 ? lowp::float_to_bf16(want) : lowp::float_to_f16(want);
      ASSERT_EQ(std::memcmp(&w[static_cast<size_t>(i)], &want, 4), 0) << dtype_name(t) << " " << i;
      ASSERT_EQ(b[static_cast<size_t>(i)], want_back) << dtype_name(t) << " " << i;
    }
    // Random fp32 bit patterns (NaNs included) narrowed on the device and on the host.
    std::mt19937_64 rng(test_seed());
    std::vector<float> f(n);
    for (float& x : f) {
      const auto u = static_cast<uint32_t>(rng());
      std::memcpy(&x, &u, 4);
    }
    wide.set(f);
    gpu->convert(Tensor(back, t, {n}, Device::cuda), wide.tensor());
    cuda_synchronize(*gpu);
    const std::vector<uint16_t> r = read16(back, n);
    for (int64_t i = 0; i < n; ++i) {
      const float x = f[static_cast<size_t>(i)];
      ASSERT_EQ(r[static_cast<size_t>(i)], t == DType::bf16 ? lowp::float_to_bf16(x) : lowp::float_to_f16(x))
          << dtype_name(t) << " " << x;
    }
  }
  cuda_free(d16);
  cuda_free(back);
}

TEST(CudaPrecision, LambWritesTheRoundedCopy) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0, CudaBackendOptions{});
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t n = 50000;
  std::vector<LambTensor> rows = {{0, 20000, 1}, {20000, 100, 0}, {20100, 29900, 1}};
  std::vector<float> w(n), g(n), m(n, 0.f), v(n, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    w[static_cast<size_t>(i)] = 0.05f * nd(rng);
    g[static_cast<size_t>(i)] = 1e-3f * nd(rng);
  }
  double ss = 0;
  for (float x : g) ss += static_cast<double>(x) * x;
  const float gn = static_cast<float>(std::sqrt(ss));
  LambConfig cfg;
  cfg.lr = 1e-2f;
  cfg.step = 2;
  DevBuf<float> dw({n}, w), dg({n}, g), dm({n}, m), dv({n}, v), dn({6}), dgn({1}, {gn});
  DevBuf<int64_t> dt({3, 3}, {0, 20000, 1, 20000, 100, 0, 20100, 29900, 1});
  uint16_t* low = static_cast<uint16_t*>(cuda_alloc(n * 2));
  gpu->lamb_step(dt.tensor(), cfg, dgn.tensor(), dw.tensor(), dg.tensor(), dm.tensor(),
                 dv.tensor(), dn.tensor(), Tensor(low, DType::bf16, {n}, Device::cuda));
  cuda_synchronize(*gpu);
  const std::vector<float> gw = dw.values();
  const std::vector<uint16_t> gl = read16(low, n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(gl[static_cast<size_t>(i)], lowp::float_to_bf16(gw[static_cast<size_t>(i)])) << i;
  // The master weights are the CPU's fp32 step's to LAMB's GPU tolerance (test_cuda_ops).
  std::vector<float> norms(6);
  float gnc = gn;
  cpu->lamb_step(lamb_table(rows.data(), 3), cfg, view(&gnc, {1}), view(w.data(), {n}),
                 view(g.data(), {n}), view(m.data(), {n}), view(v.data(), {n}),
                 view(norms.data(), {6}));
  EXPECT_LE(rel_l2(gw.data(), w.data(), n), 1e-6);
  cuda_free(low);
}

// A bf16 / f16 buffer in both places: host bits, device copy.
struct Lowp16 {
  DType t;
  std::vector<int64_t> dims;
  std::vector<uint16_t> host;
  uint16_t* dev = nullptr;
  Lowp16(DType type, const std::vector<float>& v, std::vector<int64_t> d)
      : t(type), dims(std::move(d)) {
    for (float x : v) host.push_back(t == DType::bf16 ? lowp::float_to_bf16(x) : lowp::float_to_f16(x));
    dev = static_cast<uint16_t*>(cuda_alloc(host.size() * 2));
    cuda_ok(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice), "Lowp16");
  }
  ~Lowp16() { cuda_free(dev); }
  Lowp16(const Lowp16&) = delete;
  Lowp16& operator=(const Lowp16&) = delete;
  Tensor on(void* p, Device d) const {
    Tensor v(p, t, {}, d);
    v.ndim = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) v.shape[i] = dims[i];
    return v;
  }
  Tensor gpu() const { return on(dev, Device::cuda); }
  Tensor cpu() { return on(host.data(), Device::cpu); }
  std::vector<float> gpu_values() const {
    const std::vector<uint16_t> b = read16(dev, host.size());
    return widen(b);
  }
  std::vector<float> cpu_values() const { return widen(host); }
  std::vector<float> widen(const std::vector<uint16_t>& b) const {
    std::vector<float> f;
    for (uint16_t h : b) f.push_back(t == DType::bf16 ? lowp::bf16_to_float(h) : lowp::f16_to_float(h));
    return f;
  }
};

std::vector<float> randn(std::mt19937_64& rng, size_t n, float s = 1.f) {
  std::normal_distribution<float> nd(0.f, s);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// rel L2 of a device result against the CPU's emulation, printed and bounded.
void expect_rel_l2(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol,
                   const std::string& what) {
  const double e = rel_l2(gpu.data(), cpu.data(), static_cast<int64_t>(cpu.size()));
  std::printf("[lowp-error] %s %.2e\n", what.c_str(), e);
  EXPECT_LE(e, tol) << what;
}

// The native cuBLASLt path of linear_forward / linear_backward against the CPU's emulation.
// Low-precision outputs may differ by a flipped rounding where the fp32 sums differ in order
// (one bf16 ulp is 4e-3 relative, on few elements); the fp32 dw / db differ because CUDA rounds
// dout after the in-place dGELU before the GEMM reads it: 1e-2 bounds both.
TEST(CudaPrecision, LinearOpsMatchCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  CudaBackendOptions co;
  co.sync_each_op = true;
  auto gpu = make_cuda_backend(0, co);
  std::mt19937_64 rng(test_seed());
  auto check = [](const std::vector<float>& g, const std::vector<float>& c, const std::string& what) {
    expect_rel_l2(g, c, 1e-2, what);
  };
  struct Shape { int64_t n, k, m; };
  for (DType t : {DType::bf16, DType::f16}) {
    for (const Shape sh : {Shape{37, 64, 48}, Shape{64, 24, 19}, Shape{5, 128, 512}}) {
      const int64_t n = sh.n, k = sh.k, m = sh.m;
      const std::string tag = std::string(dtype_name(t)) + " n" + std::to_string(n) + " k" +
                              std::to_string(k) + " m" + std::to_string(m);
      Lowp16 x(t, randn(rng, n * k), {n, k}), w(t, randn(rng, m * k, 0.2f), {m, k});
      std::vector<float> bias = randn(rng, m);
      DevBuf<float> dbias({m}, bias);
      for (Epilogue ep :
           {Epilogue::none, Epilogue::bias, Epilogue::bias_gelu, Epilogue::bias_gelu_tanh}) {
        Lowp16 out(t, std::vector<float>(n * m), {n, m}), pre(t, std::vector<float>(n * m), {n, m});
        const bool gelu = has_gelu(ep);
        const Tensor b = ep == Epilogue::none ? Tensor() : view(bias.data(), {m});
        const Tensor bd = ep == Epilogue::none ? Tensor() : dbias.tensor();
        cpu->linear_forward(x.cpu(), w.cpu(), b, ep, out.cpu(), gelu ? pre.cpu() : Tensor());
        gpu->linear_forward(x.gpu(), w.gpu(), bd, ep, out.gpu(), gelu ? pre.gpu() : Tensor());
        cuda_synchronize(*gpu);
        check(out.gpu_values(), out.cpu_values(),
              tag + " forward epilogue " + std::to_string(static_cast<int>(ep)) +
                  (ep == Epilogue::bias_gelu_tanh && m % 8 == 0 ? " (GELU_AUX_BIAS)" : ""));
        if (!gelu) continue;
        check(pre.gpu_values(), pre.cpu_values(), tag + " forward pre");
        // Backward through the GELU of this forward, dx accumulated, dw and db in fp32.
        Lowp16 dout(t, randn(rng, n * m, 1e-2f), {n, m}), dx(t, randn(rng, n * k), {n, k});
        const std::vector<float> dw0 = randn(rng, m * k, 1e-3f), db0 = randn(rng, m, 1e-3f);
        std::vector<float> dw = dw0, db = db0;
        DevBuf<float> ddw({m, k}, dw0), ddb({m}, db0);
        LinearBackwardOptions oc, og;
        oc.gelu = og.gelu = gelu_of(ep);
        oc.out_gelu_pre = pre.cpu();
        oc.dx_accumulate = true;
        og.out_gelu_pre = pre.gpu();
        og.dx_accumulate = true;
        cpu->linear_backward(x.cpu(), w.cpu(), dout.cpu(), dx.cpu(), view(dw.data(), {m, k}),
                             view(db.data(), {m}), oc);
        gpu->linear_backward(x.gpu(), w.gpu(), dout.gpu(), dx.gpu(), ddw.tensor(), ddb.tensor(), og);
        cuda_synchronize(*gpu);
        check(dout.gpu_values(), dout.cpu_values(), tag + " backward d(pre)");
        check(dx.gpu_values(), dx.cpu_values(), tag + " backward dx +=");
        std::vector<float> dwd = ddw.values(), dbd = ddb.values();
        for (size_t i = 0; i < dw.size(); ++i) dwd[i] -= dw0[i], dw[i] -= dw0[i];
        for (size_t i = 0; i < db.size(); ++i) dbd[i] -= db0[i], db[i] -= db0[i];
        check(dwd, dw, tag + " backward dw");
        check(dbd, db, tag + " backward db");
        // dx through the GELU of the input (x_gelu_pre = the forward's pre as [n, k] when
        // shapes allow: reuse x as the pre-activation of itself).
        Lowp16 dx2(t, std::vector<float>(n * k), {n, k});
        LinearBackwardOptions xc, xg;
        xc.gelu = xg.gelu = gelu_of(ep);  // tanh: the DGELU epilogue where k % 8 == 0
        xc.x_gelu_pre = x.cpu();
        xg.x_gelu_pre = x.gpu();
        Lowp16 dout2(t, randn(rng, n * m, 1e-2f), {n, m});
        cpu->linear_backward(Tensor(), w.cpu(), dout2.cpu(), dx2.cpu(), Tensor(), Tensor(), xc);
        gpu->linear_backward(Tensor(), w.gpu(), dout2.gpu(), dx2.gpu(), Tensor(), Tensor(), xg);
        cuda_synchronize(*gpu);
        check(dx2.gpu_values(), dx2.cpu_values(), tag + " backward dx through x_gelu_pre");
      }
    }
  }
}

// expect_grads_close with the NSP bias measured against max(its norm, the noise floor of a
// random-sign mean of gs terms of size 0.5): it is a cancelling sum whose relative error is
// unbounded in a balanced batch (the derivation is in tests/model/test_model_precision.cpp).
void expect_lowp_grads_close(const ParamTable& table, const std::vector<float>& got,
                             const std::vector<float>& want, double tol, const std::string& what,
                             int64_t gs, bool print_all = false) {
  const ParamTensor& b = table.at("cls.seq_relationship.bias");
  std::vector<float> g = got;
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.size; ++i) {
    const auto j = static_cast<size_t>(b.offset + i);
    num += (static_cast<double>(got[j]) - want[j]) * (static_cast<double>(got[j]) - want[j]);
    den += static_cast<double>(want[j]) * want[j];
    g[j] = want[j];
  }
  expect_grads_close(table, g, want, tol, what, print_all);
  const double floor = 0.5 * std::sqrt(2.0 / static_cast<double>(gs));
  const double e = std::isnan(num) ? 1e30 : std::sqrt(num) / std::max(std::sqrt(den), floor);
  std::printf("[model-error] %s: cls.seq_relationship.bias (floor %.2e) %.2e\n", what.c_str(),
              floor, e);
  EXPECT_LE(e, tol) << what << ": cls.seq_relationship.bias";
}

StepOutput run_cuda_step(Backend& gpu, HostModel& m, const Batch& batch, int64_t gm, int64_t gs,
                         uint32_t step, uint64_t seed, Precision p) {
  const int64_t total = m.table.total();
  DevBuf<float> params({total}, m.params), grads({total});
  gpu.zero(grads.tensor());
  StepOutput out;
  {
    BertOptions o;
    o.precision = p;
    Bert bert(m.config, gpu, params.tensor(), grads.tensor(), o, cuda_alloc, cuda_free);
    out.result = bert.forward(batch, gm, gs, step, seed);
    bert.backward();
    cuda_synchronize(gpu);
  }
  EXPECT_TRUE(grads.guards_intact());
  EXPECT_EQ(params.values(), m.params) << "the model changed its parameters";
  out.grads = grads.values();
  return out;
}

// The MLM decoder on bf16 / f16 operands (the native path: decoder GEMMs on the low-precision
// word embeddings, logits in fp32, the backward in row blocks of 64 MiB of rounded logits
// gradient) against the CPU's emulation (widen, fp32 op, round). The logits come from the same
// rounded operands in fp32 on both sides: the forward-only logits to 1e-5 and the loss sum to
// 1e-4. The gradients differ by CUDA's rounding of the logits gradient before the two GEMMs
// (2^-9 relative per element in bf16) and dx's own rounding: 1e-2, as the linear ops. Shapes:
// small ones, one with dx and db but no dw (the column-sum path), and 2300 masked tokens over
// the BERT vocabulary, which takes three blocks.
TEST(CudaPrecision, MlmLossLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  CudaBackendOptions co;
  co.sync_each_op = true;
  auto gpu = make_cuda_backend(0, co);
  std::mt19937_64 rng(test_seed());
  const auto& check = expect_rel_l2;
  struct Case {
    int64_t m, h, v;
    bool dw, db;
  };
  for (DType t : {DType::bf16, DType::f16}) {
    for (const Case c : {Case{37, 64, 96, true, true}, Case{19, 128, 1000, true, false},
                         Case{64, 64, 512, false, true}, Case{2300, 64, 30528, true, true}}) {
      const int64_t m = c.m, h = c.h, v = c.v;
      const std::string tag = fmt::format("mlm_loss {} m{} h{} v{}{}{}", dtype_name(t), m, h, v,
                                          c.dw ? " dw" : "", c.db ? " db" : "");
      // Logits of order 1.6: a softmax neither uniform nor one-hot.
      Lowp16 x(t, randn(rng, m * h), {m, h}), w(t, randn(rng, v * h, 0.2f), {v, h});
      const std::vector<float> bias = randn(rng, v);
      const std::vector<int32_t> labels = random_ints(rng, m, 0, static_cast<int32_t>(v - 1));
      DevBuf<float> dbias({v}, bias);
      DevBuf<int32_t> dlabels({m}, labels);
      const float scale = 1.f / static_cast<float>(m);
      for (const bool backward : {false, true}) {
        std::vector<float> logits(m * v), loss = {0.5f};
        std::vector<int32_t> correct = {3};
        DevBuf<float> dlogits({m, v}), dloss({1}, loss);
        DevBuf<int32_t> dcorrect({1}, correct);
        Lowp16 dx(t, std::vector<float>(m * h), {m, h});
        const std::vector<float> dw0 = randn(rng, v * h, 1e-3f), db0 = randn(rng, v, 1e-3f);
        std::vector<float> dw = dw0, db = db0;
        DevBuf<float> ddw({v, h}, dw0), ddb({v}, db0);
        const bool want_dw = backward && c.dw, want_db = backward && c.db;
        cpu->mlm_loss(x.cpu(), w.cpu(), view(bias.data(), {v}), view(labels.data(), {m}), scale,
                      view(logits.data(), {m, v}), view(loss.data(), {1}),
                      view(correct.data(), {1}), backward ? dx.cpu() : Tensor(),
                      want_dw ? view(dw.data(), {v, h}) : Tensor(),
                      want_db ? view(db.data(), {v}) : Tensor());
        gpu->mlm_loss(x.gpu(), w.gpu(), dbias.tensor(), dlabels.tensor(), scale, dlogits.tensor(),
                      dloss.tensor(), dcorrect.tensor(), backward ? dx.gpu() : Tensor(),
                      want_dw ? ddw.tensor() : Tensor(), want_db ? ddb.tensor() : Tensor());
        cuda_synchronize(*gpu);
        const std::string what = tag + (backward ? " backward" : " forward");
        const double lc = loss[0] - 0.5, lg = static_cast<double>(dloss.values()[0]) - 0.5;
        std::printf("[lowp-error] %s loss %.6f vs %.6f\n", what.c_str(), lg, lc);
        EXPECT_NEAR(lg, lc, 1e-4 * std::abs(lc)) << what;
        EXPECT_NEAR(dcorrect.values()[0], correct[0], 2) << what;  // near-ties may flip
        if (!backward) {
          check(dlogits.values(), logits, 1e-5, what + " logits");
          continue;
        }
        check(dx.gpu_values(), dx.cpu_values(), 1e-2, what + " dx");
        auto increments = [](std::vector<float> a, const std::vector<float>& a0) {
          for (size_t i = 0; i < a.size(); ++i) a[i] -= a0[i];
          return a;
        };
        if (want_dw) check(increments(ddw.values(), dw0), increments(dw, dw0), 1e-2, what + " dw");
        else EXPECT_EQ(ddw.values(), dw0) << what << ": dw not given, yet changed";
        if (want_db) check(increments(ddb.values(), db0), increments(db, db0), 1e-2, what + " db");
        else EXPECT_EQ(ddb.values(), db0) << what << ": db not given, yet changed";
        EXPECT_TRUE(ddw.guards_intact() && ddb.guards_intact() && dlogits.guards_intact()) << what;
      }
    }
  }
}

// gather_rows in bf16 / f16 is a bit copy, as the emulation's widen-copy-round; its backward
// adds in fp32 and rounds after each add, the emulation once at the end: the same bits where
// every row is hit once (the model's masked positions), within one ulp per repeat otherwise.
TEST(CudaPrecision, GatherRowsLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0, CudaBackendOptions{});
  std::mt19937_64 rng(test_seed());
  const int64_t rows = 300, h = 72, m = 120;
  for (DType t : {DType::bf16, DType::f16}) {
    for (const bool repeats : {false, true}) {
      std::vector<int32_t> idx(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) idx[static_cast<size_t>(r)] = static_cast<int32_t>(r);
      std::shuffle(idx.begin(), idx.end(), rng);
      idx.resize(static_cast<size_t>(m));
      if (repeats) idx[5] = idx[9] = idx[40] = idx[2];
      const std::string what = std::string(dtype_name(t)) + (repeats ? " repeated" : " distinct");
      DevBuf<int32_t> didx({m}, idx);
      Lowp16 x(t, randn(rng, rows * h), {rows, h}), out(t, std::vector<float>(m * h), {m, h});
      cpu->gather_rows(x.cpu(), view(idx.data(), {m}), out.cpu());
      gpu->gather_rows(x.gpu(), didx.tensor(), out.gpu());
      cuda_synchronize(*gpu);
      EXPECT_EQ(read16(out.dev, out.host.size()), out.host) << what << ": gather";
      Lowp16 dout(t, randn(rng, m * h), {m, h}), dx(t, randn(rng, rows * h), {rows, h});
      cpu->gather_rows_backward(dout.cpu(), view(idx.data(), {m}), dx.cpu());
      gpu->gather_rows_backward(dout.gpu(), didx.tensor(), dx.gpu());
      cuda_synchronize(*gpu);
      if (!repeats) {
        EXPECT_EQ(read16(dx.dev, dx.host.size()), dx.host) << what << ": backward";
      } else {
        expect_rel_l2(dx.gpu_values(), dx.cpu_values(), 1e-2, "gather_rows_backward " + what);
      }
    }
  }
}

TEST(CudaPrecision, TinyBertBf16MatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto rng = model_rng(131);
  auto cpu = make_cpu_backend();
  CudaBackendOptions o;
  o.sync_each_op = true;
  auto gpu = make_cuda_backend(0, o);
  HostModel m(bert_preset("tiny"), rng());
  std::vector<int> lengths = {5, kMaxSeqLen, 33, 1 + kMaxSeqLen / 2, 17, 6, 64, 40};
  auto samples = model_samples(rng, lengths, 10, m.config.real_vocab_size);
  // One NSP label: balanced labels cancel the NSP head's gradients (test_model_precision.cpp).
  for (Sample& x : samples) x.next_sentence_label = 1;
  const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
  const auto step = static_cast<uint32_t>(rng() % kDropoutMaxStep);
  const uint64_t seed = rng();
  BertOptions bf16;
  bf16.precision = Precision::bf16;
  StepOutput unpadded_gpu;
  for (BatchLayout layout : {BatchLayout::unpadded, BatchLayout::padded}) {
    const Batch batch = make_batch(samples, layout, kMaxSeqLen);
    const StepOutput want = run_step(*cpu, m, {batch}, gm, gs, step, seed, bf16);
    const StepOutput got = run_cuda_step(*gpu, m, batch, gm, gs, step, seed, Precision::bf16);
    const std::string what = std::string("cuda bf16 vs cpu bf16, ") + batch_layout_name(layout);
    const double loss_err =
        std::abs(got.result.loss - want.result.loss) / std::abs(want.result.loss);
    std::printf("[model-error] %s: loss %.6f vs %.6f (rel %.2e)\n", what.c_str(),
                got.result.loss, want.result.loss, loss_err);
    ASSERT_TRUE(std::isfinite(got.result.loss));
    EXPECT_LE(loss_err, kLossTol) << what;
    expect_lowp_grads_close(m.table, got.grads, want.grads, kGradTol, what, gs, true);
    if (layout == BatchLayout::unpadded) {
      unpadded_gpu = got;
      // And against the fp32 reference.
      const StepOutput fp32 = run_step(*cpu, m, {batch}, gm, gs, step, seed);
      expect_lowp_grads_close(m.table, got.grads, fp32.grads, kGradTol, "cuda bf16 vs cpu fp32",
                              gs);
    } else {
      const double e = std::abs(got.result.loss - unpadded_gpu.result.loss) /
                       std::abs(unpadded_gpu.result.loss);
      EXPECT_LE(e, kLossTol);
      expect_lowp_grads_close(m.table, got.grads, unpadded_gpu.grads, kGradTol,
                              "cuda bf16 padded vs unpadded", gs);
    }
  }
}

// ---- native bf16 / f16 LayerNorm and embedding kernels -----------------------------------------
// embedding_forward / backward and residual_layernorm_forward / backward with their "lowp:"
// tensors in bf16 or f16 (the combinations the model passes: those tensors in one dtype, the
// embedding tables f32 or in that dtype) against the CPU backend's emulation (widen, fp32 op,
// round) on the same 16-bit inputs.
//
// Tolerance. Both sides compute the same fp32 expressions per element and differ only in the
// order of the row reductions (Welford merges, double sums of the backward, column sums), which
// moves the fp32 value before the final rounding by a few fp32 ulps of the row's scale (~2e-7
// relative; FMA contraction on the GPU adds half an fp32 ulp). Rounding to 16 bits then gives
// the same bits unless that fp32 value sits that close to a rounding midpoint: probability
// ~2e-7 / 2^-8 = 5e-5 per bf16 element, 4e-4 per f16 element, a few times more for elements
// that are small against their row (cancellation in LayerNorm's output and dx: the error is
// relative to the row, the ulp to the element). So per element: |gpu - cpu| <= 2 ulps of the
// format at |cpu| (a flipped rounding is 1 ulp), plus 1e-5 of the tensor's rms for elements
// near zero; and at least 98% of the elements bit for bit (the estimate gives > 99.5% for f16).
// The fp32 outputs (statistics, parameter gradients) are fp32 against fp32 in another order:
// test_cuda_ops's kTol (1e-5).
//
// The native path is asserted by the memory it does not use: the adapter widens every
// low-precision tensor into a grow-only fp32 staging buffer of [rows, H] on first use, the native
// forward kernels allocate nothing and the native LayerNorm backward one fp32 [rows, H] buffer
// (dx for dbias). A fresh backend's first calls on a large shape are measured with
// cudaMemGetInfo (NativeKernelsNeedNoStaging). embedding_backward stages one [rows, H] buffer
// either way (dout widened, or the fp32 gradient scratch), so it is not told apart there; it
// dispatches on the same predicate as the forward.

constexpr double kFp32Tol = 1e-5;
constexpr double kMinExact = 0.98;
constexpr uint16_t kNaN16 = 0x7FC1;  // a NaN as bf16 and as f16

uint16_t round16(DType t, float x) {
  return t == DType::bf16 ? lowp::float_to_bf16(x) : lowp::float_to_f16(x);
}
float widen16(DType t, uint16_t b) {
  return t == DType::bf16 ? lowp::bf16_to_float(b) : lowp::f16_to_float(b);
}
std::vector<uint16_t> round16(DType t, const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = round16(t, v[i]);
  return b;
}
Tensor view16(std::vector<uint16_t>& v, DType t, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), t, dims, Device::cpu);
}

// One unit in the last place of the format at |x|.
double ulp16(DType t, double x) {
  const int mant = t == DType::bf16 ? 7 : 10;
  int e = 0;
  std::frexp(x == 0.0 ? 1e-30 : std::abs(x), &e);  // |x| = m 2^e, m in [0.5, 1)
  const double u = std::ldexp(1.0, e - 1 - mant);
  return t == DType::f16 ? std::max(u, std::ldexp(1.0, -24)) : u;
}

// A bf16 / f16 device buffer between NaN guards, NaN-filled (written outputs) or set.
class Guarded16 {
 public:
  static constexpr size_t kGuard = 64;
  Guarded16(DType t, std::vector<int64_t> dims) : t_(t), dims_(std::move(dims)) {
    n_ = 1;
    for (int64_t d : dims_) n_ *= static_cast<size_t>(d);
    base_ = static_cast<uint16_t*>(cuda_alloc((n_ + 2 * kGuard) * 2));
    const std::vector<uint16_t> pattern(n_ + 2 * kGuard, kNaN16);
    cuda_ok(cudaMemcpy(base_, pattern.data(), pattern.size() * 2, cudaMemcpyHostToDevice),
            "Guarded16 fill");
  }
  Guarded16(DType t, std::vector<int64_t> dims, const std::vector<uint16_t>& bits)
      : Guarded16(t, std::move(dims)) {
    EXPECT_EQ(bits.size(), n_);
    cuda_ok(cudaMemcpy(base_ + kGuard, bits.data(), n_ * 2, cudaMemcpyHostToDevice),
            "Guarded16 set");
  }
  ~Guarded16() { cuda_free(base_); }
  Guarded16(const Guarded16&) = delete;
  Guarded16& operator=(const Guarded16&) = delete;
  Tensor tensor() const {
    Tensor v(base_ + kGuard, t_, {}, Device::cuda);
    v.ndim = static_cast<int>(dims_.size());
    for (size_t i = 0; i < dims_.size(); ++i) v.shape[i] = dims_[i];
    return v;
  }
  std::vector<uint16_t> bits() const { return read16(base_ + kGuard, n_); }
  bool guards_intact() const {
    for (const uint16_t* p : {base_, base_ + kGuard + n_})
      for (uint16_t b : read16(p, kGuard))
        if (b != kNaN16) return false;
    return true;
  }

 private:
  DType t_;
  std::vector<int64_t> dims_;
  size_t n_ = 0;
  uint16_t* base_ = nullptr;
};

// The 16-bit output `got` (device) against the emulation's `want`: guards, every element written
// and finite, per-element ulps, the fraction of exact matches (see the tolerance above).
void expect_lowp_match(const std::string& what, DType t, const Guarded16& got,
                       const std::vector<uint16_t>& want) {
  EXPECT_TRUE(got.guards_intact()) << what << ": write outside the buffer";
  const std::vector<uint16_t> g = got.bits();
  ASSERT_EQ(g.size(), want.size()) << what;
  double ss = 0;
  for (uint16_t w : want) ss += static_cast<double>(widen16(t, w)) * widen16(t, w);
  const double floor = 1e-5 * std::sqrt(ss / static_cast<double>(std::max<size_t>(want.size(), 1)));
  size_t exact = 0, bad = 0, non_finite = 0;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = widen16(t, g[i]), b = widen16(t, want[i]);
    if (!std::isfinite(a) || !std::isfinite(b)) {  // NaN never passes
      ++non_finite;
      continue;
    }
    exact += g[i] == want[i];
    const double ulps = std::abs(a - b) / ulp16(t, b);
    worst = std::max(worst, ulps);
    if (std::abs(a - b) > 2 * ulp16(t, b) + floor) {
      if (bad++ < 5)
        ADD_FAILURE() << what << ": element " << i << " is " << a << ", the emulation's " << b;
    }
  }
  const double frac = g.empty() ? 1.0 : static_cast<double>(exact) / static_cast<double>(g.size());
  std::printf("[lowp-error] %-62s exact %.5f worst %.1f ulp\n", what.c_str(), frac, worst);
  EXPECT_EQ(non_finite, 0u) << what << ": unwritten or non-finite elements (either side)";
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_GE(frac, kMinExact) << what;
}

void expect_fp32_close(const std::string& what, const std::vector<float>& got,
                       const std::vector<float>& want) {
  const double e = rel_l2(got.data(), want.data(), static_cast<int64_t>(want.size()));
  std::printf("[lowp-error] %-62s rel %.2e\n", what.c_str(), e);
  EXPECT_LE(e, kFp32Tol) << what;
}

Dropout lowp_dropout(bool on, uint64_t seed, DropoutSite site, uint32_t layer) {
  Dropout d;
  d.p = on ? 0.1f : 0.f;
  d.seed = seed;
  d.step = 4321;
  d.layer = layer;
  d.site = site;
  return d;
}

TEST(CudaPrecision, ResidualLayerNormLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  CudaBackendOptions co;
  co.sync_each_op = true;
  auto gpu = make_cuda_backend(0, co);
  auto rng = make_rng(601);
  // bits: 1 bias, 2 residual, 4 dropout, 8 ln_in aliases x, 16 dresidual aliases dout,
  // 32 parameter gradients (dbias, dgamma, dbeta), 64 no dresidual, 128 the MLM transform's
  // call (no layout, nothing but x)
  const int variants[] = {1 | 2 | 4 | 32,  1 | 2 | 8 | 16 | 32, 2 | 4 | 8, 1 | 4 | 64 | 32,
                          1 | 2 | 4 | 16, 0,                   128 | 8 | 32 | 64};
  for (DType t : {DType::bf16, DType::f16})
    for (int var : variants)
      for (int64_t h : {int64_t{130}, int64_t{768}}) {
        const std::vector<int32_t> lens = {1, 33, 12, 64, 7};
        const HostLayout l = padded(lens, random_sample_ids(rng, lens.size()), 64);
        const int64_t rows = l.rows;
        const bool drop = var & 4, alias_in = var & 8, alias_res = var & 16, pg = var & 32,
                   no_res = var & 64, plain = var & 128;
        const std::string what = fmt::format("residual_layernorm {} var {} h {}", dtype_name(t),
                                             var, h);
        const Dropout d = lowp_dropout(drop, rng(), DropoutSite::attention_output, 3);
        std::vector<uint16_t> x = round16(t, random_floats(rng, rows * h, 2.f));
        std::vector<uint16_t> res = round16(t, random_floats(rng, rows * h, 2.f));
        auto bias = random_floats(rng, h), gamma = random_floats(rng, h),
             beta = random_floats(rng, h);
        // CPU emulation.
        std::vector<uint16_t> hx = x, out(rows * h), ln_in(rows * h);
        std::vector<float> mean(rows), rstd(rows);
        DevLayout dl(l);
        const SeqLayout hl = plain ? SeqLayout{} : l.view();
        const SeqLayout gl = plain ? SeqLayout{} : dl.view();
        cpu->residual_layernorm_forward(
            hl, view16(hx, t, {rows, h}), var & 1 ? view(bias.data(), {h}) : Tensor(),
            var & 2 ? view16(res, t, {rows, h}) : Tensor(),
            {view(gamma.data(), {h}), view(beta.data(), {h})}, d, view16(out, t, {rows, h}),
            alias_in ? view16(hx, t, {rows, h}) : view16(ln_in, t, {rows, h}),
            view(mean.data(), {rows}), view(rstd.data(), {rows}));
        if (alias_in) ln_in = hx;
        // Device.
        Guarded16 gx(t, {rows, h}, x), gres(t, {rows, h}, res), gout(t, {rows, h}),
            gln(t, {rows, h});
        DevBuf<float> gbias({h}, bias), ggamma({h}, gamma), gbeta({h}, beta), gmean({rows}),
            grstd({rows});
        gpu->residual_layernorm_forward(
            gl, gx.tensor(), var & 1 ? gbias.tensor() : Tensor(),
            var & 2 ? gres.tensor() : Tensor(), {ggamma.tensor(), gbeta.tensor()}, d,
            gout.tensor(), alias_in ? gx.tensor() : gln.tensor(), gmean.tensor(),
            grstd.tensor());
        cuda_synchronize(*gpu);
        expect_lowp_match(what + " out", t, gout, out);
        expect_lowp_match(what + " ln_in", t, alias_in ? gx : gln, ln_in);
        EXPECT_DEV_OUTPUT_OK(gmean);
        EXPECT_DEV_OUTPUT_OK(grstd);
        expect_fp32_close(what + " mean", gmean.values(), mean);
        expect_fp32_close(what + " rstd", grstd.values(), rstd);

        // Backward from the emulation's saved ln_in, mean, rstd (only the backward compared).
        std::vector<uint16_t> dy = round16(t, random_floats(rng, rows * h));
        const auto gg0 = random_floats(rng, h), gb0 = random_floats(rng, h),
                   gbias0 = random_floats(rng, h);
        std::vector<uint16_t> hdy = dy, hdx(rows * h), hdres(rows * h);
        std::vector<float> cg = gg0, cb = gb0, cbias = gbias0;
        const Tensor hres = no_res ? Tensor()
                            : alias_res ? view16(hdy, t, {rows, h})
                                        : view16(hdres, t, {rows, h});
        cpu->residual_layernorm_backward(
            hl, view16(hdy, t, {rows, h}), view16(ln_in, t, {rows, h}), view(mean.data(), {rows}),
            view(rstd.data(), {rows}), {view(gamma.data(), {h}), Tensor()}, d,
            view16(hdx, t, {rows, h}), hres, pg ? view(cbias.data(), {h}) : Tensor(),
            {pg ? view(cg.data(), {h}) : Tensor(), pg ? view(cb.data(), {h}) : Tensor()});
        if (alias_res) hdres = hdy;
        Guarded16 gdy(t, {rows, h}, dy), glnin(t, {rows, h}, ln_in), gdx(t, {rows, h}),
            gdres(t, {rows, h});
        DevBuf<float> gmean2({rows}, mean), grstd2({rows}, rstd), ggg({h}, gg0), ggb({h}, gb0),
            ggbias({h}, gbias0);
        const Tensor dres = no_res ? Tensor() : alias_res ? gdy.tensor() : gdres.tensor();
        gpu->residual_layernorm_backward(
            gl, gdy.tensor(), glnin.tensor(), gmean2.tensor(), grstd2.tensor(),
            {ggamma.tensor(), Tensor()}, d, gdx.tensor(), dres, pg ? ggbias.tensor() : Tensor(),
            {pg ? ggg.tensor() : Tensor(), pg ? ggb.tensor() : Tensor()});
        cuda_synchronize(*gpu);
        expect_lowp_match(what + " dx", t, gdx, hdx);
        if (!no_res) expect_lowp_match(what + " dresidual", t, alias_res ? gdy : gdres, hdres);
        if (!alias_res) {
          EXPECT_EQ(gdy.bits(), dy) << what << ": dout changed";
        }
        EXPECT_EQ(glnin.bits(), ln_in) << what << ": ln_in changed";
        if (pg) {
          expect_fp32_close(what + " dbias", ggbias.values(), cbias);
          expect_fp32_close(what + " dgamma", ggg.values(), cg);
          expect_fp32_close(what + " dbeta", ggb.values(), cb);
        }
        EXPECT_TRUE(ggbias.guards_intact() && ggg.guards_intact() && ggb.guards_intact()) << what;
      }
}

TEST(CudaPrecision, EmbeddingLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  CudaBackendOptions co;
  co.sync_each_op = true;
  auto gpu = make_cuda_backend(0, co);
  auto rng = make_rng(602);
  const int64_t vocab = 50, positions = 64, types = 2;
  for (DType t : {DType::bf16, DType::f16})
    for (int trial = 0; trial < 8; ++trial) {
      // trial bits: 1 dropout, 2 tables in t (else f32, as the model passes them), 4 unpadded
      // layout (else padded), and trial 3 / 6 leave out some parameter gradients.
      const bool drop = trial & 1, lowp_tables = trial & 2, unpad = trial & 4;
      const int64_t h = trial % 3 == 0 ? 130 : 256;
      const std::vector<int32_t> lens = {1, 17, 64, 3, 9};
      const auto ids = random_sample_ids(rng, lens.size());
      const HostLayout l = unpad ? unpadded(lens, ids) : padded(lens, ids, 64);
      const int64_t rows = l.rows;
      const DType tt = lowp_tables ? t : DType::f32;
      const std::string what = fmt::format("embedding {} tables {} trial {} h {}", dtype_name(t),
                                           dtype_name(tt), trial, h);
      const Dropout d = lowp_dropout(drop, rng(), DropoutSite::embedding, 0);
      // Tables: f32 values exactly representable in t, so both table dtypes see the same values.
      auto table = [&](int64_t n) {
        std::vector<float> v = random_floats(rng, n);
        for (float& x : v) x = widen16(t, round16(t, x));
        return v;
      };
      std::vector<float> word = table(vocab * h), pos = table(positions * h),
                         type = table(types * h);
      std::vector<uint16_t> word16 = round16(t, word), pos16 = round16(t, pos),
                            type16 = round16(t, type);
      auto gamma = random_floats(rng, h), beta = random_floats(rng, h);
      auto tok = random_ints(rng, rows, 0, vocab - 1), seg = random_ints(rng, rows, 0, types - 1);
      auto tab = [&](std::vector<float>& f, std::vector<uint16_t>& b, int64_t n) {
        return lowp_tables ? view16(b, t, {n, h}) : view(f.data(), {n, h});
      };
      const EmbeddingParams hp{tab(word, word16, vocab), tab(pos, pos16, positions),
                               tab(type, type16, types), view(gamma.data(), {h}),
                               view(beta.data(), {h})};
      std::vector<uint16_t> out(rows * h);
      std::vector<float> mean(rows), rstd(rows);
      cpu->embedding_forward(l.view(), view(tok.data(), {rows}), view(seg.data(), {rows}), hp, d,
                             view16(out, t, {rows, h}), view(mean.data(), {rows}),
                             view(rstd.data(), {rows}));
      DevLayout dl(l);
      DevBuf<float> gword({vocab, h}, word), gpos({positions, h}, pos), gtype({types, h}, type),
          ggamma({h}, gamma), gbeta({h}, beta), gmean({rows}), grstd({rows});
      Guarded16 gword16(t, {vocab, h}, word16), gpos16(t, {positions, h}, pos16),
          gtype16(t, {types, h}, type16), gout(t, {rows, h});
      DevBuf<int32_t> gtok({rows}, tok), gseg({rows}, seg);
      const EmbeddingParams gp{lowp_tables ? gword16.tensor() : gword.tensor(),
                               lowp_tables ? gpos16.tensor() : gpos.tensor(),
                               lowp_tables ? gtype16.tensor() : gtype.tensor(), ggamma.tensor(),
                               gbeta.tensor()};
      gpu->embedding_forward(dl.view(), gtok.tensor(), gseg.tensor(), gp, d, gout.tensor(),
                             gmean.tensor(), grstd.tensor());
      cuda_synchronize(*gpu);
      expect_lowp_match(what + " out", t, gout, out);
      EXPECT_DEV_OUTPUT_OK(gmean);
      EXPECT_DEV_OUTPUT_OK(grstd);
      expect_fp32_close(what + " mean", gmean.values(), mean);
      expect_fp32_close(what + " rstd", grstd.values(), rstd);

      // Backward from the emulation's statistics; the gradients (f32) accumulate.
      const bool some = trial == 3 || trial == 6;
      std::vector<uint16_t> dy = round16(t, random_floats(rng, rows * h)), hdy = dy;
      const auto gw0 = random_floats(rng, vocab * h), gp0 = random_floats(rng, positions * h),
                 gt0 = random_floats(rng, types * h), gg0 = random_floats(rng, h),
                 gb0 = random_floats(rng, h);
      std::vector<float> gw = gw0, gpv = gp0, gt = gt0, gg = gg0, gb = gb0;
      const EmbeddingParams hg{view(gw.data(), {vocab, h}),
                               some ? Tensor() : view(gpv.data(), {positions, h}),
                               view(gt.data(), {types, h}),
                               some ? Tensor() : view(gg.data(), {h}), view(gb.data(), {h})};
      cpu->embedding_backward(l.view(), view(tok.data(), {rows}), view(seg.data(), {rows}), hp, d,
                              view(mean.data(), {rows}), view(rstd.data(), {rows}),
                              view16(hdy, t, {rows, h}), hg);
      Guarded16 gdy(t, {rows, h}, dy);
      DevBuf<float> gmean2({rows}, mean), grstd2({rows}, rstd), ggw({vocab, h}, gw0),
          ggp({positions, h}, gp0), ggt({types, h}, gt0), ggg({h}, gg0), ggb({h}, gb0);
      const EmbeddingParams gg_{ggw.tensor(), some ? Tensor() : ggp.tensor(), ggt.tensor(),
                                some ? Tensor() : ggg.tensor(), ggb.tensor()};
      gpu->embedding_backward(dl.view(), gtok.tensor(), gseg.tensor(), gp, d, gmean2.tensor(),
                              grstd2.tensor(), gdy.tensor(), gg_);
      cuda_synchronize(*gpu);
      EXPECT_TRUE(gdy.guards_intact()) << what << ": dout written outside the buffer";
      expect_fp32_close(what + " dword", ggw.values(), gw);
      expect_fp32_close(what + " dtype", ggt.values(), gt);
      expect_fp32_close(what + " dbeta", ggb.values(), gb);
      if (!some) {
        expect_fp32_close(what + " dpos", ggp.values(), gpv);
        expect_fp32_close(what + " dgamma", ggg.values(), gg);
      } else {
        EXPECT_EQ(ggp.values(), gp0) << what << ": dpos written though not given";
        EXPECT_EQ(ggg.values(), gg0) << what << ": dgamma written though not given";
      }
      EXPECT_TRUE(ggw.guards_intact() && ggp.guards_intact() && ggt.guards_intact() &&
                  ggg.guards_intact() && ggb.guards_intact())
          << what;
    }
}

// See the comment above expect_lowp_match: the adapter would stage every 16-bit tensor in fp32.
TEST(CudaPrecision, NativeKernelsNeedNoStaging) {
  PB_REQUIRE_CUDA_DEVICE();
  auto rng = make_rng(603);
  const DType t = DType::bf16;
  const int64_t rows = 4096, h = 1024, vocab = 64, positions = 64;
  const double copy = static_cast<double>(rows * h) * sizeof(float);  // one fp32 [rows, H]
  std::vector<int32_t> lens(64, 64);
  const HostLayout l = unpadded(lens, random_sample_ids(rng, lens.size()));
  DevLayout dl(l);
  Guarded16 x(t, {rows, h}, round16(t, random_floats(rng, rows * h))), out(t, {rows, h}),
      ln_in(t, {rows, h}), dx(t, {rows, h});
  DevBuf<float> bias({h}, random_floats(rng, h)), gamma({h}, random_floats(rng, h)),
      beta({h}, random_floats(rng, h)), mean({rows}), rstd({rows}),
      dbias({h}, random_floats(rng, h)), word({vocab, h}, random_floats(rng, vocab * h)),
      pos({positions, h}, random_floats(rng, positions * h)),
      type({2, h}, random_floats(rng, 2 * h));
  DevBuf<int32_t> tok({rows}, random_ints(rng, rows, 0, vocab - 1)),
      seg({rows}, random_ints(rng, rows, 0, 1));
  const Dropout d = lowp_dropout(true, rng(), DropoutSite::ffn_output, 1);
  const EmbeddingParams ep{word.tensor(), pos.tensor(), type.tensor(), gamma.tensor(),
                           beta.tensor()};
  auto used = [] {
    size_t free_b = 0, total_b = 0;
    cuda_ok(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return static_cast<double>(total_b - free_b);
  };
  {
    // Loads the kernels (lazy module loading allocates device memory of its own) on a small shape.
    auto warm = make_cuda_backend(0, CudaBackendOptions{});
    std::vector<int32_t> small = {3};
    const HostLayout sl = unpadded(small, random_sample_ids(rng, 1));
    DevLayout sdl(sl);
    Guarded16 sx(t, {3, h}, round16(t, random_floats(rng, 3 * h))), so(t, {3, h}), sln(t, {3, h}),
        sdx(t, {3, h});
    DevBuf<float> sm({3}), sr({3});
    DevBuf<int32_t> st({3}, {1, 2, 3}), ss({3}, {0, 1, 0});
    warm->residual_layernorm_forward(sdl.view(), sx.tensor(), bias.tensor(), Tensor(),
                                     {gamma.tensor(), beta.tensor()}, d, so.tensor(), sln.tensor(),
                                     sm.tensor(), sr.tensor());
    warm->residual_layernorm_backward(sdl.view(), so.tensor(), sln.tensor(), sm.tensor(),
                                      sr.tensor(), {gamma.tensor(), Tensor()}, d, sdx.tensor(),
                                      Tensor(), dbias.tensor(), {});
    warm->embedding_forward(sdl.view(), st.tensor(), ss.tensor(), ep, d, so.tensor(), sm.tensor(),
                            sr.tensor());
    cuda_synchronize(*warm);
  }
  auto gpu = make_cuda_backend(0, CudaBackendOptions{});
  cuda_synchronize(*gpu);
  double before = used();
  gpu->residual_layernorm_forward(dl.view(), x.tensor(), bias.tensor(), Tensor(),
                                  {gamma.tensor(), beta.tensor()}, d, out.tensor(),
                                  ln_in.tensor(), mean.tensor(), rstd.tensor());
  cuda_synchronize(*gpu);
  double grew = used() - before;
  std::printf("[lowp-error] residual_layernorm_forward staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 0.5 * copy) << "residual_layernorm_forward staged its bf16 tensors";
  before = used();
  gpu->residual_layernorm_backward(dl.view(), out.tensor(), ln_in.tensor(), mean.tensor(),
                                   rstd.tensor(), {gamma.tensor(), Tensor()}, d, dx.tensor(),
                                   Tensor(), dbias.tensor(), {});
  cuda_synchronize(*gpu);
  grew = used() - before;
  std::printf("[lowp-error] residual_layernorm_backward staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 1.5 * copy) << "residual_layernorm_backward staged its bf16 tensors";
  before = used();
  gpu->embedding_forward(dl.view(), tok.tensor(), seg.tensor(), ep, d, out.tensor(),
                         mean.tensor(), rstd.tensor());
  cuda_synchronize(*gpu);
  grew = used() - before;
  std::printf("[lowp-error] embedding_forward staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 0.5 * copy) << "embedding_forward staged its bf16 output";
  EXPECT_TRUE(out.guards_intact() && ln_in.guards_intact() && dx.guards_intact());
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaPrecision, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
