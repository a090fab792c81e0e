// The equivalence invariant of DESIGN.md on the whole model, dropout on: one global batch gives
// the same loss and gradients in the unpadded, packed and padded layouts, split over micro-steps
// or ranks, and with the MLM decoder chunked -- the rank-equivalence core, without MPI.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/common/philox.h"
#include "model_test_util.h"

namespace packbert::test {
namespace {

constexpr int kMaxSeqLen = 64;

// Layouts: DESIGN.md's 1e-5 for layout equivalence on CPU fp32 (worst tensor over 200 seeds,
// tests/seed_sweeps.txt: 1.8e-6, margin 5.6).
constexpr double kLayoutTol = 1e-5;
// Splits: the same rows, summed in other groups (fp32 partial sums added by += or by the
// all-reduce) and GEMMs of other row counts. Every tensor but the sums that cancel at init
// (cancels_at_init) stays below 6.0e-7 (200 seeds, margin 3.3); those show the rounding at up
// to 2.1e-6 of their own norm (margin 4.9; e.g. cls.seq_relationship.weight: its two rows are
// sums over sequences of +-(p - y) * pooled, and at init every [CLS] pools to nearly the same
// vector, so the sum cancels to ~1/10 of its terms). 2e-6 for the rest, DESIGN.md's 1e-5 for
// those. The losses stay below 9.2e-8.
constexpr double kSplitTol = 2e-6;
constexpr double kCancellingTol = 1e-5;

void check_layouts(const BertConfig& config) {
  auto rng = model_rng(1);
  auto be = make_cpu_backend();
  HostModel m(config, rng());
  const auto samples = mixed_length_batch(rng, 12, m.config.real_vocab_size, kMaxSeqLen);
  const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
  const auto step = static_cast<uint32_t>(rng() % kDropoutMaxStep);
  const uint64_t seed = rng();

  const Batch unpadded = make_batch(samples, BatchLayout::unpadded, kMaxSeqLen);
  const Batch packed =
      make_batch(samples, BatchLayout::packed, kMaxSeqLen, pack_samples(samples, kMaxSeqLen));
  const Batch padded = make_batch(samples, BatchLayout::padded, kMaxSeqLen);
  ASSERT_GT(packed.num_seqs(), packed.rows / kMaxSeqLen) << "no pack holds two sequences";
  ASSERT_GT(padded.rows, unpadded.rows);
  // Packs as the loader hands them (indices into samples), filled in sample order, then
  // reversed: another pack assignment and sequence order than pack_online's.
  std::vector<std::vector<int32_t>> packs;
  int fill = kMaxSeqLen;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (fill + samples[i].length() > kMaxSeqLen || packs.back().size() == 3) {
      packs.emplace_back();
      fill = 0;
    }
    packs.back().push_back(static_cast<int32_t>(i));
    fill += samples[i].length();
  }
  std::reverse(packs.begin(), packs.end());
  const Batch packed_given = make_batch(samples, BatchLayout::packed, kMaxSeqLen, packs);

