// ShardWriter / ShardReader: round trips in both formats, chunking, seeking, integer types
// wider than the writer's, writer limits, and bad files (missing, empty, truncated, not HDF5,
// wrong structure), including through the packbert binary. Per-sample validation rules are in
// test_shard_validation.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "data/shards/inspect.h"
#include "data/shards/shard.h"
#include "shard_test_util.h"
#include "test_util.h"

namespace packbert {
namespace {

using test::error_of;
using test::random_samples;

std::vector<Sample> read_all(const std::string& path, const SampleRules& rules = {},
                             int chunk_samples = 4096) {
  ShardReader reader(path, rules, chunk_samples);
  std::vector<Sample> out;
  Sample s;
  while (reader.next(s)) out.push_back(s);
  return out;
}

void expect_same_samples(const std::vector<Sample>& got, const std::vector<Sample>& want,
                         int64_t first_id = 0) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].id, first_id + static_cast<int64_t>(i));
    ASSERT_TRUE(got[i] == want[i]) << "sample " << i << " differs after the round trip";
  }
}

void expect_mentions(const std::string& msg, const std::vector<std::string>& parts) {
  ASSERT_FALSE(msg.empty()) << "expected a packbert::Error";
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
}

class ShardFormats : public ::testing::TestWithParam<ShardFormat> {};

TEST_P(ShardFormats, RoundTripAcrossChunkBoundaries) {
  std::mt19937_64 rng(test::test_seed());
  const int L = std::uniform_int_distribution<int>(16, 160)(rng);
  const int P = std::uniform_int_distribution<int>(1, 24)(rng);
  const int write_chunk = std::uniform_int_distribution<int>(7, 100)(rng);
  const int read_chunk = std::uniform_int_distribution<int>(1, 150)(rng);
  // N deliberately not a multiple of either chunk size (+ 3 rows past a boundary).
  const size_t n = static_cast<size_t>(write_chunk) * 5 + 3;
  const std::vector<Sample> samples = random_samples(rng, n, L, P);
  test::TempDir dir;
  const std::string path = dir.file("round_trip.h5");
  ShardWriteOptions opts;
  opts.format = GetParam();
  opts.max_seq_len = L;
  opts.max_predictions = P;
  opts.chunk_samples = write_chunk;
  {
    ShardWriter w(path, opts);
    for (const Sample& s : samples) w.append(s);
    EXPECT_EQ(w.size(), static_cast<int64_t>(n));
    w.close();
  }
  ShardReader reader(path, SampleRules{}, read_chunk);
  EXPECT_EQ(reader.info().format, GetParam());
  EXPECT_EQ(reader.info().num_samples, static_cast<int64_t>(n));
  if (GetParam() == ShardFormat::fixed) {
    EXPECT_EQ(reader.info().max_seq_len, L);
    EXPECT_EQ(reader.info().max_predictions, P);
  }
  expect_same_samples(read_all(path, SampleRules{}, read_chunk), samples);
}

TEST_P(ShardFormats, ExactMultipleOfChunkSingleAndEmpty) {
  std::mt19937_64 rng(test::test_seed() + 1);
  test::TempDir dir;
  ShardWriteOptions opts;
  opts.format = GetParam();
  opts.max_seq_len = 64;
  opts.max_predictions = 10;
  opts.chunk_samples = 32;
  for (size_t n : {size_t{0}, size_t{1}, size_t{32}, size_t{96}}) {
    const std::vector<Sample> samples = random_samples(rng, n, 64, 10);
    const std::string path = dir.file("n" + std::to_string(n) + ".h5");
    write_shard(path, samples, opts);
    expect_same_samples(read_all(path, SampleRules{}, 32), samples);
    expect_same_samples(read_all(path, SampleRules{}, 5), samples);
  }
}

