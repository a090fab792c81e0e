// make_batch: the three layouts place every token, [CLS] row, masked row and label where the
// model expects them, and bad samples or packs are errors naming the sample.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

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
  EXPECT_EQ(b.sample_id, (std::vector<int64_t>{samples[3].id, samples[1].id, samples[2].id,
                                               samples[0].id}));
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

}  // namespace
}  // namespace packbert::test
