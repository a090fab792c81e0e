// The model's forward pass as a trainer uses it: the loss at initialisation, evaluation mode,
// the dropout keys, the activation arena and the errors of a misused model.
#include <gtest/gtest.h>

#include <cmath>

#include "model_test_util.h"

namespace packbert::test {
namespace {

TEST(ModelForward, LossAtInitIsLogVocabPlusLog2) {
  // With weights ~ N(0, 0.02) the logits are nearly equal: MLM ~ ln V (plus var(logit) / 2 ~
  // 0.02^2 * H / 2 = 0.026 for the tiny model), NSP ~ ln 2. MLM: the label logits, ~N(0,
  // 0.23^2), averaged over ~150 masked tokens (300 seeds: mean - ln V in -0.03 .. 0.07). NSP:
  // the pooled [CLS] vectors of a batch are nearly the same at init (same token, same
  // position), so the two-class logit difference d is shared by the batch and the mean loss
  // moves by (label imbalance) * d / 2, a product of two random variables with a heavy tail
  // (300 seeds: rms 0.0095, 99th percentile 0.039, max 0.056); 0.15 is ~16 rms.
  auto rng = model_rng(31);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  std::vector<int> lengths;
  for (int i = 0; i < 16; ++i) lengths.push_back(std::uniform_int_distribution<int>(20, 128)(rng));
  const auto samples = model_samples(rng, lengths, 20, m.config.real_vocab_size);
  const Batch b = make_batch(samples, BatchLayout::unpadded, 128);
  Bert bert(m.config, *be, m.params_view(), Tensor());
  ForwardOptions eval;
  eval.dropout = false;
  eval.gradients = false;
  const ForwardResult r = bert.forward(b, b.num_masked(), b.num_seqs(), 0, 0, eval);
  const double mlm = r.mlm_loss_sum / b.num_masked(), nsp = r.nsp_loss_sum / b.num_seqs();
  const double ln_v = std::log(static_cast<double>(m.config.vocab_size));
  std::printf("init loss %.4f = mlm %.4f (ln V %.4f) + nsp %.4f (ln 2 %.4f)\n", r.loss, mlm, ln_v,
              nsp, std::log(2.0));
  // The MLM loss at init is ln V plus half the logits' variance (0.026 here) give or take the
  // labels' own logits: over 200 seeds it strayed up to 0.054 from ln V + 0.026, so 0.2.
  expect_measure("init mlm loss - (ln V + 0.026)", std::abs(mlm - (ln_v + 0.026)), 0.2);
  expect_measure("init nsp loss - ln 2", std::abs(nsp - std::log(2.0)), 0.15);
  expect_measure("init loss - (ln V + 0.026 + ln 2)",
                 std::abs(r.loss - (ln_v + 0.026 + std::log(2.0))), 0.25);
  EXPECT_EQ(r.masked_tokens, b.num_masked());
  EXPECT_EQ(r.sequences, 16);
  EXPECT_LE(r.mlm_correct, r.masked_tokens);
}

// The logits hooks hand out exactly the logits the losses were computed from: recomputing
// cross-entropy and argmax from them in double gives the forward's sums, with decoder chunks.
TEST(ModelForward, LogitsHooksReproduceTheLosses) {
  auto rng = model_rng(35);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  const auto samples = model_samples(rng, {33, 64, 7, 50}, 9, m.config.real_vocab_size);
  const Batch b = make_batch(samples, BatchLayout::unpadded, 64);
  BertOptions chunked;
  chunked.mlm_chunk_rows = 5;  // several chunks, the last one partial
  Bert bert(m.config, *be, m.params_view(), Tensor(), chunked);
  const int64_t v = m.config.vocab_size;
  double mlm_sum = 0, nsp_sum = 0;
  int64_t mlm_ok = 0, nsp_ok = 0, rows_seen = 0, seqs_seen = 0;
  auto ce = [](const float* z, int64_t n, int64_t label, int64_t* ok) {
    int64_t arg = 0;
    double mx = z[0];
    for (int64_t j = 1; j < n; ++j)
      if (z[j] > mx) mx = z[j], arg = j;
    double se = 0;
    for (int64_t j = 0; j < n; ++j) se += std::exp(static_cast<double>(z[j]) - mx);
    *ok += arg == label;
    return mx + std::log(se) - z[label];
  };
  ForwardOptions eval;
  eval.dropout = false;
  eval.gradients = false;
  eval.mlm_logits = [&](int64_t first, const std::vector<float>& z, int64_t n) {
    EXPECT_EQ(first, rows_seen);
    ASSERT_EQ(static_cast<int64_t>(z.size()), n * v);
    for (int64_t i = 0; i < n; ++i)
      mlm_sum += ce(z.data() + i * v, v, b.masked_labels[static_cast<size_t>(first + i)], &mlm_ok);
    rows_seen += n;
  };
  eval.nsp_logits = [&](const std::vector<float>& z, int64_t s) {
    for (int64_t i = 0; i < s; ++i)
      nsp_sum += ce(z.data() + 2 * i, 2, b.nsp_labels[static_cast<size_t>(i)], &nsp_ok);
    seqs_seen += s;
  };
  const ForwardResult r = bert.forward(b, b.num_masked(), b.num_seqs(), 0, 0, eval);
  EXPECT_EQ(rows_seen, b.num_masked());
  EXPECT_EQ(seqs_seen, b.num_seqs());
  expect_measure("mlm loss sum from the hooks (rel)",
                 std::abs(mlm_sum - r.mlm_loss_sum) / std::abs(r.mlm_loss_sum), 1e-4);
  expect_measure("nsp loss sum from the hooks (rel)",
                 std::abs(nsp_sum - r.nsp_loss_sum) / std::abs(r.nsp_loss_sum), 1e-4);
  EXPECT_EQ(mlm_ok, r.mlm_correct);
  EXPECT_EQ(nsp_ok, r.nsp_correct);
  // With gradients on the logits become their gradient in place: the hooks are refused.
  std::vector<float> grads(m.params.size(), 0.f);
  Bert trainable(m.config, *be, m.params_view(), view(grads.data(), {m.table.total()}));
  eval.gradients = true;
  EXPECT_THROW(trainable.forward(b, b.num_masked(), b.num_seqs(), 0, 0, eval), Error);
}

TEST(ModelForward, EvaluationAndDropoutKeys) {
  auto rng = model_rng(32);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  const auto samples = model_samples(rng, {17, 40, 9}, 5, m.config.real_vocab_size);
  const Batch b = make_batch(samples, BatchLayout::packed, 64, pack_samples(samples, 64));
  std::vector<float> grads(m.params.size(), 0.f);
  Bert bert(m.config, *be, m.params_view(), view(grads.data(), {m.table.total()}));
  const int64_t gm = b.num_masked(), gs = b.num_seqs();

  // Without gradients nothing is accumulated, and backward() is refused.
  ForwardOptions no_grad;
  no_grad.gradients = false;
  const double train_loss = bert.forward(b, gm, gs, 5, 99, no_grad).loss;
  EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 0.f; }));
  EXPECT_THROW(bert.backward(), Error);
  // The same keys give the same loss; another step or seed other masks; no dropout none.
  EXPECT_EQ(bert.forward(b, gm, gs, 5, 99, no_grad).loss, train_loss);
  EXPECT_NE(bert.forward(b, gm, gs, 6, 99, no_grad).loss, train_loss);
  EXPECT_NE(bert.forward(b, gm, gs, 5, 98, no_grad).loss, train_loss);
  ForwardOptions eval = no_grad;
  eval.dropout = false;
  const double eval_loss = bert.forward(b, gm, gs, 5, 99, eval).loss;
  EXPECT_NE(eval_loss, train_loss);
  EXPECT_EQ(bert.forward(b, gm, gs, 1234, 7, eval).loss, eval_loss);

  // With gradients: forward + backward fills them; a second backward is refused.
  bert.forward(b, gm, gs, 5, 99);
  bert.backward();
  EXPECT_THROW(bert.backward(), Error);
  for (const ParamTensor& t : m.table.tensors()) {
    if (t.name.find("position_embeddings") != std::string::npos) continue;  // rows >= 40 unused
    EXPECT_GT(l2(grads.data() + t.offset, t.size), 0.0) << t.name;
  }
  // The loss is the normalised share: doubling the global counts halves it.
  const ForwardResult r = bert.forward(b, gm, gs, 5, 99, no_grad);
  const double halved = bert.forward(b, 2 * gm, 2 * gs, 5, 99, no_grad).loss;
  expect_measure("loss with doubled global counts vs half (rel)",
                 std::abs(halved - r.loss / 2) / r.loss, 1e-6);
  expect_measure("loss vs mlm sum / gm + nsp sum / gs (abs)",
                 std::abs(r.loss - (r.mlm_loss_sum / gm + r.nsp_loss_sum / gs)), 1e-12);
}

