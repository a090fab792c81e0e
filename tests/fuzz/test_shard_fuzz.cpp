// Fuzzing the shard reader with damaged files: valid small shards (both formats) get random
// byte flips, runs of bytes and truncations; every read must either yield only valid samples
// or throw packbert::Error. Each read runs in a forked child, so a crash (or hang) inside
// libhdf5 becomes a test failure naming the mutation instead of killing the test binary.
// The libhdf5 crash classes this found, and the reader's guards against them, are listed in
// src/data/shards/shard_guard.h; tests/unit/test_shard_damage.cpp has one regression test per
// class.
//
// PACKBERT_FUZZ_ITERATIONS=<n> sets the mutations per format (default 300);
// PACKBERT_TEST_SEED=<seed> reproduces a run; PACKBERT_FUZZ_KEEP=<dir> keeps a copy of every
// damaged file that failed, for a debugger; PACKBERT_FUZZ_OFFSETS=<begin>:<end> damages only
// bytes in [begin, end) (e.g. 0:1024 for the superblock and the root group).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "data/shards/shard.h"
#include "shard_fork_read.h"
#include "shard_test_util.h"
#include "test_util.h"

namespace packbert {
namespace {

using test::Outcome;
using test::read_in_child;

constexpr int kLen = 32, kPred = 5, kRows = 40;

// ---- where a byte of the file belongs, to tell which structures a failure comes from ----

struct Region {
  uint64_t begin = 0, end = 0;
  std::string name;
};

// Regions of a pristine shard: superblock, object headers, raw data chunks (exact, from the
// HDF5 API) and global heap collections (vlen data, found by their "GCOL" signature). Bytes in
// none of them are other metadata: B-tree nodes, the root group's symbol table and local heap.
std::vector<Region> map_regions(const std::string& path, const std::string& bytes) {
  std::vector<Region> regions;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return regions;
  H5F_info2_t finfo;
  if (H5Fget_info2(file, &finfo) >= 0) regions.push_back({0, finfo.super.super_size, "superblock"});
  H5O_info_t oinfo;
  if (H5Oget_info2(file, &oinfo, H5O_INFO_BASIC | H5O_INFO_HDR) >= 0)
    regions.push_back({oinfo.addr, oinfo.addr + oinfo.hdr.space.total, "root group header"});
  for (const char* name : {"input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                           "masked_lm_ids", "next_sentence_labels"}) {
    if (H5Lexists(file, name, H5P_DEFAULT) <= 0) continue;
    const hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
    if (H5Oget_info2(ds, &oinfo, H5O_INFO_BASIC | H5O_INFO_HDR) >= 0)
      regions.push_back({oinfo.addr, oinfo.addr + oinfo.hdr.space.total,
                         std::string("object header of '") + name + "'"});
    const hid_t space = H5Dget_space(ds);
    hsize_t chunks = 0;
    H5Dget_num_chunks(ds, space, &chunks);
    for (hsize_t c = 0; c < chunks; ++c) {
      hsize_t offset[2];
      unsigned filter_mask = 0;
      haddr_t addr = 0;
      hsize_t size = 0;
      if (H5Dget_chunk_info(ds, space, c, offset, &filter_mask, &addr, &size) >= 0)
        regions.push_back({addr, addr + size, std::string("raw chunk of '") + name + "'"});
    }
    H5Sclose(space);
    H5Dclose(ds);
  }
  H5Fclose(file);
  // Global heap collection: "GCOL", version, 3 reserved bytes, 8-byte little-endian size.
  for (size_t at = bytes.find("GCOL"); at != std::string::npos; at = bytes.find("GCOL", at + 4)) {
    uint64_t size = 0;
    if (at + 16 <= bytes.size()) std::memcpy(&size, bytes.data() + at + 8, 8);
    regions.push_back({at, at + size, "global heap (vlen data)"});
  }
  return regions;
}

std::string region_of(const std::vector<Region>& regions, uint64_t offset) {
  for (const Region& r : regions)
    if (offset >= r.begin && offset < r.end) return r.name;
  return "other metadata (B-tree / symbol table / local heap)";
}

// ---- mutations ---------------------------------------------------------------------------

struct Mutation {
  enum class Kind { byte_flip, byte_run, truncation } kind = Kind::byte_flip;
  uint64_t offset = 0;  // first byte changed, or the new size for a truncation
  std::string bytes;    // the new bytes
  std::string describe() const {
    if (kind == Kind::truncation) return fmt::format("truncate to {} bytes", offset);
    std::string hex;
    for (size_t i = 0; i < bytes.size() && i < 8; ++i)
      hex += fmt::format("{:02x}", static_cast<unsigned char>(bytes[i]));
    if (bytes.size() > 8) hex += "...";
    return fmt::format("{} of {} byte(s) at offset {}: {}",
                       kind == Kind::byte_flip ? "byte flip" : "byte run", bytes.size(), offset,
                       hex);
  }
};

// The byte range mutations start in: the whole file unless PACKBERT_FUZZ_OFFSETS narrows it.
std::pair<uint64_t, uint64_t> offset_range(uint64_t size) {
  uint64_t begin = 0, end = size;
  if (const char* s = std::getenv("PACKBERT_FUZZ_OFFSETS")) {
    unsigned long long b = 0, e = 0;
    if (std::sscanf(s, "%llu:%llu", &b, &e) == 2 && b < e) {
      begin = std::min<uint64_t>(b, size - 2);
      end = std::min<uint64_t>(std::max<uint64_t>(e, begin + 2), size);
    }
  }
  return {begin, end};
}

Mutation random_mutation(std::mt19937_64& rng, const std::string& file) {
  Mutation m;
  const int kind = std::uniform_int_distribution<int>(0, 9)(rng);  // 5:4:1
  const uint64_t size = file.size();
  const auto [first, last] = offset_range(size);
  std::uniform_int_distribution<int> byte(0, 255);
  if (kind < 5) {
    m.kind = Mutation::Kind::byte_flip;
    m.offset = std::uniform_int_distribution<uint64_t>(first, last - 1)(rng);
    const auto old = static_cast<unsigned char>(file[m.offset]);
    // Half single-bit flips (the subtle damage), half arbitrary different bytes.
    const unsigned char v =
        rng() & 1 ? old ^ (1u << (rng() % 8)) : static_cast<unsigned char>(old ^ (1 + rng() % 255));
    m.bytes.assign(1, static_cast<char>(v));
  } else if (kind < 9) {
    m.kind = Mutation::Kind::byte_run;
    const uint64_t len = std::uniform_int_distribution<uint64_t>(2, 64)(rng);
    m.offset = std::uniform_int_distribution<uint64_t>(first, last - 2)(rng);
    const uint64_t n = std::min(len, size - m.offset);
    const int fill = std::uniform_int_distribution<int>(0, 2)(rng);  // zeros, 0xff, random
    for (uint64_t i = 0; i < n; ++i)
      m.bytes += static_cast<char>(fill == 0 ? 0 : fill == 1 ? 0xff : byte(rng));
  } else {
    m.kind = Mutation::Kind::truncation;
    m.offset = std::uniform_int_distribution<uint64_t>(std::max<uint64_t>(first, 1), last - 1)(rng);
  }
  return m;
}

std::string apply(const Mutation& m, std::string file) {
  if (m.kind == Mutation::Kind::truncation) return file.substr(0, m.offset);
  file.replace(m.offset, m.bytes.size(), m.bytes);
  return file;
}

int iterations_per_format() {
  if (const char* s = std::getenv("PACKBERT_FUZZ_ITERATIONS")) return std::max(1, std::atoi(s));
  return 300;
}

void fuzz_format(ShardFormat format) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed ^ (format == ShardFormat::fixed ? 0x9e3779b97f4a7c15ull : 0));
  test::TempDir dir;
  const std::string pristine = dir.file("pristine.h5");
  ShardWriteOptions opts;
  opts.format = format;
  opts.max_seq_len = kLen;
  opts.max_predictions = kPred;
  opts.chunk_samples = 16;  // several chunks: B-tree nodes with more than one entry
  write_shard(pristine, test::random_samples(rng, kRows, kLen, kPred), opts);
  const std::string original = test::read_file(pristine);
  const std::vector<Region> regions = map_regions(pristine, original);