TEST_P(ShardFormats, SeekAndReadRange) {
  std::mt19937_64 rng(test::test_seed() + 2);
  const int n = std::uniform_int_distribution<int>(100, 400)(rng);
  const std::vector<Sample> samples = random_samples(rng, static_cast<size_t>(n), 48, 7);
  test::TempDir dir;
  const std::string path = dir.file("seek.h5");
  ShardWriteOptions opts;
  opts.format = GetParam();
  opts.max_seq_len = 48;
  opts.max_predictions = 7;
  opts.chunk_samples = 16;
  write_shard(path, samples, opts);

  ShardReader reader(path, SampleRules{}, 23);
  Sample s;
  for (int trial = 0; trial < 50; ++trial) {
    const int row = std::uniform_int_distribution<int>(0, n - 1)(rng);
    reader.seek(row);
    ASSERT_TRUE(reader.next(s));
    EXPECT_EQ(s.id, row);
    EXPECT_TRUE(s == samples[row]) << "row " << row;
    int begin = std::uniform_int_distribution<int>(0, n)(rng);
    int end = std::uniform_int_distribution<int>(0, n)(rng);
    if (begin > end) std::swap(begin, end);
    std::vector<Sample> range{samples[0]};  // read_range appends
    reader.read_range(begin, end, range);
    ASSERT_EQ(range.size(), static_cast<size_t>(end - begin + 1));
    range.erase(range.begin());
    expect_same_samples(range, {samples.begin() + begin, samples.begin() + end}, begin);
  }
  reader.seek(n);
  EXPECT_FALSE(reader.next(s));
  expect_mentions(error_of([&] { reader.seek(n + 1); }), {path, "seek"});
  expect_mentions(error_of([&] { reader.seek(-1); }), {path});
  std::vector<Sample> out;
  expect_mentions(error_of([&] { reader.read_range(5, n + 1, out); }), {path});
  expect_mentions(error_of([&] { reader.read_range(6, 5, out); }), {path});
}

TEST_P(ShardFormats, WriterRefusesWhatTheFormatCannotHold) {
  std::mt19937_64 rng(test::test_seed() + 3);
  test::TempDir dir;
  const std::string path = dir.file("limits.h5");
  ShardWriteOptions opts;
  opts.format = GetParam();
  opts.max_seq_len = 32;
  opts.max_predictions = 4;
  opts.chunk_samples = 8;
  ShardWriter w(path, opts);
  const int good = std::uniform_int_distribution<int>(1, 20)(rng);
  for (int i = 0; i < good; ++i) w.append(test::random_sample(rng, 5, 32, 4));
  const std::string at = "sample " + std::to_string(good);
  expect_mentions(error_of([&] { w.append(test::random_sample(rng, 33, 40, 4)); }),
                  {path, "'input_ids'", at, "exceeds max_seq_len 32"});
  Sample many = test::random_sample(rng, 30, 32, 8);
  while (many.num_masked() <= 4) many = test::random_sample(rng, 30, 32, 8);
  expect_mentions(error_of([&] { w.append(many); }),
                  {path, "'masked_lm_positions'", at, "exceed max_predictions 4"});
  Sample wide = test::random_sample(rng, 5, 32, 4);
  wide.input_ids[1] = 40000;
  expect_mentions(error_of([&] { w.append(wide); }), {path, "'input_ids'", at, "int16"});
  EXPECT_EQ(w.size(), good);  // refused samples are not appended
  w.close();
  w.close();  // idempotent
  EXPECT_FALSE(error_of([&] { w.append(test::random_sample(rng, 5, 32, 4)); }).empty());
  EXPECT_EQ(read_all(path).size(), static_cast<size_t>(good));
}

