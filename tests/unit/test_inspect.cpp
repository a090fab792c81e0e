// inspect_shards: the report's numbers against values computed here from the samples written.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>

#include "data/shards/inspect.h"
#include "data/shards/shard.h"
#include "shard_test_util.h"
#include "test_util.h"

namespace packbert {
namespace {

struct Expected {
  int64_t samples = 0, tokens = 0, masked = 0, next_random = 0;
  int min_len = 0, max_len = 0;
  double mean_len = 0, median_len = 0;
  std::vector<int64_t> length_histogram, masked_histogram;
};

Expected expected_of(const std::vector<Sample>& samples, int file_max_len) {
  Expected e;
  std::vector<int> lengths;
  e.length_histogram.assign(static_cast<size_t>(file_max_len) + 1, 0);
  for (const Sample& s : samples) {
    ++e.samples;
    e.tokens += s.length();
    e.masked += s.num_masked();
    e.next_random += s.next_sentence_label;
    lengths.push_back(s.length());
    ++e.length_histogram[s.length()];
    if (e.masked_histogram.size() <= static_cast<size_t>(s.num_masked()))
      e.masked_histogram.resize(s.num_masked() + 1, 0);
    ++e.masked_histogram[s.num_masked()];
  }
  std::sort(lengths.begin(), lengths.end());
  e.min_len = lengths.front();
  e.max_len = lengths.back();
  e.mean_len = static_cast<double>(e.tokens) / e.samples;
  const size_t n = lengths.size();
  e.median_len = n % 2 ? lengths[n / 2] : 0.5 * (lengths[n / 2 - 1] + lengths[n / 2]);
  return e;
}

void expect_report(const InspectReport& r, const Expected& e, int file_max_len, int64_t shards) {
  EXPECT_EQ(r.shards, shards);
  EXPECT_EQ(r.samples, e.samples);
  EXPECT_EQ(r.tokens, e.tokens);
  EXPECT_EQ(r.masked_tokens, e.masked);
  EXPECT_EQ(r.next_random, e.next_random);
  EXPECT_EQ(r.min_len, e.min_len);
  EXPECT_EQ(r.max_len, e.max_len);
  EXPECT_DOUBLE_EQ(r.mean_len, e.mean_len);
  EXPECT_DOUBLE_EQ(r.median_len, e.median_len);
  EXPECT_EQ(r.file_max_len, file_max_len);
  EXPECT_NEAR(r.padding_fraction,
              1.0 - static_cast<double>(e.tokens) / (static_cast<double>(e.samples) * file_max_len),
              1e-12);
  EXPECT_EQ(r.length_histogram, e.length_histogram);
  EXPECT_EQ(r.masked_histogram, e.masked_histogram);
}

TEST(Inspect, FixedShardPaddingIsMeasuredAtTheFilesLength) {
  std::mt19937_64 rng(test::test_seed());
  // Samples no longer than 80 in rows of 100: the padding counts the unused 20+ slots too.
  const auto samples =
      test::random_samples(rng, std::uniform_int_distribution<size_t>(50, 300)(rng), 80, 12);
  test::TempDir dir;
  ShardWriteOptions opts;
  opts.max_seq_len = 100;
  opts.max_predictions = 12;
  opts.chunk_samples = 32;
  write_shard(dir.file("fixed.h5"), samples, opts);
  const InspectReport r = inspect_shards(dir.file("fixed.h5"), SampleRules{});
  expect_report(r, expected_of(samples, 100), 100, 1);

  std::ostringstream out;
  print_inspect_report(r, out);
  const std::string text = out.str();
  for (const std::string& part :
       {std::string("samples"), std::to_string(r.min_len), std::to_string(r.max_len),
        fmt::format("{:.1f}%", 100.0 * r.padding_fraction), std::string("length histogram")})
    EXPECT_NE(text.find(part), std::string::npos) << "lacks '" << part << "':\n" << text;
}

TEST(Inspect, DirectoryOfBothFormats) {
  std::mt19937_64 rng(test::test_seed() + 1);
  test::TempDir dir;
  const auto fixed = test::random_samples(rng, 120, 64, 10);
  const auto varlength = test::random_samples(rng, 77, 64, 10);
  ShardWriteOptions opts;
  opts.max_seq_len = 64;
  opts.max_predictions = 10;
  opts.chunk_samples = 16;
  write_shard(dir.file("part-0.h5"), fixed, opts);
  opts.format = ShardFormat::var_length;
  write_shard(dir.file("part-1.hdf5"), varlength, opts);
  std::vector<Sample> all = fixed;
  all.insert(all.end(), varlength.begin(), varlength.end());
  expect_report(inspect_shards(dir.path(), SampleRules{}), expected_of(all, 64), 64, 2);
}

TEST(Inspect, VarLengthShardUsesItsLongestSample) {
  std::mt19937_64 rng(test::test_seed() + 2);
  test::TempDir dir;
  const auto samples = test::random_samples(rng, 211, 300, 40);
  ShardWriteOptions opts;
  opts.format = ShardFormat::var_length;
  opts.max_seq_len = 300;
  opts.max_predictions = 40;
  write_shard(dir.file("v.h5"), samples, opts);
  const int longest = std::max_element(samples.begin(), samples.end(), [](auto& a, auto& b) {
                        return a.length() < b.length();
                      })->length();
  expect_report(inspect_shards(dir.file("v.h5"), SampleRules{}), expected_of(samples, longest),
                longest, 1);
}

TEST(Inspect, InvalidSampleFailsTheWholeInspection) {
  std::mt19937_64 rng(test::test_seed() + 3);
  test::TempDir dir;
  auto samples = test::random_samples(rng, 40, 32, 4);
  const int bad = std::uniform_int_distribution<int>(0, 39)(rng);
  samples[bad].segment_ids[0] = 5;
  ShardWriteOptions opts;
  opts.max_seq_len = 32;
  opts.max_predictions = 4;
  write_shard(dir.file("bad.h5"), samples, opts);
  const std::string msg = test::error_of([&] { inspect_shards(dir.path(), SampleRules{}); });
  EXPECT_NE(msg.find(dir.file("bad.h5")), std::string::npos) << msg;
  EXPECT_NE(msg.find("sample " + std::to_string(bad) + ":"), std::string::npos) << msg;
}

// --skip-bad-samples: every bad sample counted and reported, the summary over the valid ones.
TEST(Inspect, SkipBadSamplesCountsAndReportsThem) {
  std::mt19937_64 rng(test::test_seed() + 4);
  test::TempDir dir;
  auto samples = test::random_samples(rng, 60, 32, 4);
  std::vector<Sample> valid;
  std::vector<int> bad_rows;
  for (int i = 0; i < 60; ++i) {
    if (rng() % 5 == 0) {
      bad_rows.push_back(i);
      samples[i].input_ids[1] = 31000;  // outside the 30522-token vocabulary
    } else {
      valid.push_back(samples[i]);
    }
  }
  ShardWriteOptions opts;
  opts.max_seq_len = 32;
  opts.max_predictions = 4;
  write_shard(dir.file("some-bad.h5"), samples, opts);
  const InspectReport r = inspect_shards(dir.path(), SampleRules{}, /*skip_bad_samples=*/true);
  EXPECT_EQ(r.bad_samples, static_cast<int64_t>(bad_rows.size()));
  ASSERT_EQ(r.bad_examples.size(), std::min<size_t>(5, bad_rows.size()));
  for (size_t i = 0; i < r.bad_examples.size(); ++i) {
    EXPECT_NE(r.bad_examples[i].find("sample " + std::to_string(bad_rows[i]) + ":"),
              std::string::npos)
        << r.bad_examples[i];
  }
  if (!valid.empty()) expect_report(r, expected_of(valid, 32), 32, 1);
  std::ostringstream os;
  print_inspect_report(r, os);
  if (!bad_rows.empty()) {
    EXPECT_NE(os.str().find("bad samples skipped"), std::string::npos) << os.str();
  }
  // Without the flag the first bad sample fails the inspection.
  if (!bad_rows.empty()) {
    const std::string msg = test::error_of([&] { inspect_shards(dir.path(), SampleRules{}); });
    EXPECT_NE(msg.find("sample " + std::to_string(bad_rows[0]) + ":"), std::string::npos) << msg;
  }
}

TEST(Inspect, EmptyShard) {
  test::TempDir dir;
  write_shard(dir.file("empty.h5"), {}, ShardWriteOptions{});
  const InspectReport r = inspect_shards(dir.file("empty.h5"), SampleRules{});
  EXPECT_EQ(r.samples, 0);
  EXPECT_EQ(r.file_max_len, 128);
  std::ostringstream out;
  print_inspect_report(r, out);
  EXPECT_NE(out.str().find("samples"), std::string::npos);
}

}  // namespace
}  // namespace packbert