TEST(ModelForward, ArenaGrowsOnlyForLargerBatchesAndReportsItsHighWater) {
  auto rng = model_rng(33);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  std::vector<float> grads(m.params.size(), 0.f);
  Bert bert(m.config, *be, m.params_view(), view(grads.data(), {m.table.total()}));
  const auto big = model_samples(rng, {60, 61, 62, 63}, 8, m.config.real_vocab_size);
  const Batch large = make_batch(big, BatchLayout::padded, 64);
  const BatchShape shape = large.shape();
  bert.grow_for(shape);
  EXPECT_EQ(bert.activation_report().allocations, 1);
  EXPECT_GE(bert.activation_report().capacity, bert.activation_bytes(shape));
  for (int i = 0; i < 3; ++i) {
    std::vector<int> lengths = {std::uniform_int_distribution<int>(5, 64)(rng), 7};
    const auto s = model_samples(rng, lengths, 8, m.config.real_vocab_size);
    const Batch b = make_batch(s, BatchLayout::unpadded, 64);
    bert.forward(b, b.num_masked(), b.num_seqs(), i, 1);
    bert.backward();
  }
  EXPECT_EQ(bert.activation_report().allocations, 1) << "a smaller batch reallocated the arena";
  bert.forward(large, large.num_masked(), large.num_seqs(), 9, 1);
  bert.backward();
  EXPECT_EQ(bert.activation_report().allocations, 1);
  EXPECT_EQ(bert.activation_report().peak_bytes, bert.activation_bytes(shape));
  // Per token, the tiny model keeps about L * (8H + 2I) + 6H floats (~17 KB) plus the heads.
  const double per_row = static_cast<double>(bert.activation_bytes(shape)) / large.rows;
  std::printf("arena %.2f MiB for %lld rows (%.1f KB / row)\n",
              bert.activation_report().peak_bytes / 1048576.0, static_cast<long long>(large.rows),
              per_row / 1024);
  EXPECT_GT(per_row, 4.0 * (2 * (8 * 128 + 2 * 512) + 6 * 128));
}

