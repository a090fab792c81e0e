// gpu label: mixed precision on the CUDA backend.
// - convert: every bf16 / f16 pattern widened and narrowed back, and random floats narrowed,
//   bit for bit the host converters (common/lowp_convert.h, the CPU emulation's);
// - lamb_step's low-precision copy on the device equals round(master) and the master weights
//   equal the fp32 step's;
// - the tiny model's bf16 step (native cuBLASLt GEMMs in bf16 with fp32 accumulation, the
//   adapter elsewhere, the attention engineer's kernels for attention) against the CPU
//   backend's bf16 emulation: the loss to 1e-2 relative, every gradient by relative L2; and the
//   padded layout against the unpadded one on the GPU.
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
  constexpr double kTol = 1e-2;
  auto check = [&](const std::vector<float>& g, const std::vector<float>& c, const std::string& what) {
    const double e = rel_l2(g.data(), c.data(), static_cast<int64_t>(c.size()));
    std::printf("[model-error] %s %.2e\n", what.c_str(), e);
    EXPECT_LE(e, kTol) << what;
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
      for (Epilogue ep : {Epilogue::none, Epilogue::bias, Epilogue::bias_gelu}) {
        Lowp16 out(t, std::vector<float>(n * m), {n, m}), pre(t, std::vector<float>(n * m), {n, m});
        const bool gelu = ep == Epilogue::bias_gelu;
        const Tensor b = ep == Epilogue::none ? Tensor() : view(bias.data(), {m});
        const Tensor bd = ep == Epilogue::none ? Tensor() : dbias.tensor();
        cpu->linear_forward(x.cpu(), w.cpu(), b, ep, out.cpu(), gelu ? pre.cpu() : Tensor());
        gpu->linear_forward(x.gpu(), w.gpu(), bd, ep, out.gpu(), gelu ? pre.gpu() : Tensor());
        cuda_synchronize(*gpu);
        check(out.gpu_values(), out.cpu_values(),
              tag + " forward epilogue " + std::to_string(static_cast<int>(ep)));
        if (!gelu) continue;
        check(pre.gpu_values(), pre.cpu_values(), tag + " forward pre");
        // Backward through the GELU of this forward, dx accumulated, dw and db in fp32.
        Lowp16 dout(t, randn(rng, n * m, 1e-2f), {n, m}), dx(t, randn(rng, n * k), {n, k});
        const std::vector<float> dw0 = randn(rng, m * k, 1e-3f), db0 = randn(rng, m, 1e-3f);
        std::vector<float> dw = dw0, db = db0;
        DevBuf<float> ddw({m, k}, dw0), ddb({m}, db0);
        LinearBackwardOptions oc, og;
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

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaPrecision, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
