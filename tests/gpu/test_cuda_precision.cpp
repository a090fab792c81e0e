// gpu label: mixed precision on the CUDA backend, end to end (the ops one by one, convert
// included, are the op table's BackendOpsLowp.* cases, tests/ops/op_cases.cpp).
// - lamb_step's low-precision copy on the device equals round(master) and the master weights
//   equal the fp32 step's;
// - the tiny model's bf16 step (native cuBLASLt GEMMs in bf16 with fp32 accumulation, native
//   LayerNorm, embedding, gather and MLM-decoder kernels, the tensor-core attention, the adapter
//   elsewhere) against the CPU backend's bf16 emulation: the loss to 1e-2 relative, every
//   gradient by relative L2; and the padded layout against the unpadded one on the GPU.
//
// Tolerance: 3e-2 per tensor, the bf16-vs-fp32 bound of tests/model/test_model_precision.cpp.
// Both sides store bf16 but round at different points: cuBLASLt sums in other orders (a 1-ulp
// flip of a stored bf16 value is 4e-3 relative), the GPU takes GELU of the rounded
// pre-activation, and native attention kernels round P to bf16 before P V. Those are
// independent bf16-sized errors along the same ~50-store path, so the same derivation holds.
#include <gtest/gtest.h>

#include <iostream>

#include "kernels/common/philox.h"
#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "../model/model_test_util.h"
#include "kernels/common/lowp_convert.h"
#include "cuda_test_util.h"

namespace packbert::test {
namespace {

constexpr int kMaxSeqLen = 64;
// bf16's tolerances (derived in tests/model/test_model_precision.cpp): the loss, every gradient
// tensor, and twice that for the sums that cancel at initialisation (cancels_at_init).
constexpr double kLossTol = 1e-2;
constexpr double kGradTol = 3e-2;

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
  uint16_t* low = static_cast<uint16_t*>(cuda_alloc(n * 2));
  gpu->lamb_step(lamb_table(rows.data(), 3), cfg, dgn.tensor(), dw.tensor(), dg.tensor(),
                 dm.tensor(), dv.tensor(), dn.tensor(),
                 Tensor(low, DType::bf16, {n}, Device::cuda));
  cuda_synchronize(*gpu);
  const std::vector<float> gw = dw.values();
  const std::vector<uint16_t> gl = read16(low, n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(gl[static_cast<size_t>(i)], lowp::float_to_bf16(gw[static_cast<size_t>(i)])) << i;
  // The master weights are the CPU's fp32 step's to LAMB's GPU tolerance (the op table,
  // tests/ops/op_cases.cpp).
  std::vector<float> norms(6);
  float gnc = gn;
  cpu->lamb_step(lamb_table(rows.data(), 3), cfg, view(&gnc, {1}), view(w.data(), {n}),
                 view(g.data(), {n}), view(m.data(), {n}), view(v.data(), {n}),
                 view(norms.data(), {6}));
  expect_measure("lamb_step bf16 copy: master weights vs cpu", rel_l2(gw.data(), w.data(), n),
                 1e-6);
  cuda_free(low);
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
    Bert bert(m.config, gpu, params.tensor(), grads.tensor(), o);
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
    std::printf("[model-error] %s: loss %.6f vs %.6f\n", what.c_str(), got.result.loss,
                want.result.loss);
    ASSERT_TRUE(std::isfinite(got.result.loss));
    expect_measure(what + ": loss",
                   std::abs(got.result.loss - want.result.loss) / std::abs(want.result.loss),
                   kLossTol);
    GradCompare every_tensor = with_nsp_floor(gs, 2 * kGradTol);
    every_tensor.print_all = true;
    expect_grads_close(m.table, got.grads, want.grads, kGradTol, what, every_tensor);
    if (layout == BatchLayout::unpadded) {
      unpadded_gpu = got;
      // And against the fp32 reference.
      const StepOutput fp32 = run_step(*cpu, m, {batch}, gm, gs, step, seed);
      expect_grads_close(m.table, got.grads, fp32.grads, kGradTol, "cuda bf16 vs cpu fp32",
                         with_nsp_floor(gs, 2 * kGradTol));
    } else {
      const double e =
          std::abs(got.result.loss - unpadded_gpu.result.loss) / std::abs(unpadded_gpu.result.loss);
      expect_measure("cuda bf16 padded vs unpadded: loss", e, kLossTol);
      expect_grads_close(m.table, got.grads, unpadded_gpu.grads, kGradTol,
                         "cuda bf16 padded vs unpadded", with_nsp_floor(gs, 2 * kGradTol));
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
