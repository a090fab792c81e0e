// The training step on one rank (no mpirun: MPI is not initialised, so the gradient all-reduce
// is a no-op, as in a bare `packbert train`): repeated LAMB steps on one small fixed global batch
// must make the loss fall substantially -- forward, backward, micro-step accumulation and the
// optimizer update all point the same way. Rank and layout equivalence are tests/mpi's job
// (mpi_train_driver + check_train.py).
#include <gtest/gtest.h>

#include <cmath>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/replica.h"
#include "train/batching.h"
#include "train/evaluate.h"
#include "train/evaluations.h"
#include "train/metrics.h"
#include "train/trainer.h"
#include "measure.h"
#include "test_util.h"
#include "trainer_test_util.h"

namespace packbert::test {
namespace {

constexpr int kMaxSeqLen = 64;

TEST(TrainStep, LossFallsOnAFixedBatch) {
  // One thread: the tiny model gains nothing from more, and ctest runs tests side by side on
  // few cores, where OpenMP barriers of oversubscribed threads cost more than the work.
  cpu::set_num_threads(1);
  std::mt19937_64 rng(test_seed());
  // 8 random samples in 2 micro-batches, packed by the batch itself.
  StepBatch batch = random_step_batch(rng, 8, 2, 16, kMaxSeqLen, 10);
  ASSERT_GT(batch.global_masked_tokens, 0);

  TrainerOptions o = tiny_trainer_options(rng, kMaxSeqLen, 2e-2, 30);
  o.layout = BatchLayout::packed;
  o.dropout = true;  // the real step: the loss must fall through the dropout noise too
  o.lr.num_warmup_steps = 3;
  Trainer trainer(MPI_COMM_WORLD, o);
  ASSERT_EQ(trainer.world_size(), 1);

  std::vector<double> loss;
  double last_mlm_accuracy = 0;
  for (int64_t s = 0; s < 30; ++s) {
    batch.step = s;  // a new dropout mask every step, as the loader's step count gives
    const StepMetrics m = trainer.step(batch);
    ASSERT_TRUE(std::isfinite(m.loss)) << "step " << s;
    ASSERT_EQ(m.samples, 8);
    loss.push_back(m.loss);
    last_mlm_accuracy = m.mlm_accuracy;
    std::printf("step %2lld loss %.4f mlm %.4f nsp %.4f mlm acc %.3f |g| %.3f lr %.2e\n",
                static_cast<long long>(s), m.loss, m.mlm_loss, m.nsp_loss, m.mlm_accuracy,
                m.grad_norm, m.lr);
  }
  // At init the loss is ~ln(30522) + ln(2) = 11.0 (uniform MLM and NSP predictions). The
  // model can memorise the batch's few dozen masked labels: over 200 seeds, 30 steps brought the
  // loss down by at least 3.82 nats and the MLM accuracy to at least 0.958 (dropout on). A
  // broken step (wrong sign, lost micro-step, no update, update of the wrong tensors) stays near
  // 11 and near 0. Held: a drop of 1.2 nats and an accuracy of 0.8 (margins 3.2 and 4.8).
  expect_measure("1.2 nats / the loss drop over 30 steps", 1.2 / (loss.front() - loss.back()), 1.0);
  expect_measure("1 - MLM accuracy at step 30", 1 - last_mlm_accuracy, 0.2);
}

// The losses of steps that do not read stay on the device and arrive with the next read
// (StepMetrics::earlier_losses) or with Trainer::read_losses: bit for bit the values a trainer
// that reads every step reports, an evaluation between unread steps notwithstanding, and the
// progress record over the interval is the same number.
TEST(TrainStep, UnreadLossesArriveWithTheNextRead) {
  cpu::set_num_threads(1);
  std::mt19937_64 rng(test_seed());
  StepBatch batch = random_step_batch(rng, 8, 2, 16, kMaxSeqLen, 10);
  TrainerOptions o = tiny_trainer_options(rng, kMaxSeqLen, 1e-2, 10);
  Trainer every(MPI_COMM_WORLD, o), unread(MPI_COMM_WORLD, o);
  EvalSet set;
  set.samples = random_step_batch(rng, 6, 1, 16, kMaxSeqLen, 10).micro_batches[0].samples;
  for (size_t i = 0; i < set.samples.size(); ++i) set.samples[i].id = static_cast<int64_t>(i);
  set.total = static_cast<int64_t>(set.samples.size());

  auto same = [](const StepLosses& l, const StepMetrics& m, int64_t step) {
    EXPECT_EQ(l.step, step);
    EXPECT_EQ(l.loss, m.loss) << "step " << step;
    EXPECT_EQ(l.mlm_loss, m.mlm_loss) << "step " << step;
    EXPECT_EQ(l.nsp_loss, m.nsp_loss) << "step " << step;
    EXPECT_EQ(l.mlm_accuracy, m.mlm_accuracy) << "step " << step;
    EXPECT_EQ(l.nsp_accuracy, m.nsp_accuracy) << "step " << step;
    EXPECT_EQ(l.masked_tokens, m.masked_tokens);
    EXPECT_EQ(l.samples, m.samples);
  };
  const ProgressAccumulator::Clock::time_point t0{};
  ProgressAccumulator acc_every(t0), acc_unread(t0);
  std::vector<StepMetrics> want;
  std::vector<StepLosses> arrived;
  for (int64_t s = 0; s < 6; ++s) {
    batch.step = s;
    const StepMetrics a = every.step(batch);
    const StepMetrics b = unread.step(batch, {}, /*read_back=*/s == 2);
    ASSERT_TRUE(a.read.losses);
    ASSERT_TRUE(std::isfinite(a.loss));
    EXPECT_TRUE(a.earlier_losses.empty());
    want.push_back(a);
    acc_every.add(a, batch);
    acc_unread.add(b, batch);
    EXPECT_EQ(b.read.losses, s == 2);
    if (s == 2) {
      EXPECT_EQ(b.loss, a.loss);
      EXPECT_EQ(b.mlm_accuracy, a.mlm_accuracy);
      arrived.insert(arrived.end(), b.earlier_losses.begin(), b.earlier_losses.end());
    } else {
      EXPECT_TRUE(std::isnan(b.loss)) << "step " << s;
      EXPECT_TRUE(b.earlier_losses.empty());
    }
    if (s == 3) {  // an evaluation between two unread steps
      const EvalResult ea =
          evaluate(MPI_COMM_WORLD, every.replica(), set, set.total, kMaxSeqLen, 0);
      const EvalResult eb =
          evaluate(MPI_COMM_WORLD, unread.replica(), set, set.total, kMaxSeqLen, 0);
      EXPECT_EQ(ea.mlm_loss, eb.mlm_loss);
    }
  }
  ASSERT_EQ(arrived.size(), 2u);
  const std::vector<StepLosses> rest = unread.read_losses();
  ASSERT_EQ(rest.size(), 3u);
  EXPECT_TRUE(unread.read_losses().empty()) << "losses read twice";
  for (const StepLosses& l : rest) acc_unread.add_losses(l);
  arrived.insert(arrived.end(), rest.begin(), rest.end());
  for (size_t k = 0; k < 5; ++k) {
    const size_t step = k < 2 ? k : k + 1;  // steps 0, 1 and 3, 4, 5 (2 read itself)
    same(arrived[k], want[step], static_cast<int64_t>(step));
  }
  ProgressContext at;
  at.max_steps = 6;
  const ProgressRecord ra = acc_every.close(at, t0 + std::chrono::seconds(1));
  const ProgressRecord rb = acc_unread.close(at, t0 + std::chrono::seconds(1));
  EXPECT_EQ(ra.loss, rb.loss);
  EXPECT_EQ(ra.mlm_loss, rb.mlm_loss);
  EXPECT_EQ(ra.nsp_loss, rb.nsp_loss);
  EXPECT_EQ(ra.mlm_accuracy, rb.mlm_accuracy);
  EXPECT_EQ(ra.nsp_accuracy, rb.nsp_accuracy);
  EXPECT_TRUE(std::isfinite(rb.loss));
}

// Evaluation between steps runs inside the arena the trainer reserved: it neither grows it nor
// moves the training report, and gives the same counts (and, up to summation order, the same
// losses) as a forward-only replica of the same weights with no arena limit.
TEST(TrainStep, EvaluationFitsTheReservedArenaAndLeavesItsReportAlone) {
  cpu::set_num_threads(1);
  std::mt19937_64 rng(test_seed());
  const StepBatch batch = random_step_batch(rng, 6, 1, 16, kMaxSeqLen, 10);
  TrainerOptions o;
  o.config = bert_preset("tiny");
  o.layout = BatchLayout::unpadded;
  o.max_seq_len = kMaxSeqLen;
  o.init_seed = rng();
  o.dropout_seed = rng();
  o.lr.max_steps = 1;
  // The reserve: the batch's own shape, as the planner's bound would give for one micro-batch.
  const Batch b = make_batch(batch.micro_batches[0].samples, BatchLayout::unpadded, kMaxSeqLen);
  o.reserve = b.shape();
  Trainer trainer(MPI_COMM_WORLD, o);
  Bert& bert = trainer.replica().bert();
  ASSERT_EQ(bert.activation_report().allocations, 1);
  trainer.step(batch);
  const ActivationReport before = trainer.activation_report();
  EXPECT_EQ(before.allocations, 1) << "the step grew the reserved arena";
  EXPECT_EQ(before.peak_bytes, bert.activation_bytes(o.reserve));

  // 40 evaluation samples, in forwards of up to 40: more than the reserve holds without
  // gradients, so evaluation must split them.
  EvalSet set;
  for (int k = 0; k < 5; ++k) {
    const StepBatch more = random_step_batch(rng, 8, 1, 8, kMaxSeqLen, 10);
    for (const Sample& x : more.micro_batches[0].samples) set.samples.push_back(x);
  }
  for (size_t i = 0; i < set.samples.size(); ++i) set.samples[i].id = static_cast<int64_t>(i);
  set.total = static_cast<int64_t>(set.samples.size());
  const Batch all = make_batch(set.samples, BatchLayout::unpadded, kMaxSeqLen);
  // What training reserved, which evaluation runs within (train/evaluations.h eval_limits).
  const std::optional<BertMemory> limits = eval_limits(trainer.replica(), trainer.options());
  ASSERT_TRUE(limits.has_value());
  const size_t limit = limits->arena;
  ASSERT_GT(bert.activation_bytes(all.shape(), /*gradients=*/false), limit)
      << "the test needs an evaluation batch larger than the reserve";
  const EvalResult in_training =
      evaluate(MPI_COMM_WORLD, trainer.replica(), set, set.total, kMaxSeqLen, &*limits);
  const ActivationReport after = trainer.activation_report();
  EXPECT_EQ(after.allocations, 1) << "evaluation grew the training arena";
  EXPECT_EQ(after.capacity, before.capacity);
  EXPECT_EQ(after.peak_bytes, before.peak_bytes) << "evaluation moved the training peak";
  EXPECT_EQ(after.step_bytes, before.step_bytes);

  ReplicaOptions ro;
  ro.config = o.config;
  ro.gradients = false;
  ModelReplica alone(ro);
  EXPECT_FALSE(alone.has_gradients());
  alone.load_params(trainer.params().data());
  const EvalResult whole = evaluate(MPI_COMM_WORLD, alone, set, set.total, kMaxSeqLen, nullptr);
  EXPECT_GT(alone.bert().activation_report().peak_bytes, limit) << "one forward of all 40";
  EXPECT_EQ(whole.samples, set.total);
  EXPECT_EQ(in_training.samples, set.total);
  EXPECT_EQ(in_training.masked_tokens, whole.masked_tokens);
  EXPECT_EQ(in_training.mlm_accuracy, whole.mlm_accuracy);
  EXPECT_EQ(in_training.nsp_accuracy, whole.nsp_accuracy);
  // The loss sums differ only in fp32 summation order: each forward sums <= 40 * 10 masked
  // token losses of ~10 nats in float, rel. error ~ n * 2^-24 ~ 2.4e-5 at worst, far above what
  // a dropped or repeated sample would leave (>= 1 / 40 of the sum).
  expect_measure("evaluation split vs whole: mlm loss (rel)",
                 std::abs(in_training.mlm_loss - whole.mlm_loss) / whole.mlm_loss, 1e-4);
  expect_measure("evaluation split vs whole: nsp loss (rel)",
                 std::abs(in_training.nsp_loss - whole.nsp_loss) / whole.nsp_loss, 1e-4);
}

}  // namespace
}  // namespace packbert::test
