// make_batch: the three layouts place every token, [CLS] row, masked row and label where the
// model expects them, and bad samples or packs are errors naming the sample.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>

#include "model/bert_memory.h"
#include "model/fp8.h"
#include "model_test_util.h"

namespace packbert::test {
namespace {

// Every sequence's tokens, masked labels and NSP label as read back from the batch, by id.
struct SeqView {
  std::vector<int32_t> ids, segs, masked_pos, masked_labels;
  int nsp = -1;
};

std::map<int64_t, SeqView> read_back(const Batch& b) {
  std::map<int64_t, SeqView> out;
  for (int64_t s = 0; s < b.num_seqs(); ++s) {
    SeqView& v = out[b.sample_id[s]];
    for (int32_t p = 0; p < b.seq_len[s]; ++p) {
      const int64_t r = b.seq_start[s] + p;
      EXPECT_EQ(b.token_seq[r], s);
      EXPECT_EQ(b.token_pos[r], p);
      v.ids.push_back(b.input_ids[r]);
      v.segs.push_back(b.segment_ids[r]);
    }
    v.nsp = b.nsp_labels[s];
  }
  for (int64_t i = 0; i < b.num_masked(); ++i) {
    const int64_t r = b.masked_rows[i];
    const int32_t s = b.token_seq[r];
    EXPECT_GE(s, 0) << "masked row " << r << " is padding";
    SeqView& v = out[b.sample_id[s]];
    v.masked_pos.push_back(b.token_pos[r]);
    v.masked_labels.push_back(b.masked_labels[i]);
  }
  return out;
}

TEST(ModelBatch, EveryLayoutHoldsTheSamples) {
  auto rng = model_rng(21);
  std::vector<int> lengths;
  for (int i = 0; i < 9; ++i) lengths.push_back(std::uniform_int_distribution<int>(5, 40)(rng));
  const auto samples = model_samples(rng, lengths, 6, 30522);
  int64_t tokens = 0;
  for (const Sample& s : samples) tokens += s.length();
  for (BatchLayout layout : {BatchLayout::unpadded, BatchLayout::packed, BatchLayout::padded}) {
    const Batch b = make_batch(samples, layout, 40, pack_samples(samples, 40));
    SCOPED_TRACE(batch_layout_name(layout));
    EXPECT_EQ(b.num_seqs(), 9);
    EXPECT_EQ(b.num_tokens(), tokens);
    EXPECT_EQ(b.num_masked(), masked_count(samples));
    EXPECT_EQ(b.max_len, *std::max_element(lengths.begin(), lengths.end()));
    if (layout == BatchLayout::unpadded) {
      EXPECT_EQ(b.rows, tokens);
    } else if (layout == BatchLayout::padded) {
      EXPECT_EQ(b.rows, 9 * 40);
    } else {
      EXPECT_EQ(b.rows % 40, 0);
      // Packing saves a row of 40 exactly when some two sequences fit in one: then the two
      // shortest do, and the packer (longest first, each into the first pack with room) puts
      // the shorter beside the longer. Random lengths in 5..40 all above 20 (0.5% of draws)
      // leave nothing to pack.
      std::vector<int> sorted = lengths;
      std::sort(sorted.begin(), sorted.end());
      if (sorted[0] + sorted[1] <= 40)
        EXPECT_LT(b.rows, 9 * 40);
      else
        EXPECT_EQ(b.rows, 9 * 40);
    }
    int64_t padding = 0;
    for (int64_t r = 0; r < b.rows; ++r)
      if (b.token_seq[r] < 0) {
        ++padding;
        EXPECT_EQ(b.input_ids[r], 0);
        EXPECT_EQ(b.token_pos[r], 0);
      }
    EXPECT_EQ(padding, b.rows - tokens);
    const auto seqs = read_back(b);
    for (const Sample& s : samples) {
      const SeqView& v = seqs.at(s.id);
      EXPECT_EQ(v.ids, s.input_ids);
      EXPECT_EQ(v.segs, std::vector<int32_t>(s.segment_ids.begin(), s.segment_ids.end()));
      EXPECT_EQ(v.masked_pos, s.masked_lm_positions);
      EXPECT_EQ(v.masked_labels, s.masked_lm_ids);
      EXPECT_EQ(v.nsp, s.next_sentence_label);
    }
    // [CLS] rows: what NSP reads.
    for (int64_t k = 0; k < b.num_seqs(); ++k) EXPECT_EQ(b.token_pos[b.seq_start[k]], 0);
    const SeqLayout l = b.host_layout();
    EXPECT_EQ(l.rows, b.rows);
    EXPECT_EQ(l.num_seqs, 9);
    EXPECT_EQ(l.seq_start.data, b.seq_start.data());
  }
}

TEST(ModelBatch, LoaderPacksArePlacedAsGiven) {
  auto rng = model_rng(22);
  const auto samples = model_samples(rng, {10, 20, 30, 7}, 4, 30522);
  const Batch b = make_batch(samples, BatchLayout::packed, 32, {{3, 1}, {2}, {0}});
  EXPECT_EQ(b.rows, 3 * 32);
  EXPECT_EQ(b.seq_start, (std::vector<int32_t>{0, 7, 32, 64}));
  EXPECT_EQ(b.sample_id,
            (std::vector<int64_t>{samples[3].id, samples[1].id, samples[2].id, samples[0].id}));
}

TEST(ModelBatch, EmptyBatch) {
  for (BatchLayout layout : {BatchLayout::unpadded, BatchLayout::packed, BatchLayout::padded}) {
    const Batch b = make_batch({}, layout, 128);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(b.rows, 0);
  }
}

TEST(ModelBatch, BadInputIsAnErrorNamingTheSample) {
  auto rng = model_rng(23);
  const auto good = model_samples(rng, {12, 9}, 3, 30522);
  auto expect_error = [&](std::vector<Sample> samples, const std::string& needle,
                          BatchLayout layout = BatchLayout::unpadded,
                          std::vector<std::vector<int32_t>> packs = {}) {
    try {
      make_batch(samples, layout, 16, packs);
      ADD_FAILURE() << "no error, expected '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto s = good;
  s[1] = model_sample(rng, s[1].id, 17, 3, 30522);
  expect_error(s, "has 17 tokens");
  s = good;
  s[0].masked_lm_positions.back() = 12;
  expect_error(s, "masked_lm_positions");
  s = good;
  s[1].id = s[0].id;
  expect_error(s, "appears twice");
  s = good;
  s[0].id = int64_t{1} << 44;
  expect_error(s, "dropout key range");
  s = good;
  s[0].next_sentence_label = 2;
  expect_error(s, "next_sentence_label");
  s = good;
  s[0].segment_ids.pop_back();
  expect_error(s, "segment ids");
  expect_error(good, "more than max_seq_len", BatchLayout::packed, {{0, 1}});
  expect_error(good, "already packed", BatchLayout::packed, {{0}, {0}});
  expect_error(good, "hold 1 of the 2", BatchLayout::packed, {{1}});
  // Packing is the loader's: the packed layout never packs by itself.
  expect_error(good, "needs the packs of the loader / planner", BatchLayout::packed);
  expect_error(good, "got 2 samples and no packs", BatchLayout::packed);
  EXPECT_THROW(parse_batch_layout("ragged"), Error);
  EXPECT_EQ(parse_batch_layout("packed"), BatchLayout::packed);
}

// GraphCapacity: from a random bound and row quantum (8, or a slot length whose multiples the
// rows then are), every shape within it gets a capacity of at least its rows, less than one
// bucket (bound / 32, to a multiple of the quantum) above, the bound's masked tokens and
// sequence slots; at most 33 row capacities exist (0 and each bucket), and covering a larger
// shape raises the bound.
TEST(ModelBatch, GraphCapacityHasAFewBucketsFromTheBound) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 50; ++trial) {
    GraphCapacity cap;
    BatchShape bound;
    bound.rows = 1 + static_cast<int64_t>(rng() % 40000);
    bound.masked = static_cast<int64_t>(rng() % 5000);
    bound.seqs = 1 + static_cast<int64_t>(rng() % 100);
    bound.max_len = 512;
    cap.row_quantum = trial % 2 ? 8 : 1 + static_cast<int64_t>(rng() % 512);
    const int64_t q = cap.row_quantum;
    EXPECT_TRUE(cap.cover(bound));
    EXPECT_FALSE(cap.cover(bound));
    const int64_t row_step = ((bound.rows + 31) / 32 + q - 1) / q * q;
    std::set<int64_t> rows_caps;
    for (int i = 0; i < 2000; ++i) {
      BatchShape s;
      s.rows = static_cast<int64_t>(rng() % static_cast<uint64_t>(bound.rows + 1));
      if (q != 8) s.rows = s.rows / q * q;  // whole slots
      s.masked = static_cast<int64_t>(rng() % static_cast<uint64_t>(bound.masked + 1));
      s.seqs = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(bound.seqs));
      s.max_len = 100;
      const BatchShape c = cap.of(s);
      ASSERT_GE(c.rows, s.rows);
      ASSERT_LT(c.rows - s.rows, row_step);
      ASSERT_EQ(c.rows % row_step, 0);
      ASSERT_EQ(c.masked, bound.masked);
      ASSERT_EQ(c.seqs, bound.seqs);
      ASSERT_EQ(c.max_len, s.max_len);
      ASSERT_EQ(cap.of(c).rows, c.rows);  // a capacity is its own
      rows_caps.insert(c.rows);
    }
    EXPECT_LE(rows_caps.size(), 33u);
    BatchShape more = bound;
    more.seqs += 3;
    EXPECT_TRUE(cap.cover(more));
    EXPECT_EQ(cap.bound.seqs, bound.seqs + 3);
    EXPECT_EQ(cap.bound.rows, bound.rows);
  }
}

// laid_shape, the one place that decides the shape a batch is computed in: without graphs the
// batch's own (FP8: rows up to the next multiple of kFp8Rows, nothing else changed); with
// graphs the capacity GraphCapacity::of gives after covering it, whose rows are multiples of the
// row quantum (the layout's, with FP8 also of kFp8Rows); an empty batch as it is.
TEST(ModelBatch, LaidShapeIsTheBatchTheFp8RowsOrTheGraphCapacity) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    BatchShape s;
    s.rows = 1 + static_cast<int64_t>(rng() % 5000);
    s.masked = static_cast<int64_t>(rng() % 800);
    s.seqs = 1 + static_cast<int64_t>(rng() % 40);
    s.max_len = 1 + static_cast<int32_t>(rng() % 512);
    const bool fp8 = trial % 2 == 1;
    const BatchShape plain = laid_shape(s, nullptr, fp8);
    EXPECT_EQ(plain.seqs, s.seqs);
    EXPECT_EQ(plain.masked, s.masked);
    EXPECT_EQ(plain.max_len, s.max_len);
    if (fp8) {
      EXPECT_EQ(plain.rows % kFp8Rows, 0);
      EXPECT_GE(plain.rows, s.rows);
      EXPECT_LT(plain.rows - s.rows, kFp8Rows);
    } else {
      EXPECT_EQ(plain.rows, s.rows);
    }
    const auto layout = static_cast<BatchLayout>(trial % 3);
    const int64_t slot = 64 << (trial % 4);
    const int64_t q = row_quantum(layout, slot, fp8);
    EXPECT_EQ(q % (layout == BatchLayout::unpadded ? 8 : slot), 0);
    EXPECT_EQ(q % (fp8 ? kFp8Rows : 1), 0);
    GraphCapacity cap;
    cap.row_quantum = q;
    BatchShape bound = s;
    bound.rows += static_cast<int64_t>(rng() % 3000);
    bound.seqs += static_cast<int64_t>(rng() % 5);
    cap.cover(bound);
    const BatchShape laid = laid_shape(s, &cap, fp8);
    EXPECT_EQ(laid.rows, cap.of(s).rows);
    EXPECT_EQ(laid.seqs, bound.seqs);
    EXPECT_EQ(laid.masked, bound.masked);
    EXPECT_EQ(laid.rows % q, 0);
    EXPECT_GE(laid.rows, s.rows);
    BatchShape larger = bound;  // a batch beyond the bound is laid into a raised one
    larger.rows += 1;
    EXPECT_GE(laid_shape(larger, &cap, fp8).rows, larger.rows);
    EXPECT_EQ(cap.bound.rows, bound.rows) << "laid_shape changed the bound it was given";
    const BatchShape empty;
    EXPECT_EQ(laid_shape(empty, &cap, fp8).rows, 0);
    EXPECT_EQ(laid_shape(empty, nullptr, fp8).rows, 0);
  }
}

