// Every rule the shard reader enforces, one test each: the reader yields the samples before the
// bad one, then throws packbert::Error naming the file, the dataset and the sample index.
#include <gtest/gtest.h>

#include <random>

#include "data/shards/shard.h"
#include "shard_test_util.h"
#include "test_util.h"

namespace packbert {
namespace {

using test::error_of;
using test::find_dataset;
using test::RawDataset;

constexpr int kLen = 48;   // L of the test shards
constexpr int kPred = 8;   // P of the test shards
constexpr int kRows = 60;  // samples per test shard (several reader windows of 16)

class ShardValidation : public ::testing::Test {
 protected:
  ShardValidation() : rng_(test::test_seed()) {
    samples_ = test::random_samples(rng_, kRows, kLen, kPred);
    bad_ = std::uniform_int_distribution<int>(0, kRows - 1)(rng_);
  }

  // A sample index to corrupt and the sample itself.
  Sample& bad_sample() { return samples_[bad_]; }
  // Makes the bad sample have at least min_len tokens and min_masked masked positions.
  void reshape_bad(int min_len, int min_masked) {
    Sample s = test::random_sample(rng_, min_len, kLen, kPred);
    while (s.num_masked() < min_masked) s = test::random_sample(rng_, min_len, kLen, kPred);
    samples_[bad_] = s;
  }

  std::string write(ShardFormat format) {
    const std::string path = dir_.file(std::string("bad_") + to_string(format) + ".h5");
    ShardWriteOptions opts;
    opts.format = format;
    opts.max_seq_len = kLen;
    opts.max_predictions = kPred;
    opts.chunk_samples = 16;
    write_shard(path, samples_, opts);
    return path;
  }
  std::string write_raw(const std::vector<RawDataset>& raw) {
    const std::string path = dir_.file("bad_raw.h5");
    test::write_raw_h5(path, raw);
    return path;
  }

  // Reads path: the samples before bad_ must come out fine, then the error must name the
  // file, the dataset and bad_, and contain detail. Reading goes on after the bad sample
  // (the cursor moves past it), as --skip-bad-samples needs; unless only_bad_ is cleared, the
  // samples after it must read fine.
  void expect_rejected(const std::string& path, const std::string& dataset,
                       const std::string& detail, SampleRules rules = {}) {
    ShardReader reader(path, rules, 16);
    Sample s;
    for (int i = 0; i < bad_; ++i) {
      ASSERT_TRUE(reader.next(s)) << "sample " << i;
      ASSERT_TRUE(s == samples_[i]) << "sample " << i;
    }
    const std::string msg = error_of([&] { reader.next(s); });
    ASSERT_FALSE(msg.empty()) << "sample " << bad_ << " was accepted";
    for (const std::string& part : {"shard " + path, "dataset '" + dataset + "'",
                                    "sample " + std::to_string(bad_) + ":", detail})
      EXPECT_NE(msg.find(part), std::string::npos) << "lacks '" << part << "': " << msg;
    if (!only_bad_) return;
    int64_t rest = 0;
    while (reader.next(s)) ++rest;
    EXPECT_EQ(rest, kRows - bad_ - 1);
  }

