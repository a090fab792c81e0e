// The training step on one rank (no mpirun: MPI is not initialised, so the gradient all-reduce
// is a no-op, as in a bare `packbert train`): repeated LAMB steps on one small fixed global batch
// must make the loss fall substantially -- forward, backward, micro-step accumulation and the
// optimizer update all point the same way. Rank and layout equivalence are tests/mpi's job
// (mpi_train_driver + check_train.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "train/trainer.h"
#include "measure.h"
#include "test_util.h"

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

  TrainerOptions o;
  o.config = bert_preset("tiny");
  o.layout = BatchLayout::packed;
  o.max_seq_len = kMaxSeqLen;
  o.init_seed = rng();
  o.dropout_seed = rng();
  o.dropout = true;  // the real step: the loss must fall through the dropout noise too
  o.lr.base_lr = 2e-2;
  o.lr.max_steps = 30;
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
  expect_measure("1.2 nats / the loss drop over 30 steps", 1.2 / (loss.front() - loss.back()),
                 1.0);
  expect_measure("1 - MLM accuracy at step 30", 1 - last_mlm_accuracy, 0.2);
}

}  // namespace
}  // namespace packbert::test