// with_capacity keeps every token, label and sequence where it was and adds only padding rows,
// empty slots and unused masked slots (row and label -1); the CPU backend's attention gives the
// real rows the same bits over it, and NSP leaves the empty slots out: the loss and correct
// count of the batch's own sequences.
TEST(ModelBatch, CapacityAddsPaddingRowsAndEmptySlotsOnly) {
  auto rng = model_rng(11);
  const auto samples = model_samples(rng, {7, 30, 5, 19}, 6, 1000);
  const Batch b = make_batch(samples, BatchLayout::unpadded, 32);
  const int64_t rows = b.rows + 16, seqs = 8;
  const Batch c = with_capacity(b, rows, seqs);
  ASSERT_EQ(c.rows, rows);
  ASSERT_EQ(c.num_seqs(), seqs);
  EXPECT_EQ(c.num_tokens(), b.num_tokens());
  EXPECT_EQ(c.masked_rows, b.masked_rows);
  EXPECT_EQ(c.masked_labels, b.masked_labels);
  const int64_t masked = b.num_masked() + 3;
  const Batch cm = with_capacity(b, rows, seqs, masked);
  ASSERT_EQ(cm.num_masked(), masked);
  for (int64_t i = 0; i < masked; ++i) {
    const bool real = i < b.num_masked();
    const auto k = static_cast<size_t>(i);
    EXPECT_EQ(cm.masked_rows[k], real ? b.masked_rows[k] : -1);
    EXPECT_EQ(cm.masked_labels[k], real ? b.masked_labels[k] : -1);
  }
  EXPECT_THROW(with_capacity(b, rows, seqs, b.num_masked() - 1), Error);
  for (int64_t r = 0; r < rows; ++r) {
    const bool real = r < b.rows;
    const auto i = static_cast<size_t>(r);
    EXPECT_EQ(c.input_ids[i], real ? b.input_ids[i] : 0);
    EXPECT_EQ(c.segment_ids[i], real ? b.segment_ids[i] : 0);
    EXPECT_EQ(c.token_seq[i], real ? b.token_seq[i] : -1);
    EXPECT_EQ(c.token_pos[i], real ? b.token_pos[i] : 0);
  }
  for (int64_t k = 0; k < seqs; ++k) {
    const bool real = k < b.num_seqs();
    const auto i = static_cast<size_t>(k);
    EXPECT_EQ(c.seq_start[i], real ? b.seq_start[i] : b.rows);
    EXPECT_EQ(c.seq_len[i], real ? b.seq_len[i] : 0);
    EXPECT_EQ(c.sample_id[i], real ? b.sample_id[i] : 0);
    EXPECT_EQ(c.nsp_labels[i], real ? b.nsp_labels[i] : 0);
  }
  EXPECT_THROW(with_capacity(b, b.rows - 1, seqs), Error);
  EXPECT_THROW(with_capacity(b, rows, b.num_seqs() - 1), Error);

  auto be = make_cpu_backend();
  const int heads = 2;
  const int64_t h = 16;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> qkv(static_cast<size_t>(rows * 3 * h));
  for (float& v : qkv) v = normal(rng);
  auto attend = [&](const Batch& batch) {
    std::vector<float> out(static_cast<size_t>(batch.rows * h), -1.f);
    std::vector<float> lse(static_cast<size_t>(batch.rows * heads), -1.f);
    be->attention_forward(batch.host_layout(), view(qkv.data(), {batch.rows, 3 * h}), heads, 0,
                          Dropout{}, view(out.data(), {batch.rows, h}),
                          view(lse.data(), {batch.rows, int64_t{heads}}));
    return out;
  };
  const std::vector<float> plain = attend(b), padded = attend(c);
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), padded.begin()))
      << "the real rows' attention changed";
  EXPECT_TRUE(std::all_of(padded.begin() + b.rows * h, padded.end(), [](float v) {
    return v == 0.f;
  })) << "a padding row's output is not 0";

  auto draw = [&](size_t n) {
    std::vector<float> v(n);
    for (float& e : v) e = normal(rng);
    return v;
  };
  std::vector<float> x = draw(static_cast<size_t>(rows * h)), w = draw(static_cast<size_t>(h * h)),
                     bias = draw(static_cast<size_t>(h)), cw = draw(static_cast<size_t>(2 * h)),
                     cb = draw(2);
  const PoolerParams p{view(w.data(), {h, h}), view(bias.data(), {h}), view(cw.data(), {2, h}),
                       view(cb.data(), {2})};
  auto nsp = [&](const Batch& batch, int32_t& correct) {
    const int64_t s = batch.num_seqs();
    std::vector<float> ws(static_cast<size_t>(nsp_workspace_elems(s, h)));
    float loss = 0.f;
    be->nsp_loss(batch.host_layout(), view(x.data(), {batch.rows, h}), p,
                 view(const_cast<int32_t*>(batch.nsp_labels.data()), {s}), 1.f,
                 view(ws.data(), {static_cast<int64_t>(ws.size())}), view(&loss, {1}),
                 view(&correct, {1}), Tensor(), PoolerParams{});
    return loss;
  };
  int32_t plain_correct = 0, capacity_correct = 0;
  const float plain_loss = nsp(b, plain_correct), capacity_loss = nsp(c, capacity_correct);
  EXPECT_EQ(capacity_correct, plain_correct);
  // The same four sequences' losses summed in the same order; only the pooler's GEMM runs over
  // 8 rows instead of 4, which may block its sums otherwise: each logit within ~h ulps of its
  // terms (h = 16, terms of order 1: about 1e-6), far below a wrong or a fifth sequence.
  EXPECT_NEAR(capacity_loss, plain_loss, 1e-5 * std::abs(plain_loss));
}

}  // namespace
}  // namespace packbert::test