  std::string message;
  ASSERT_EQ(read_in_child(pristine, &message), Outcome::valid) << message;

  const std::string damaged = dir.file("damaged.h5");
  std::map<std::string, std::map<std::string, int>> by_region;  // region -> outcome -> count
  int failures = 0;
  const int iterations = iterations_per_format();
  for (int i = 0; i < iterations; ++i) {
    const Mutation m = random_mutation(rng, original);
    std::ofstream(damaged, std::ios::binary | std::ios::trunc) << apply(m, original);
    const Outcome outcome = read_in_child(damaged, &message);
    const std::string region =
        m.kind == Mutation::Kind::truncation ? "truncation" : region_of(regions, m.offset);
    ++by_region[region][to_string(outcome)];
    if (outcome == Outcome::valid || outcome == Outcome::rejected) continue;
    ++failures;
    if (const char* keep = std::getenv("PACKBERT_FUZZ_KEEP"))
      std::filesystem::copy_file(damaged, fmt::format("{}/{}-{}.h5", keep, to_string(format), i),
                                 std::filesystem::copy_options::overwrite_existing);
    ADD_FAILURE() << to_string(format) << " shard, seed " << seed << ", mutation " << i << ": "
                  << m.describe() << " [" << region << "] -> " << to_string(outcome) << ": "
                  << message;
  }
  std::printf("%s shard (%zu bytes), %d mutations, seed %llu:\n", to_string(format),
              original.size(), iterations, static_cast<unsigned long long>(seed));
  for (const auto& [region, outcomes] : by_region) {
    std::string line;
    for (const auto& [outcome, count] : outcomes)
      line += fmt::format("{}{} {}", line.empty() ? "" : ", ", count, outcome);
    std::printf("  %-52s %s\n", region.c_str(), line.c_str());
  }
  EXPECT_EQ(failures, 0);
}

TEST(ShardFuzz, FixedFormatDamage) { fuzz_format(ShardFormat::fixed); }

TEST(ShardFuzz, VarLengthFormatDamage) { fuzz_format(ShardFormat::var_length); }

}  // namespace
}  // namespace packbert
