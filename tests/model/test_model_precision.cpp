// Mixed precision (BertOptions::precision) on the CPU backend, whose bf16 / f16 path emulates
// the storage exactly (widen, fp32 op, round to nearest even: kernels/cpu/cpu_lowp.h):
// - bf16 and fp16 against fp32: the loss and every gradient, dropout on;
// - the equivalence invariant inside one precision: layouts, MST chunk counts, layer
//   recomputation;
// - fp16 loss scaling: a scaled step's gradient, unscaled, is the unscaled one's; the trainer's
//   scaler halves the scale and skips on overflow and doubles it after N clean steps;
// - LAMB's low-precision weight copy equals round(master) after each step; the loss-scale
//   division is exact; fp32 stays bit for bit what it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/lowp_convert.h"
#include "kernels/common/philox.h"
#include "model_test_util.h"
#include "optim/lamb.h"
#include "optim/loss_scaler.h"
#include "train/trainer.h"
#include "trainer_test_util.h"

namespace packbert::test {
namespace {

constexpr int kMaxSeqLen = 64;

// Tolerances, derived. A value stored in bf16 carries a relative rounding error uniform in
// +-2^-9 (RMS 2^-9 / sqrt(3) = 1.1e-3); f16 in +-2^-12 (RMS 1.4e-4), 8x less. A gradient of
// the tiny model (2 layers) is a product of stored tensors that went through about 10 stores
// per layer forward and backward plus the heads' ~10 and the weight copy: N ~ 50 independent
// roundings on its path, which add in quadrature: sqrt(50) x 1.1e-3 = 8e-3 for bf16 (1e-3 for
// f16), so 3e-2 for bf16 and 5e-3 for f16 leave ~4x. Over 100 seeds (tests/seed_sweeps.txt)
// every tensor but the sums that cancel at init stayed below 6.8e-3 (bf16) and 9.1e-4 (f16),
// margins 4.4 and 5.5.
// Those sums (cancels_at_init: attention's query and key gradients, a softmax gradient
// P (dP - rowsum(P dP)) of a nearly uniform P, and the NSP head's) are small remainders of their
// terms, whose rounding does not cancel: they reached 1.7e-2 (bf16, a query bias) and 2.1e-3
// (f16) in two sweeps of 100 seeds, and are held to twice the bar (margins 3.5 and 4.8). A real bug
// (a wrong rounding, a dtype read as another, a lost accumulation) gives errors of order 1e-1 and
// above. The loss is a sum over many tokens whose roundings average out: measured worst 3.1e-5
// (bf16) and 5.2e-6 (f16) against DESIGN.md's 1e-2.
constexpr double kLossTol = 1e-2;
double grad_tol(Precision p) { return p == Precision::bf16 ? 3e-2 : 5e-3; }
// Inside one precision, layouts and MST chunkings compute every stored activation by the same
// ops from its own row (or sequence), but not always with the same bits: OpenBLAS's sgemm sums
// in an order that depends on the row count of the call (another MST chunk or layout: up to
// half of a GEMM's outputs differ in their last fp32 bit), and once in a while such a
// difference flips the rounding of a stored bf16 / f16 value. A flip is a change of 2^-8 (bf16)
// of that value, which moves every value downstream of it by far more than fp32 rounding, and
// so flips further roundings: one flip in a forward cascades through its sequence and the
// backward. The two runs then differ by a sizeable share of the precision's own rounding noise
// (seed 5703234033710840029: M = 2 against M = 1 differed by 1.4e-3 on the encoder's
// gradients, where bf16 against fp32 differs by 6e-3, and by 3e-7 in fp32). So the gradients
// are held to the precision's tolerance against fp32 (grad_tol), which covers two runs' worth
// of that noise; a wrong row, chunk or dropout mask is an error of order 1e-1 and above. The
// loss, a sum over many tokens, moves far less: 1e-3 (worst 4.6e-6 over 100 seeds).
constexpr double kSamePrecisionLossTol = 1e-3;

// One global batch, its three layouts, a dropout key.
struct Case {
  HostModel model;
  std::vector<Sample> samples;
  int64_t gm = 0, gs = 0;
  uint32_t step = 0;
  uint64_t seed = 0;
  Case(std::mt19937_64& rng, int n, const BertConfig& config = bert_preset("tiny"))
      : model(config, rng()),
        samples(mixed_length_batch(rng, n, model.config.real_vocab_size, kMaxSeqLen)),
        gm(masked_count(samples)),
        gs(static_cast<int64_t>(samples.size())),
        step(static_cast<uint32_t>(rng() % kDropoutMaxStep)),
        seed(rng()) {}
  Batch batch(BatchLayout l) const {
    return make_batch(samples, l, kMaxSeqLen, pack_samples(samples, kMaxSeqLen));
  }
  // Every NSP label 1. The NSP head's gradients (cls.seq_relationship.*, bert.pooler.dense.*)
  // are sums over the sequences of terms carrying the sign of (p - label); at init p ~ 0.5, so
  // a batch with balanced labels cancels them to a small fraction of their terms, while the
  // terms' rounding errors do not cancel: their relative error then says nothing about the
  // precision (measured up to 3.9e-2 in bf16 for one seed in 60). With one label the terms
  // share their sign. Used where a low precision is compared with fp32.
  void same_nsp_labels() {
    for (Sample& x : samples) x.next_sentence_label = 1;
  }
  StepOutput run(Backend& be, const Batch& b, const BertOptions& o) {
    return run_step(be, model, {b}, gm, gs, step, seed, o);
  }
  // One step with the loss scaled by `scale` (fp16's loss scaling), gradients divided back
  // (exact: a power of two).
  StepOutput run_scaled(Backend& be, const Batch& b, const BertOptions& o, float scale) {
    StepOutput out;
    out.grads.assign(model.params.size(), 0.f);
    Bert bert(model.config, be, model.params_view(), view(out.grads.data(), {model.table.total()}),
              o);
    ForwardOptions fo;
    fo.loss_scale = scale;
    out.result = bert.forward(b, gm, gs, step, seed, fo);
    bert.backward();
    for (float& g : out.grads) g /= scale;
    return out;
  }
};

// fp16 runs with loss scaling, as the trainer runs it: without it the smallest activation
// gradients (attention's, ~1e-6 at init) fall below f16's 2^-24 and flush to zero (measured:
// 5e-2 relative error on the query bias unscaled, 1.5e-3 with a scale of 1024).
constexpr float kFp16Scale = 1024.f;
float scale_for(Precision p) { return p == Precision::fp16 ? kFp16Scale : 1.f; }

class PrecisionVsFp32 : public ::testing::TestWithParam<Precision> {};

TEST_P(PrecisionVsFp32, LossAndEveryGradient) {
  const Precision p = GetParam();
  auto rng = model_rng(11 + static_cast<uint64_t>(p));
  auto be = make_cpu_backend();
  Case c(rng, 12);
  c.same_nsp_labels();
  const Batch b = c.batch(BatchLayout::unpadded);
  const StepOutput want = c.run(*be, b, precision_options(Precision::fp32));
  const StepOutput got = c.run_scaled(*be, b, precision_options(p), scale_for(p));
  const std::string what = std::string(precision_name(p)) + " vs fp32";
  expect_loss_close(got, want, kLossTol, what);
  expect_grads_close(c.model.table, got.grads, want.grads, grad_tol(p), what,
                     with_nsp_floor(c.gs, 2 * grad_tol(p)));
  // The emulation is deterministic: the same step again gives the same bits.
  const StepOutput again = c.run_scaled(*be, b, precision_options(p), scale_for(p));
  EXPECT_EQ(again.result.loss, got.result.loss);
  EXPECT_EQ(0, std::memcmp(again.grads.data(), got.grads.data(), got.grads.size() * 4));
}

// ModernBERT's options (modern_tiny: 4 layers, twice the tiny model's roundings on a path) in
// bf16 and fp16 against fp32, the gradients at twice BERT's bar: over 1000 seeds
// (tests/seed_sweeps.txt) the worst tensor was 1.07e-2 in bf16 and 1.36e-3 in fp16, against
// 6e-2 and 1e-2 here (margins 5.6 and 7.3); the loss 4.8e-5 and 5.8e-6 against 1e-2.
TEST_P(PrecisionVsFp32, ModernOptionsLossAndEveryGradient) {
  const Precision p = GetParam();
  auto rng = model_rng(31 + static_cast<uint64_t>(p));
  auto be = make_cpu_backend();
  Case c(rng, 12, modern_tiny());
  const Batch b = c.batch(BatchLayout::unpadded);
  const StepOutput want = c.run(*be, b, precision_options(Precision::fp32));
  const StepOutput got = c.run_scaled(*be, b, precision_options(p), scale_for(p));
  const std::string what = std::string("modern ") + precision_name(p) + " vs fp32";
  expect_loss_close(got, want, kLossTol, what);
  expect_grads_close(c.model.table, got.grads, want.grads, 2 * grad_tol(p), what,
                     with_nsp_floor(c.gs, 2 * grad_tol(p)));
}

TEST_P(PrecisionVsFp32, LayoutsAgreeWithinThePrecision) {
  const Precision p = GetParam();
  auto rng = model_rng(21 + static_cast<uint64_t>(p));
  auto be = make_cpu_backend();
  Case c(rng, 10);
  const StepOutput want =
      c.run_scaled(*be, c.batch(BatchLayout::unpadded), precision_options(p), scale_for(p));
  for (BatchLayout l : {BatchLayout::packed, BatchLayout::padded}) {
    const StepOutput got = c.run_scaled(*be, c.batch(l), precision_options(p), scale_for(p));
    const std::string what =
        std::string(precision_name(p)) + " " + batch_layout_name(l) + " vs unpadded";
    expect_loss_close(got, want, kSamePrecisionLossTol, what);
    expect_grads_close(c.model.table, got.grads, want.grads, grad_tol(p), what,
                       with_nsp_floor(c.gs, 2 * grad_tol(p)));
  }
}

TEST_P(PrecisionVsFp32, MstChunksAndRecomputationAgreeWithinThePrecision) {
  const Precision p = GetParam();
  auto rng = model_rng(31 + static_cast<uint64_t>(p));
  auto be = make_cpu_backend();
  Case c(rng, 10);
  const Batch b = c.batch(BatchLayout::packed);
  const StepOutput want = c.run_scaled(*be, b, precision_options(p), scale_for(p));
  const std::pair<int64_t, Recompute> variants[] = {
      {2, Recompute::mlp}, {4, Recompute::mlp}, {3, Recompute::layer}, {1, Recompute::layer}};
  for (const auto& [m, r] : variants) {
    const StepOutput got = c.run_scaled(*be, b, precision_options(p, m, r), scale_for(p));
    const std::string what = std::string(precision_name(p)) + " M=" + std::to_string(m) +
                             " recompute " + recompute_name(r) + " vs M=1";
    expect_loss_close(got, want, kSamePrecisionLossTol, what);
    expect_grads_close(c.model.table, got.grads, want.grads, grad_tol(p), what,
                       with_nsp_floor(c.gs, 2 * grad_tol(p)));
  }
}

INSTANTIATE_TEST_SUITE_P(Model, PrecisionVsFp32,
                         ::testing::Values(Precision::bf16, Precision::fp16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(ModelPrecision, ArenaHoldsActivationsInSixteenBits) {
  auto rng = model_rng(41);
  auto be = make_cpu_backend();
  Case c(rng, 6);
  const BatchShape shape = c.batch(BatchLayout::unpadded).shape();
  std::vector<float> grads(c.model.params.size());
  Bert fp32(c.model.config, *be, c.model.params_view(),
            view(grads.data(), {c.model.table.total()}));
  Bert bf16(c.model.config, *be, c.model.params_view(), view(grads.data(), {c.model.table.total()}),
            precision_options(Precision::bf16));
  EXPECT_FALSE(fp32.weights().lowp().defined());
  ASSERT_TRUE(bf16.weights().lowp().defined());
  EXPECT_EQ(bf16.weights().lowp().dtype, DType::bf16);
  // The copy is round(master), element for element.
  const auto* low = static_cast<const uint16_t*>(bf16.weights().lowp().data);
  for (size_t i = 0; i < c.model.params.size(); ++i)
    ASSERT_EQ(low[i], lowp::float_to_bf16(c.model.params[i])) << i;
  // Token-wise buffers halve (to the carve's 256-byte alignment); the fp32 statistics, lse
  // and logits do not.
  const Batch b = c.batch(BatchLayout::unpadded);
  fp32.forward(b, c.gm, c.gs, c.step, c.seed);
  const ActivationReport r32 = fp32.activation_report();
  bf16.forward(b, c.gm, c.gs, c.step, c.seed);
  const ActivationReport r16 = bf16.activation_report();
  std::printf("activation bytes: fp32 %zu, bf16 %zu (%.2f)\n", r32.step_bytes, r16.step_bytes,
              static_cast<double>(r16.step_bytes) / static_cast<double>(r32.step_bytes));
  EXPECT_EQ(r16.step_bytes, bf16.activation_bytes(shape));
  EXPECT_LT(r16.step_bytes, r32.step_bytes);
  for (ActivationKind k :
       {ActivationKind::hidden, ActivationKind::mlp, ActivationKind::grad_scratch}) {
    const auto i = static_cast<size_t>(k);
    EXPECT_NEAR(static_cast<double>(r16.step_by_kind[i]),
                static_cast<double>(r32.step_by_kind[i]) / 2, 256.0 * 32)
        << activation_kind_name(k);
  }
  const auto logits = static_cast<size_t>(ActivationKind::mlm_logits);
  EXPECT_EQ(r16.step_by_kind[logits], r32.step_by_kind[logits]);
  EXPECT_EQ(parse_precision("fp16"), Precision::fp16);
  EXPECT_EQ(parse_precision("fp8"), Precision::fp8);
  EXPECT_NE(error_of([] { parse_precision("fp4"); }).find("fp4"), std::string::npos);
}

TEST(ModelPrecision, OpsRejectLowPrecisionWhereTheContractSaysFp32) {
  auto be = make_cpu_backend();
  std::vector<uint16_t> x(4 * 8), out(4 * 8), w(8 * 8);
  std::vector<uint16_t> bias16(8);
  const Tensor xv(x.data(), DType::bf16, {4, 8});
  const Tensor wv(w.data(), DType::bf16, {8, 8});
  const Tensor ov(out.data(), DType::bf16, {4, 8});
  const Tensor b16(bias16.data(), DType::bf16, {8});
  const std::string e = error_of([&] { be->linear_forward(xv, wv, b16, Epilogue::bias, ov, {}); });
  EXPECT_NE(e.find("linear_forward: bias"), std::string::npos) << e;
  EXPECT_NE(e.find("always f32"), std::string::npos) << e;
  std::vector<float> bias(8, 0.5f);
  std::vector<float> ones(4 * 8, 1.0f), wf(8 * 8, 0.25f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = lowp::float_to_bf16(ones[i]);
  for (size_t i = 0; i < w.size(); ++i) w[i] = lowp::float_to_bf16(wf[i]);
  be->linear_forward(xv, wv, view(bias.data(), {8}), Epilogue::bias, ov, {});
  for (uint16_t o : out) EXPECT_EQ(lowp::bf16_to_float(o), 2.5f);  // 8 * 0.25 + 0.5
}

// ---- fp16 loss scaling --------------------------------------------------------------------------

// A scaled fp16 step, unscaled, is the unscaled step's result (fp32's, which has no underflow)
// within fp16's tolerance, whatever the scale in the range that neither flushes nor overflows;
// and it is what scaling is for: closer to fp32 than fp16 without a scale.
TEST(ModelPrecision, ScaledFp16StepEqualsTheUnscaledOne) {
  auto rng = model_rng(51);
  auto be = make_cpu_backend();
  Case c(rng, 10);
  c.same_nsp_labels();
  const Batch b = c.batch(BatchLayout::unpadded);
  const StepOutput fp32 = c.run(*be, b, precision_options(Precision::fp32));
  const StepOutput plain = c.run_scaled(*be, b, precision_options(Precision::fp16), 1.f);
  const StepOutput s1k = c.run_scaled(*be, b, precision_options(Precision::fp16), 1024.f);
  const StepOutput s16k = c.run_scaled(*be, b, precision_options(Precision::fp16), 16384.f);
  EXPECT_EQ(s1k.result.loss, plain.result.loss);  // the loss itself is never scaled
  EXPECT_EQ(s16k.result.loss, plain.result.loss);
  const double tol = grad_tol(Precision::fp16);
  expect_loss_close(s1k, fp32, kLossTol, "fp16 scaled 2^10 vs fp32");
  const GradCompare nsp_floor = with_nsp_floor(c.gs, 2 * tol);
  const double e1k = expect_grads_close(c.model.table, s1k.grads, fp32.grads, tol,
                                        "fp16 scaled 2^10 vs fp32", nsp_floor)
                         .first;
  expect_grads_close(c.model.table, s16k.grads, fp32.grads, tol, "fp16 scaled 2^14 vs fp32",
                     nsp_floor);
  expect_grads_close(c.model.table, s16k.grads, s1k.grads, tol, "fp16 scaled 2^14 vs 2^10",
                     nsp_floor);
  double e_plain = 0;
  for (const ParamTensor& t : c.model.table.tensors())
    if (!is_key_bias(t.name) && t.name != "cls.seq_relationship.bias")
      e_plain = std::max(
          e_plain, rel_l2(plain.grads.data() + t.offset, fp32.grads.data() + t.offset, t.size));
  std::printf("[model-error] fp16 unscaled vs fp32: worst %.2e (scaled: %.2e)\n", e_plain, e1k);
  expect_measure("fp16 vs fp32, worst tensor: scaled 2^10 / unscaled", e1k / e_plain, 1.0);
}

TEST(LossScaler, HalvesOnOverflowDoublesAfterCleanSteps) {
  LossScalerOptions o;
  o.init_scale = 1000.f;  // rounded down to 512
  o.growth_interval = 3;
  o.min_scale = 1.f;
  o.max_scale = 2048.f;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 512.f);
  EXPECT_EQ(s.update(false), 256.f);
  EXPECT_EQ(s.update(true), 256.f);
  EXPECT_EQ(s.update(true), 256.f);
  EXPECT_EQ(s.update(true), 512.f);  // 3 clean steps
  EXPECT_EQ(s.state().clean_steps, 0);
  EXPECT_EQ(s.update(true), 512.f);
  EXPECT_EQ(s.update(false), 256.f);  // an overflow restarts the count
  EXPECT_EQ(s.state().clean_steps, 0);
  for (int i = 0; i < 20; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 2048.f);  // capped
  for (int i = 0; i < 20; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 1.f);  // floored
  LossScaler t(o);
  t.set_state({64.f, 2});
  EXPECT_EQ(t.update(true), 128.f);
  EXPECT_NE(error_of([&] { t.set_state({48.f, 0}); }).find("power of two"), std::string::npos);
}

// The trainer with fp16: an absurd initial scale overflows, every overflow skips the step
// (weights, LAMB's step count untouched) and halves the scale until steps run clean, after
// which growth_interval clean steps double it.
TEST(LossScaler, TrainerSkipsAndHalvesThenGrows) {
  cpu::set_num_threads(1);
  std::mt19937_64 rng(test_seed());
  StepBatch batch = random_step_batch(rng, 6, 1, 16, kMaxSeqLen, 8);
  TrainerOptions o = tiny_trainer_options(rng, kMaxSeqLen, 1e-3, 100);
  o.lr.num_warmup_steps = 1;
  o.bert.precision = Precision::fp16;
  o.loss_scaler.init_scale = 1073741824.f;  // 2^30: the fp16 gradients overflow
  o.loss_scaler.max_scale = 1073741824.f;
  o.loss_scaler.growth_interval = 2;
  Trainer trainer(MPI_COMM_WORLD, o);
  std::vector<float> before = trainer.params();
  int skipped = 0;
  int64_t s = 0;
  for (; s < 40; ++s) {
    batch.step = s;
    const float scale = trainer.loss_scaler_state().scale;
    const StepMetrics m = trainer.step(batch);
    EXPECT_EQ(m.loss_scale, scale);
    ASSERT_TRUE(std::isfinite(m.loss));
    if (!m.skipped) break;
    ++skipped;
    EXPECT_EQ(trainer.loss_scaler_state().scale, scale / 2) << "step " << s;
    EXPECT_EQ(trainer.lamb_steps_done(), 0);
    EXPECT_EQ(0, std::memcmp(before.data(), trainer.params().data(), before.size() * 4));
  }
  std::printf("fp16: %d overflowing steps, first clean scale %g\n", skipped,
              static_cast<double>(trainer.loss_scaler_state().scale));
  ASSERT_GT(skipped, 0);
  ASSERT_LT(s, 40) << "never a clean step";
  EXPECT_EQ(trainer.lamb_steps_done(), 1);
  EXPECT_NE(0, std::memcmp(before.data(), trainer.params().data(), before.size() * 4));
  const float clean_scale = trainer.loss_scaler_state().scale;
  EXPECT_EQ(trainer.loss_scaler_state().clean_steps, 1);
  batch.step = ++s;
  const StepMetrics m = trainer.step(batch);
  if (!m.skipped) {
    EXPECT_EQ(trainer.loss_scaler_state().scale, 2 * clean_scale);  // 2 clean steps
  }
  // The state round-trips for checkpoints; fp32 runs have none to set.
  trainer.set_loss_scaler_state({256.f, 1});
  EXPECT_EQ(trainer.loss_scaler_state().scale, 256.f);
}

// ---- LAMB's low-precision copy and loss-scale division --------------------------------------

struct LambCase {
  std::vector<LambTensor> rows;
  std::vector<float> w, g, m, v, norms;
  float gnorm = 0.f;
  LambConfig cfg;
  explicit LambCase(std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.f, 1.f);
    int64_t off = 0;
    for (int t = 0; t < 5; ++t) {
      const int64_t size = 1 + static_cast<int64_t>(rng() % 20000);
      rows.push_back({off, size, t % 2});
      off += size + static_cast<int64_t>(rng() % 3);  // gaps
    }
    w.resize(static_cast<size_t>(off));
    g.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = 0.05f * nd(rng);
      g[i] = 1e-3f * nd(rng);
    }
    m.assign(w.size(), 0.f);
    v.assign(w.size(), 0.f);
    norms.assign(2 * rows.size(), 0.f);
    double s = 0;
    for (float x : g) s += static_cast<double>(x) * x;
    gnorm = static_cast<float>(std::sqrt(s));
    cfg.lr = 1e-2f;
    cfg.step = 3;
    cfg.max_grad_norm = 0.5f * gnorm;  // clipping on
  }
  void step(Backend& be, const Tensor& lowp = {}, float scale = 1.f) {
    std::vector<float> gs = g;
    for (float& x : gs) x *= scale;
    float gn = gnorm * scale;
    LambConfig c = cfg;
    c.grad_scale = scale;
    const auto n = static_cast<int64_t>(w.size());
    be.lamb_step(lamb_table(rows.data(), static_cast<int64_t>(rows.size())), c, view(&gn, {1}),
                 view(w.data(), {n}), view(gs.data(), {n}), view(m.data(), {n}),
                 view(v.data(), {n}), view(norms.data(), {static_cast<int64_t>(norms.size())}),
                 lowp);
  }
};

TEST(PrecisionLamb, LowPrecisionCopyIsRoundedMaster) {
  auto be = make_cpu_backend();
  for (DType t : {DType::bf16, DType::f16}) {
    auto rng = model_rng(61 + static_cast<uint64_t>(t));
    LambCase a(rng);
    LambCase b = a;
    std::vector<uint16_t> low(a.w.size(), 0x7777);  // a marker outside the rows
    const Tensor lv(low.data(), t, {static_cast<int64_t>(low.size())});
    for (int s = 0; s < 3; ++s) {
      a.step(*be, lv);
      b.step(*be);
      // The master weights are those of the step without a copy, bit for bit.
      ASSERT_EQ(0, std::memcmp(a.w.data(), b.w.data(), a.w.size() * 4));
      std::vector<bool> in_row(a.w.size(), false);
      for (const LambTensor& r : a.rows)
        for (int64_t i = r.offset; i < r.offset + r.size; ++i)
          in_row[static_cast<size_t>(i)] = true;
      for (size_t i = 0; i < low.size(); ++i) {
        const uint16_t want = !in_row[i]         ? uint16_t{0x7777}
                              : t == DType::bf16 ? lowp::float_to_bf16(a.w[i])
                                                 : lowp::float_to_f16(a.w[i]);
        ASSERT_EQ(low[i], want) << dtype_name(t) << " element " << i << " step " << s;
      }
    }
  }
}

TEST(PrecisionLamb, LossScaleDividesOutExactly) {
  auto be = make_cpu_backend();
  auto rng = model_rng(71);
  LambCase a(rng);
  LambCase b = a;
  for (int s = 0; s < 3; ++s) {
    a.step(*be, {}, 1.f);
    b.step(*be, {}, 4096.f);  // a power of two: scaling and unscaling are exact
    ASSERT_EQ(0, std::memcmp(a.w.data(), b.w.data(), a.w.size() * 4)) << "step " << s;
    ASSERT_EQ(0, std::memcmp(a.m.data(), b.m.data(), a.m.size() * 4));
    ASSERT_EQ(0, std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4));
  }
}

TEST(PrecisionLamb, LambClassRefreshesTheModelsCopy) {
  auto rng = model_rng(81);
  auto be = make_cpu_backend();
  Case c(rng, 4);
  std::vector<float> grads(c.model.params.size(), 0.f);
  const Tensor gv = view(grads.data(), {c.model.table.total()});
  Bert bert(c.model.config, *be, c.model.params_view(), gv, precision_options(Precision::bf16));
  bert.forward(c.batch(BatchLayout::unpadded), c.gm, c.gs, c.step, c.seed);
  bert.backward();
  std::vector<LambParam> lp;
  for (const ParamTensor& t : c.model.table.tensors())
    lp.push_back({t.name, t.offset, t.size, t.no_decay});
  LrScheduleConfig lr;
  lr.base_lr = 1e-3;
  lr.max_steps = 10;
  lr.num_warmup_steps = 1;
  Lamb lamb(*be, lp, c.model.table.total(), LrSchedule(lr));
  const LambStepInfo info = lamb.step(c.model.params_view(), gv, bert.weights().lowp());
  ASSERT_FALSE(info.skipped);
  const auto* low = static_cast<const uint16_t*>(bert.weights().lowp().data);
  for (size_t i = 0; i < c.model.params.size(); ++i)
    ASSERT_EQ(low[i], lowp::float_to_bf16(c.model.params[i])) << i;
}

}  // namespace
}  // namespace packbert::test