TEST(ModelForward, BackwardAnnouncesEachTensorOnceWhenItsGradientIsFinal) {
  auto rng = model_rng(36);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  const auto samples = model_samples(rng, {30, 12, 50}, 6, m.config.real_vocab_size);
  const Batch b = make_batch(samples, BatchLayout::packed, 64, pack_samples(samples, 64));
  std::vector<float> grads(m.params.size(), 0.f);
  Bert bert(m.config, *be, m.params_view(), view(grads.data(), {m.table.total()}));
  const auto& tensors = m.table.tensors();
  for (const Batch& batch : {b, make_batch({}, BatchLayout::packed, 64)}) {
    std::vector<int> order;
    std::vector<std::vector<float>> at_ready(tensors.size());
    bert.forward(batch, 100, 10, 3, 4);
    bert.backward([&](int i) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, static_cast<int>(tensors.size()));
      order.push_back(i);
      at_ready[i].assign(grads.begin() + tensors[i].offset,
                         grads.begin() + tensors[i].offset + tensors[i].size);
    });
    ASSERT_EQ(order.size(), tensors.size());
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], static_cast<int>(i));
    // Heads first, embeddings (word embeddings) last; nothing changed after its announcement.
    EXPECT_EQ(tensors[order.front()].name.rfind("cls.", 0), 0u) << tensors[order.front()].name;
    EXPECT_EQ(tensors[order.back()].name, "bert.embeddings.word_embeddings.weight");
    for (size_t i = 0; i < tensors.size(); ++i)
      EXPECT_TRUE(
          std::equal(at_ready[i].begin(), at_ready[i].end(), grads.begin() + tensors[i].offset))
          << tensors[i].name << " changed after it was announced";
  }
}

TEST(ModelForward, EmptyBatchAddsNothing) {
  auto rng = model_rng(34);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  std::vector<float> grads(m.params.size(), 0.f);
  Bert bert(m.config, *be, m.params_view(), view(grads.data(), {m.table.total()}));
  const ForwardResult r = bert.forward(make_batch({}, BatchLayout::packed, 128), 10, 4, 0, 0);
  bert.backward();
  EXPECT_EQ(r.loss, 0.0);
  EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 0.f; }));
}

