// gpu label: the whole model (src/model/bert.h) on the CUDA backend, with its arena in the
// backend's memory (Backend::alloc), against the CPU backend on the tiny config: one forward + backward
// with dropout on, in the unpadded and padded layouts; the loss and every parameter gradient;
// with either GELU.
//
// Tolerance: rel L2 <= 1e-4 per tensor (the bound). Both sides are fp32; the GPU sums
// in other orders (cuBLASLt tiles, tree reductions, online softmax), and the errors of ~1e-6
// per op compound through 2 layers forward and backward. The key bias, whose true gradient is
// zero, is measured against its layer's QKV bias gradient (model_test_util.h).
#include <gtest/gtest.h>

#include <iostream>

#include "kernels/common/philox.h"
#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include "../model/model_test_util.h"
#include "cuda_test_util.h"

namespace packbert::test {
namespace {

constexpr int kMaxSeqLen = 64;
constexpr double kModelTol = 1e-4;

StepOutput run_cuda_step(Backend& gpu, HostModel& m, const Batch& batch, int64_t global_masked,
                         int64_t global_samples, uint32_t step, uint64_t seed) {
  const int64_t total = m.table.total();
  DevBuf<float> params({total}, m.params), grads({total});
  gpu.zero(grads.tensor());
  StepOutput out;
  {
    Bert bert(m.config, gpu, params.tensor(), grads.tensor(), BertOptions{});
    out.result = bert.forward(batch, global_masked, global_samples, step, seed);
    bert.backward();
    gpu.synchronize();
  }
  EXPECT_TRUE(grads.guards_intact());
  EXPECT_TRUE(params.guards_intact());
  EXPECT_EQ(params.values(), m.params) << "the model changed its parameters";
  out.grads = grads.values();
  return out;
}

void check_tiny_bert(Gelu form, double tol) {
  auto rng = model_rng(101);
  auto cpu = make_cpu_backend();
  CudaBackendOptions o;
  o.sync_each_op = true;
  auto gpu = make_cuda_backend(0, o);
  BertConfig config = bert_preset("tiny");
  config.hidden_act = form;
  HostModel m(config, rng());
  std::vector<int> lengths = {5, kMaxSeqLen, 33, 1 + kMaxSeqLen / 2, 17, 6, 64, 40};
  const auto samples = model_samples(rng, lengths, 10, m.config.real_vocab_size);
  const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
  const auto step = static_cast<uint32_t>(rng() % kDropoutMaxStep);
  const uint64_t seed = rng();
  for (BatchLayout layout : {BatchLayout::unpadded, BatchLayout::padded}) {
    const Batch batch = make_batch(samples, layout, kMaxSeqLen);
    const StepOutput want = run_step(*cpu, m, {batch}, gm, gs, step, seed);
    const StepOutput got = run_cuda_step(*gpu, m, batch, gm, gs, step, seed);
    const std::string what = std::string("cuda vs cpu, ") + batch_layout_name(layout) +
                             (form == Gelu::tanh ? ", tanh GELU" : "");
    std::printf("[model-error] %s: loss %.6f vs %.6f\n", what.c_str(), got.result.loss,
                want.result.loss);
    ASSERT_TRUE(std::isfinite(got.result.loss));
    expect_measure(what + ": loss",
                   std::abs(got.result.loss - want.result.loss) / std::abs(want.result.loss), tol);
    // Counts of argmax == label: a near-tie may flip one token between backends.
    expect_measure(what + ": mlm correct count",
                   std::abs(static_cast<double>(got.result.mlm_correct - want.result.mlm_correct)),
                   1);
    expect_measure(what + ": nsp correct count",
                   std::abs(static_cast<double>(got.result.nsp_correct - want.result.nsp_correct)),
                   1);
    expect_grads_close(m.table, got.grads, want.grads, tol, what, with_nsp_floor(gs));
  }
}

TEST(CudaModel, TinyBertMatchesCpu) {
  PB_REQUIRE_CUDA_DEVICE();
  check_tiny_bert(Gelu::erf, kModelTol);
}

// model.hidden_act = "gelu_tanh": the MLP's GELU in cuBLASLt's GELU_AUX_BIAS / DGELU epilogues
// (H = 128, I = 512 take them), whose tanh may be the hardware approximation (relative error
// ~2^-11 per element, kGeluEpilogueTol of the ops test): 5e-3 here.
TEST(CudaModel, TinyBertTanhGeluMatchesCpu) {
  PB_REQUIRE_CUDA_DEVICE();
  check_tiny_bert(Gelu::tanh, 5e-3);
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaModel, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