  const StepOutput want = run_step(*be, m, {unpadded}, gm, gs, step, seed);
  std::printf("loss %.6f (mlm %.4f / %lld masked, nsp %.4f / %lld)\n", want.result.loss,
              want.result.mlm_loss_sum, static_cast<long long>(gm), want.result.nsp_loss_sum,
              static_cast<long long>(gs));
  ASSERT_TRUE(std::isfinite(want.result.loss));
  const std::pair<const char*, const Batch*> others[] = {
      {"packed", &packed}, {"packed (loader packs)", &packed_given}, {"padded", &padded}};
  for (const auto& [name, batch] : others) {
    const StepOutput got = run_step(*be, m, {*batch}, gm, gs, step, seed);
    const double loss_err = rel(got.result.loss, want.result.loss);
    expect_measure(std::string(name) + " vs unpadded: loss", loss_err, kLayoutTol);
    EXPECT_EQ(got.result.mlm_correct, want.result.mlm_correct) << name;
    EXPECT_EQ(got.result.nsp_correct, want.result.nsp_correct) << name;
    expect_grads_close(m.table, got.grads, want.grads, kLayoutTol,
                       std::string(name) + " vs unpadded", with_nsp_floor(gs));
  }
}

TEST(ModelEquivalence, LayoutsGiveTheSameLossAndGradients) { check_layouts(bert_preset("tiny")); }

TEST(ModelEquivalence, ModernLayoutsGiveTheSameLossAndGradients) { check_layouts(modern_tiny()); }

TEST(ModelEquivalence, MicroStepsAndRanksAddUpToTheGlobalBatch) {
  auto rng = model_rng(2);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  auto samples = mixed_length_batch(rng, 11, m.config.real_vocab_size, kMaxSeqLen);
  const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
  const auto step = static_cast<uint32_t>(rng() % kDropoutMaxStep);
  const uint64_t seed = rng();
  const Batch all = make_batch(samples, BatchLayout::unpadded, kMaxSeqLen);
  const StepOutput whole = run_step(*be, m, {all}, gm, gs, step, seed);

  for (int parts : {2, 3}) {
    // A random assignment of samples to parts (uneven sizes), plus an empty micro-batch, as a
    // rank with fewer samples than micro-steps gets.
    std::shuffle(samples.begin(), samples.end(), rng);
    std::vector<std::vector<Sample>> split(parts);
    for (int p = 0; p < parts; ++p) split[p].push_back(samples[p]);
    for (size_t i = parts; i < samples.size(); ++i) split[rng() % parts].push_back(samples[i]);
    std::vector<Batch> batches;
    for (const auto& s : split) batches.push_back(make_batch(s, BatchLayout::unpadded, kMaxSeqLen));
    batches.push_back(make_batch({}, BatchLayout::unpadded, kMaxSeqLen));

    // Micro-steps: one gradient buffer, forward + backward per micro-batch.
    const StepOutput micro = run_step(*be, m, batches, gm, gs, step, seed);
    const std::string what = std::to_string(parts) + " micro-steps";
    expect_measure(what + ": loss", rel(micro.result.loss, whole.result.loss), kSplitTol);
    expect_grads_close(m.table, micro.grads, whole.grads, kSplitTol, what,
                       with_nsp_floor(gs, kCancellingTol));

    // Ranks: a gradient buffer each, then the all-reduce's plain fp32 sum.
    std::vector<float> sum(whole.grads.size(), 0.f);
    double loss = 0;
    for (const Batch& b : batches) {
      const StepOutput r = run_step(*be, m, {b}, gm, gs, step, seed);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += r.grads[i];
      loss += r.result.loss;
    }
    expect_measure(std::to_string(parts) + " ranks: loss", rel(loss, whole.result.loss), kSplitTol);
    expect_grads_close(m.table, sum, whole.grads, kSplitTol, std::to_string(parts) + " ranks",
                       with_nsp_floor(gs, kCancellingTol));
  }
}

TEST(ModelEquivalence, ChunkedMlmDecoderMatchesOneShot) {
  auto rng = model_rng(3);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  const auto samples = mixed_length_batch(rng, 8, m.config.real_vocab_size, kMaxSeqLen);
  const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
  const Batch b =
      make_batch(samples, BatchLayout::packed, kMaxSeqLen, pack_samples(samples, kMaxSeqLen));
  const StepOutput whole = run_step(*be, m, {b}, gm, gs, 7, 11);
  BertOptions chunked;
  chunked.mlm_chunk_rows = 1 + static_cast<int64_t>(rng() % 9);
  const StepOutput got = run_step(*be, m, {b}, gm, gs, 7, 11, chunked);
  // The decoder's input gradient is a sum over the 30528 vocabulary rows, and sgemm orders it
  // by the row count of the call (a one-row chunk takes OpenBLAS's gemv-like path): fp32
  // rounding of such sums differs by ~1e-6 relative (measured up to 3.9e-6 over 84 seeds on
  // tensors upstream; 4.1e-7 over the 200 of tests/seed_sweeps.txt), which kSplitTol (2e-6)
  // does not cover; the sums that cancel at init carry it at up to 7.3e-6 of their own norm (a
  // query bias). A wrong chunk offset or a missed chunk gives errors of order 1.
  constexpr double kDecoderChunkTol = 1e-5;
  std::printf("MLM chunk rows %lld\n", static_cast<long long>(chunked.mlm_chunk_rows));
  expect_measure("MLM chunked vs all: loss", rel(got.result.loss, whole.result.loss), kSplitTol);
  expect_grads_close(m.table, got.grads, whole.grads, kDecoderChunkTol, "MLM chunked vs all",
                     with_nsp_floor(gs, 5 * kDecoderChunkTol));
}

}  // namespace
}  // namespace packbert::test