  std::mt19937_64 rng_;
  test::TempDir dir_;
  std::vector<Sample> samples_;
  int bad_ = 0;
  bool only_bad_ = true;  // the samples other than bad_ are valid
};

TEST_F(ShardValidation, TokenIdAtOrAboveVocab) {
  const int i = std::uniform_int_distribution<int>(1, bad_sample().length() - 2)(rng_);
  bad_sample().input_ids[i] = 30522;
  expect_rejected(write(ShardFormat::fixed), "input_ids",
                  "input_ids[" + std::to_string(i) + "] = 30522 is outside the vocabulary");
}

TEST_F(ShardValidation, TokenIdAboveSmallerVocab) {
  // The vocabulary comes from the rules (e.g. --vocab): ids valid for BERT's vocab fail here.
  SampleRules rules;
  rules.vocab_size = 900;  // random_sample draws ids >= 999
  bad_ = 0;
  only_bad_ = false;
  expect_rejected(write(ShardFormat::var_length), "input_ids", "outside the vocabulary [0, 900)",
                  rules);
}

TEST_F(ShardValidation, SegmentIdTwo) {
  const int i = std::uniform_int_distribution<int>(0, bad_sample().length() - 1)(rng_);
  bad_sample().segment_ids[i] = 2;
  expect_rejected(write(ShardFormat::var_length), "segment_ids",
                  "segment_ids[" + std::to_string(i) + "] = 2 is not 0 or 1");
}

TEST_F(ShardValidation, MaskWithHole) {
  reshape_bad(8, 0);
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
  // A 0 inside the mask: the sample would end there, but a 1 follows.
  const int len = bad_sample().length();
  find_dataset(raw, "input_mask").values[bad_ * kLen + len - 3] = 0;
  expect_rejected(write_raw(raw), "input_mask",
                  "input_mask[" + std::to_string(len - 2) + "] = 1 after padding began at " +
                      std::to_string(len - 3));
}

TEST_F(ShardValidation, MaskNotBinary) {
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
  find_dataset(raw, "input_mask").values[bad_ * kLen + 1] = 3;
  expect_rejected(write_raw(raw), "input_mask", "input_mask[1] = 3 is not 0 or 1");
}

TEST_F(ShardValidation, TokenInPadding) {
  Sample s = test::random_sample(rng_, 5, kLen - 2, kPred);
  samples_[bad_] = s;
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
  find_dataset(raw, "input_ids").values[bad_ * kLen + kLen - 1] = 2000;
  expect_rejected(write_raw(raw), "input_ids",
                  "input_ids[" + std::to_string(kLen - 1) + "] = 2000 is in the padding");
}

TEST_F(ShardValidation, SegmentInPadding) {
  Sample s = test::random_sample(rng_, 5, kLen - 2, kPred);
  samples_[bad_] = s;
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
  find_dataset(raw, "segment_ids").values[bad_ * kLen + s.length()] = 1;
  expect_rejected(write_raw(raw), "segment_ids", "is in the padding");
}

TEST_F(ShardValidation, MaskedPositionOutsideSequence) {
  reshape_bad(5, 1);
  Sample& s = bad_sample();
  s.masked_lm_positions.back() = s.length();  // one past the last token
  expect_rejected(write(ShardFormat::var_length), "masked_lm_positions",
                  "= " + std::to_string(s.length()) + " is outside the sequence (1 .. " +
                      std::to_string(s.length() - 1) + ")");
}

TEST_F(ShardValidation, MaskedPositionOutsideFixedSequence) {
  // In the fixed format "outside" means in the padding.
  Sample s = test::random_sample(rng_, 5, kLen - 4, kPred);
  while (s.num_masked() == 0) s = test::random_sample(rng_, 5, kLen - 4, kPred);
  s.masked_lm_positions.back() = kLen - 1;
  samples_[bad_] = s;
  expect_rejected(write(ShardFormat::fixed), "masked_lm_positions", "is outside the sequence");
}

TEST_F(ShardValidation, MaskedPositionAtCls) {
  // Position 0 is [CLS]; the writer refuses it, so the file is written raw.
  reshape_bad(5, 1);
  bad_sample().masked_lm_positions[0] = 0;
  expect_rejected(write_raw(test::raw_varlength(samples_, H5T_STD_I16LE)), "masked_lm_positions",
                  "masked_lm_positions[0] = 0 is outside the sequence");
}

TEST_F(ShardValidation, MaskedPositionAtSep) {
  reshape_bad(5, 1);
  Sample& s = bad_sample();
  s.masked_lm_positions = {s.length() - 1};  // the final [SEP]
  s.masked_lm_ids = {2000};
  expect_rejected(write(ShardFormat::fixed), "masked_lm_positions",
                  "masked_lm_positions[0] = " + std::to_string(s.length() - 1) +
                      " points at a [CLS]/[SEP] token");
}

TEST_F(ShardValidation, MaskedPositionsNotAscending) {
  reshape_bad(5, 2);
  Sample& s = bad_sample();
  std::swap(s.masked_lm_positions[0], s.masked_lm_positions[1]);
  expect_rejected(write(ShardFormat::var_length), "masked_lm_positions",
                  "masked_lm_positions[1] = " + std::to_string(s.masked_lm_positions[1]) +
                      " is not above the previous position");
}

TEST_F(ShardValidation, MaskedIdAtOrAboveVocab) {
  reshape_bad(5, 1);
  const int j = std::uniform_int_distribution<int>(0, bad_sample().num_masked() - 1)(rng_);
  bad_sample().masked_lm_ids[j] = 31000;
  expect_rejected(write(ShardFormat::fixed), "masked_lm_ids",
                  "masked_lm_ids[" + std::to_string(j) + "] = 31000 is outside the vocabulary");
}

TEST_F(ShardValidation, PositionAfterUnusedSlot) {
  reshape_bad(12, 0);
  Sample& s = bad_sample();
  while (s.num_masked() > kPred - 2) {
    s.masked_lm_positions.pop_back();
    s.masked_lm_ids.pop_back();
  }
  const int unused = s.num_masked();
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
  find_dataset(raw, "masked_lm_positions").values[bad_ * kPred + unused + 1] = 3;
  expect_rejected(write_raw(raw), "masked_lm_positions",
                  "masked_lm_positions[" + std::to_string(unused + 1) +
                      "] = 3 follows the unused slot " + std::to_string(unused));
}

TEST_F(ShardValidation, MaskedIdInUnusedSlot) {
  Sample& s = bad_sample();
  if (s.num_masked() == kPred) {
    s.masked_lm_positions.pop_back();
    s.masked_lm_ids.pop_back();
  }
  const int unused = s.num_masked();
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
  find_dataset(raw, "masked_lm_ids").values[bad_ * kPred + unused] = 1234;
  expect_rejected(write_raw(raw), "masked_lm_ids",
                  "masked_lm_ids[" + std::to_string(unused) + "] = 1234 is in an unused slot");
}

TEST_F(ShardValidation, MaskedCountsDiffer) {
  reshape_bad(5, 1);
  auto raw = test::raw_varlength(samples_, H5T_STD_I16LE);
  find_dataset(raw, "masked_lm_ids").rows[bad_].push_back(2000);
  expect_rejected(write_raw(raw), "masked_lm_ids", "entries but masked_lm_positions has");
}

TEST_F(ShardValidation, SegmentLengthDiffers) {
  auto raw = test::raw_varlength(samples_, H5T_STD_I16LE);
  find_dataset(raw, "segment_ids").rows[bad_].push_back(1);
  expect_rejected(write_raw(raw), "segment_ids", "differs from input_ids length");
}

TEST_F(ShardValidation, NextSentenceLabelNotBinary) {
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I32LE);
  find_dataset(raw, "next_sentence_labels").values[bad_] = 258;  // 2 as int8: must say 258
  expect_rejected(write_raw(raw), "next_sentence_labels", "next_sentence_labels = 258");
}

TEST_F(ShardValidation, LongerThanMaxSeqLenRule) {
  reshape_bad(kLen - 4, 0);
  SampleRules rules;
  rules.max_seq_len = kLen - 5;
  for (Sample& s : samples_)
    if (&s != &bad_sample()) s = test::random_sample(rng_, 5, kLen - 5, kPred);
  expect_rejected(write(ShardFormat::var_length), "input_ids", "exceeds max_seq_len", rules);
}

// ---- structure: checked when the shard is opened, before any sample ----------------------

std::string open_error(const std::string& path) {
  return error_of([&] { ShardReader r(path, SampleRules{}); });
}

TEST_F(ShardValidation, SampleCountMismatch) {
  for (const char* name : {"next_sentence_labels", "masked_lm_ids", "input_mask"}) {
    auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
    RawDataset& d = find_dataset(raw, name);
    const size_t width = d.dims.size() == 2 ? d.dims[1] : 1;
    d.dims[0] -= 1;
    d.values.resize(d.values.size() - width);
    const std::string path = write_raw(raw);
    const std::string msg = open_error(path);
    for (const std::string& part : {path, std::string("dataset '") + name + "'",
                                    "has " + std::to_string(kRows - 1) +
                                        " samples but 'input_ids' has " + std::to_string(kRows)})
      EXPECT_NE(msg.find(part), std::string::npos) << "lacks '" << part << "': " << msg;
  }
  auto raw = test::raw_varlength(samples_, H5T_STD_I16LE);
  find_dataset(raw, "segment_ids").rows.pop_back();
  const std::string path = write_raw(raw);
  EXPECT_NE(open_error(path).find("dataset 'segment_ids' has " + std::to_string(kRows - 1)),
            std::string::npos)
      << open_error(path);
}

TEST_F(ShardValidation, SequenceLengthMismatch) {
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
  RawDataset& seg = find_dataset(raw, "segment_ids");
  seg.dims[1] = kLen + 1;
  seg.values.assign(kRows * (kLen + 1), 0);
  const std::string path = write_raw(raw);
  const std::string msg = open_error(path);
  for (const std::string& part : {path, std::string("dataset 'segment_ids'"),
                                  "sequence length " + std::to_string(kLen + 1) +
                                      " but 'input_ids' has " + std::to_string(kLen)})
    EXPECT_NE(msg.find(part), std::string::npos) << "lacks '" << part << "': " << msg;
}

TEST_F(ShardValidation, PredictionSlotMismatch) {
  auto raw = test::raw_fixed(samples_, kLen, kPred, H5T_STD_I16LE);
  RawDataset& ids = find_dataset(raw, "masked_lm_ids");
  ids.dims[1] = kPred - 1;
  ids.values.assign(kRows * (kPred - 1), 0);
  const std::string path = write_raw(raw);
  const std::string msg = open_error(path);
  for (const std::string& part : {path, std::string("dataset 'masked_lm_ids'"),
                                  std::to_string(kPred - 1) + " prediction slots"})
    EXPECT_NE(msg.find(part), std::string::npos) << "lacks '" << part << "': " << msg;
}

}  // namespace
}  // namespace packbert