// defer_metrics leaves the sums on the device; deferred_results() returns, in call order, what
// the same calls return without it (bit for bit: the same ops into another slot), across more
// deferred calls than the first slot allocation holds, with an immediate forward and an empty
// batch in between; and the list starts empty again.
TEST(ModelForward, DeferredMetricsEqualImmediateOnes) {
  auto rng = model_rng(37);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  Bert bert(m.config, *be, m.params_view(), Tensor());
  std::vector<Batch> batches;
  for (int i = 0; i < 3; ++i) {
    const auto samples = model_samples(rng, {20 + 9 * i, 41, 7}, 6, m.config.real_vocab_size);
    batches.push_back(make_batch(samples, BatchLayout::unpadded, 64));
  }
  batches.push_back(make_batch({}, BatchLayout::unpadded, 64));
  ForwardOptions now;
  now.gradients = false;  // dropout on: each call's step key gives other losses
  ForwardOptions later = now;
  later.defer_metrics = true;
  const int calls = 21;
  auto run = [&](int i, const ForwardOptions& o) {
    const Batch& b = batches[static_cast<size_t>(i) % batches.size()];
    return bert.forward(b, 60 + i, 9 + i, static_cast<uint32_t>(i), 5, o);
  };
  std::vector<ForwardResult> want;
  for (int i = 0; i < calls; ++i) want.push_back(run(i, now));
  EXPECT_TRUE(bert.deferred_results().empty());
  for (int i = 0; i < calls; ++i) {
    const ForwardResult r = run(i, later);
    EXPECT_EQ(r.loss, 0.0);  // only the host's counts
    EXPECT_EQ(r.masked_tokens, want[static_cast<size_t>(i)].masked_tokens);
    if (i == 10) {
      EXPECT_EQ(run(2, now).loss, want[2].loss);  // slot 0 leaves the others alone
    }
  }
  const std::vector<ForwardResult> got = bert.deferred_results();
  ASSERT_EQ(got.size(), static_cast<size_t>(calls));
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].loss, want[i].loss) << i;
    EXPECT_EQ(got[i].mlm_loss_sum, want[i].mlm_loss_sum) << i;
    EXPECT_EQ(got[i].nsp_loss_sum, want[i].nsp_loss_sum) << i;
    EXPECT_EQ(got[i].mlm_correct, want[i].mlm_correct) << i;
    EXPECT_EQ(got[i].nsp_correct, want[i].nsp_correct) << i;
    EXPECT_EQ(got[i].sequences, want[i].sequences) << i;
    if (i % batches.size() != batches.size() - 1) {
      EXPECT_GT(got[i].loss, 0.0) << i;  // every batch but the empty one has a loss
    }
  }
  EXPECT_TRUE(bert.deferred_results().empty());
}

TEST(ModelForward, MisuseIsAClearError) {
  auto rng = model_rng(35);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  auto samples = model_samples(rng, {12, 30}, 4, m.config.real_vocab_size);
  std::vector<float> grads(m.params.size(), 0.f);
  Bert bert(m.config, *be, m.params_view(), view(grads.data(), {m.table.total()}));
  auto message = [&](const Batch& b, int64_t gm, int64_t gs) {
    try {
      bert.forward(b, gm, gs, 0, 0);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Batch b = make_batch(samples, BatchLayout::unpadded, 64);
  EXPECT_NE(message(b, 1, 2).find("global counts"), std::string::npos);
  samples[1].input_ids[3] = static_cast<int32_t>(m.config.real_vocab_size);  // a padding row id
  EXPECT_NE(message(make_batch(samples, BatchLayout::unpadded, 64), 100, 2).find("token id 30522"),
            std::string::npos);
  samples[1].input_ids[3] = 5;
  samples[0].masked_lm_ids[0] = -1;
  EXPECT_NE(message(make_batch(samples, BatchLayout::unpadded, 64), 100, 2).find("label -1"),
            std::string::npos);
  BertConfig short_positions = m.config;
  short_positions.max_position_embeddings = 16;
  HostModel s(short_positions, 1);
  Bert bert16(s.config, *be, s.params_view(), Tensor());
  ForwardOptions eval;
  eval.gradients = false;
  EXPECT_THROW(bert16.forward(make_batch(samples, BatchLayout::unpadded, 64), 100, 2, 0, 0, eval),
               Error);
  Bert no_grads(m.config, *be, m.params_view(), Tensor());
  EXPECT_THROW(no_grads.forward(b, 100, 2, 0, 0), Error);  // gradients without a buffer
  std::vector<float> wrong(10);
  EXPECT_THROW(Bert(m.config, *be, view(wrong.data(), {10}), Tensor()), Error);
}

}  // namespace
}  // namespace packbert::test
