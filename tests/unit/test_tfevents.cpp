// train/tfevents.h: CRC-32C against RFC 3720's test vectors and a bit-at-a-time reference, and
// the TFRecord scan against records cut short or corrupted at random bytes. (TensorBoard's own
// reader reads the files in tests/e2e/test_tensorboard_cli.cpp.)
#include "train/tfevents.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace packbert {
namespace {

// Bit at a time, from the definition: reflected polynomial 0x82F63B78, init and final xor ~0.
uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (const char ch : s) {
    c ^= static_cast<unsigned char>(ch);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(TfEvents, Crc32cMatchesRfc3720AndTheDefinition) {
  // RFC 3720 (iSCSI), appendix B.4: 32 bytes of zeros, of ones, incrementing, decrementing.
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, '\0'), dec(32, '\0');
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), inc.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec.data(), dec.size()), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the catalogue's check value

  std::mt19937_64 rng(test::test_seed());
  for (int t = 0; t < 200; ++t) {
    std::string s(std::uniform_int_distribution<size_t>(0, 300)(rng), '\0');
    for (char& ch : s) ch = static_cast<char>(rng());
    const uint32_t c = crc32c_bitwise(s);
    ASSERT_EQ(crc32c(s.data(), s.size()), c) << "length " << s.size();
    EXPECT_EQ(masked_crc32c(s.data(), s.size()), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  }
}

// Random events framed one after another: the scan finds each end and step; a file cut at a
// random byte keeps the records that end before it; a flipped byte stops the scan at the record
// it falls in.
TEST(TfEvents, ScanStopsAtTheFirstIncompleteOrCorruptRecord) {
  std::mt19937_64 rng(test::test_seed());
  for (int t = 0; t < 100; ++t) {
    std::string file;
    std::vector<std::pair<size_t, int64_t>> want;
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    for (int i = 0; i < n; ++i) {
      const int64_t step = std::uniform_int_distribution<int64_t>(0, int64_t{1} << 40)(rng);
      std::vector<std::pair<std::string, double>> scalars(
          std::uniform_int_distribution<size_t>(0, 5)(rng));
      for (auto& [tag, v] : scalars) {
        tag = "train/x" + std::to_string(rng() % 1000);
        v = std::normal_distribution<double>()(rng);
      }
      const std::string e = i % 3 == 2
                                ? event_text(1.5, step, "config", std::string(rng() % 500, 'a'))
                                : event_scalars(1e9, step, scalars);
      file += tfrecord(e);
      want.emplace_back(file.size(), step);
    }
    const TfRecordScan whole = scan_tfrecords(file);
    ASSERT_EQ(whole.records, want);
    EXPECT_EQ(whole.complete_bytes, file.size());

    const size_t cut = std::uniform_int_distribution<size_t>(0, file.size())(rng);
    const TfRecordScan part = scan_tfrecords(file.substr(0, cut));
    size_t complete = 0;
    while (complete < want.size() && want[complete].first <= cut) ++complete;
    ASSERT_EQ(part.records.size(), complete) << "cut at " << cut;
    EXPECT_EQ(part.complete_bytes, complete ? want[complete - 1].first : 0);

    std::string bad = file;
    const size_t at = std::uniform_int_distribution<size_t>(0, file.size() - 1)(rng);
    bad[at] = static_cast<char>(bad[at] ^ (1 << (rng() % 8)));
    size_t before = 0;
    while (want[before].first <= at) ++before;
    const TfRecordScan corrupt = scan_tfrecords(bad);
    EXPECT_EQ(corrupt.records.size(), before) << "byte " << at << " flipped";
  }
}

}  // namespace
}  // namespace packbert