INSTANTIATE_TEST_SUITE_P(Shard, ShardFormats,
                         ::testing::Values(ShardFormat::fixed, ShardFormat::var_length),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Files written by other tools use int32/int64 (NVIDIA's fixed shards) or other byte orders;
// the reader converts them and gets the same samples.
TEST(ShardReader, ReadsWiderAndForeignIntegerTypes) {
  std::mt19937_64 rng(test::test_seed() + 4);
  test::TempDir dir;
  const std::vector<Sample> samples =
      random_samples(rng, std::uniform_int_distribution<size_t>(20, 90)(rng), 40, 6);
  struct Case {
    const char* name;
    hid_t type;
    bool vlen;
  };
  for (const Case& c :
       {Case{"fixed_int32", H5T_STD_I32LE, false}, Case{"fixed_int64", H5T_STD_I64LE, false},
        Case{"fixed_uint16_be", H5T_STD_U16BE, false}, Case{"fixed_uint64", H5T_STD_U64LE, false},
        Case{"vlen_int32", H5T_STD_I32LE, true}, Case{"vlen_int64_be", H5T_STD_I64BE, true}}) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(std::string(c.name) + ".h5");
    test::write_raw_h5(path, c.vlen ? test::raw_varlength(samples, c.type)
                                    : test::raw_fixed(samples, 40, 6, c.type));
    ShardReader reader(path, SampleRules{}, 7);
    EXPECT_EQ(reader.info().format, c.vlen ? ShardFormat::var_length : ShardFormat::fixed);
    expect_same_samples(read_all(path, SampleRules{}, 7), samples);
  }
}

// A user block (bytes before the HDF5 data, e.g. a header another tool wrote) shifts every
// address; the reader's own parsing of heap collections must follow it.
TEST(ShardReader, ReadsFilesWithAUserBlock) {
  std::mt19937_64 rng(test::test_seed() + 12);
  test::TempDir dir;
  const std::vector<Sample> samples = random_samples(rng, 70, 40, 6);
  for (bool vlen : {false, true}) {
    const std::string path = dir.file(vlen ? "vlen_ub.h5" : "fixed_ub.h5");
    test::write_raw_h5(path,
                       vlen ? test::raw_varlength(samples, H5T_STD_I16LE)
                            : test::raw_fixed(samples, 40, 6, H5T_STD_I16LE),
                       1024);
    expect_same_samples(read_all(path, SampleRules{}, 16), samples);
  }
}

// A value that does not fit int32 must be reported with its true value, not clipped or wrapped.
TEST(ShardReader, ReportsInt64ValuesBeyondInt32) {
  std::mt19937_64 rng(test::test_seed() + 5);
  test::TempDir dir;
  const std::vector<Sample> samples = random_samples(rng, 30, 40, 6);
  const size_t bad = std::uniform_int_distribution<size_t>(0, 29)(rng);
  for (bool vlen : {false, true}) {
    const std::string path = dir.file(vlen ? "vlen64.h5" : "fixed64.h5");
    auto raw = vlen ? test::raw_varlength(samples, H5T_STD_I64LE)
                    : test::raw_fixed(samples, 40, 6, H5T_STD_I64LE);
    auto& ids = test::find_dataset(raw, "input_ids");
    const int64_t huge = (int64_t{1} << 32) + 7;  // wraps to 7 as int32: must not pass
    if (vlen)
      ids.rows[bad][2] = huge;
    else
      ids.values[bad * 40 + 2] = huge;
    test::write_raw_h5(path, raw);
    ShardReader reader(path, SampleRules{}, 8);
    Sample s;
    for (size_t i = 0; i < bad; ++i) ASSERT_TRUE(reader.next(s));
    expect_mentions(error_of([&] { reader.next(s); }),
                    {path, "dataset 'input_ids'", "sample " + std::to_string(bad),
                     "input_ids[2] = " + std::to_string(huge)});
  }
}

// ---- bad files: each must be a packbert::Error with a message a user can act on ----------

TEST(ShardBadFiles, MissingPath) {
  test::TempDir dir;
  const std::string path = dir.file("nope.h5");
  expect_mentions(error_of([&] { ShardReader r(path, SampleRules{}); }), {path, "does not exist"});
  expect_mentions(error_of([&] { list_shards(path); }), {path, "does not exist"});
}

TEST(ShardBadFiles, EmptyFile) {
  test::TempDir dir;
  const std::string path = dir.file("empty.h5");
  std::ofstream(path).close();
  expect_mentions(error_of([&] { ShardReader r(path, SampleRules{}); }), {path, "empty"});
}

TEST(ShardBadFiles, TruncatedShard) {
  std::mt19937_64 rng(test::test_seed() + 6);
  test::TempDir dir;
  const std::string path = dir.file("truncated.h5");
  ShardWriteOptions opts;
  opts.chunk_samples = 16;
  write_shard(path, random_samples(rng, 100, 128, 20), opts);
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path,
                               std::uniform_int_distribution<uintmax_t>(size / 4, size - 1)(rng));
  const std::string msg = error_of([&] { read_all(path); });
  expect_mentions(msg, {path});
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(ShardBadFiles, TextFileIsNotHdf5) {
  test::TempDir dir;
  const std::string path = dir.file("notes.h5");
  std::ofstream(path) << "input_ids,input_mask\n101,1\n";
  expect_mentions(error_of([&] { ShardReader r(path, SampleRules{}); }),
                  {path, "not an HDF5 file"});
}

TEST(ShardBadFiles, DatasetMissing) {
  std::mt19937_64 rng(test::test_seed() + 7);
  test::TempDir dir;
  const std::vector<Sample> samples = random_samples(rng, 10, 32, 4);
  for (const char* name : {"input_mask", "segment_ids", "masked_lm_ids", "next_sentence_labels"}) {
    auto raw = test::raw_fixed(samples, 32, 4, H5T_STD_I16LE);
    test::remove_dataset(raw, name);
    const std::string path = dir.file(std::string("no_") + name + ".h5");
    test::write_raw_h5(path, raw);
    expect_mentions(error_of([&] { ShardReader r(path, SampleRules{}); }),
                    {path, std::string("'") + name + "'", "missing"});
  }
  auto raw = test::raw_varlength(samples, H5T_STD_I16LE);
  test::remove_dataset(raw, "input_ids");
  const std::string path = dir.file("no_input_ids.h5");
  test::write_raw_h5(path, raw);
  expect_mentions(error_of([&] { ShardReader r(path, SampleRules{}); }),
                  {path, "'input_ids'", "missing"});
}

TEST(ShardBadFiles, WrongRank) {
  std::mt19937_64 rng(test::test_seed() + 8);
  test::TempDir dir;
  auto raw = test::raw_fixed(random_samples(rng, 12, 32, 4), 32, 4, H5T_STD_I16LE);
  test::find_dataset(raw, "next_sentence_labels").dims = {12, 1};
  const std::string path = dir.file("rank.h5");
  test::write_raw_h5(path, raw);
  expect_mentions(error_of([&] { ShardReader r(path, SampleRules{}); }),
                  {path, "'next_sentence_labels'", "wrong rank 2"});
}

TEST(ShardBadFiles, WrongDtype) {
  std::mt19937_64 rng(test::test_seed() + 9);
  test::TempDir dir;
  const std::vector<Sample> samples = random_samples(rng, 12, 32, 4);
  auto raw = test::raw_fixed(samples, 32, 4, H5T_STD_I16LE);
  test::find_dataset(raw, "input_ids").file_type = H5T_IEEE_F32LE;
  const std::string path = dir.file("float_ids.h5");
  test::write_raw_h5(path, raw);
  expect_mentions(error_of([&] { ShardReader r(path, SampleRules{}); }),
                  {path, "'input_ids'", "wrong dtype float32"});
  // The same for a dataset other than the one the format is detected from, and for vlen.
  raw = test::raw_varlength(samples, H5T_STD_I16LE);
  test::find_dataset(raw, "masked_lm_positions").file_type = H5T_IEEE_F64LE;
  const std::string vlen_path = dir.file("float_vlen.h5");
  test::write_raw_h5(vlen_path, raw);
  expect_mentions(error_of([&] { ShardReader r(vlen_path, SampleRules{}); }),
                  {vlen_path, "'masked_lm_positions'", "wrong dtype vlen float64"});
}

TEST(ShardBadFiles, DirectoryWithoutShards) {
  test::TempDir dir;
  std::ofstream(dir.file("README.txt")) << "no shards here\n";
  expect_mentions(error_of([&] { list_shards(dir.path()); }), {dir.path(), "no shard files"});
  expect_mentions(error_of([&] { inspect_shards(dir.path(), SampleRules{}); }),
                  {dir.path(), "no shard files"});
  expect_mentions(error_of([&] { ShardReader r(dir.path(), SampleRules{}); }),
                  {dir.path(), "directory"});
}

TEST(ListShards, FileOrSortedDirectory) {
  std::mt19937_64 rng(test::test_seed() + 10);
  test::TempDir dir;
  for (const char* name : {"b.h5", "a.hdf5", "c.HDF", "d.txt"})
    std::ofstream(dir.file(name)) << "x";
  std::filesystem::create_directory(dir.file("sub.h5"));  // a directory, not a shard
  EXPECT_EQ(list_shards(dir.path()),
            (std::vector<std::string>{dir.file("a.hdf5"), dir.file("b.h5"), dir.file("c.HDF")}));
  EXPECT_EQ(list_shards(dir.file("d.txt")), std::vector<std::string>{dir.file("d.txt")});
  EXPECT_EQ(parse_shard_format("varlength"), ShardFormat::var_length);
  EXPECT_EQ(parse_shard_format(to_string(ShardFormat::fixed)), ShardFormat::fixed);
  expect_mentions(error_of([] { parse_shard_format("packed"); }), {"'packed'"});
}

// The binary must exit non-zero with the same clear message (main's single error handler).
TEST(ShardBadFiles, BinaryInspectReportsBadFiles) {
  ASSERT_TRUE(std::filesystem::exists(PACKBERT_BINARY)) << PACKBERT_BINARY;
  std::mt19937_64 rng(test::test_seed() + 11);
  test::TempDir dir;
  const std::string text = dir.file("text.h5");
  std::ofstream(text) << "hello, not a shard\n";
  const std::string missing = dir.file("missing.h5");
  const std::string truncated = dir.file("truncated.h5");
  write_shard(truncated, random_samples(rng, 50, 128, 20), ShardWriteOptions{});
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) / 2);
  test::TempDir empty_dir;
  const std::pair<std::string, std::string> cases[] = {{missing, "does not exist"},
                                                       {text, "not an HDF5 file"},
                                                       {truncated, "truncated"},
                                                       {empty_dir.path(), "no shard files"}};
  for (const auto& [path, words] : cases) {
    std::string out;
    const int rc =
        test::run_command(std::string(PACKBERT_BINARY) + " inspect '" + path + "'", &out);
    EXPECT_NE(rc, 0) << path << ": " << out;
    EXPECT_NE(out.find(path), std::string::npos) << out;
    EXPECT_NE(out.find(words), std::string::npos) << "expected '" << words << "': " << out;
  }
  const std::string good = dir.file("good.h5");
  const std::vector<Sample> samples = random_samples(rng, 25, 64, 8);
  ShardWriteOptions opts;
  opts.max_seq_len = 64;
  opts.max_predictions = 8;
  write_shard(good, samples, opts);
  std::string out;
  EXPECT_EQ(test::run_command(std::string(PACKBERT_BINARY) + " inspect '" + good + "'", &out), 0)
      << out;
  EXPECT_NE(out.find("25"), std::string::npos) << out;
}

}  // namespace
}  // namespace packbert
