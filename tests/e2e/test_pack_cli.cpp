// `packbert pack` through the binary: the table names every algorithm, and the JSON output's
// strategies, read back independently, reproduce the input histogram within L and K.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/shards/shard.h"
#include "test_util.h"

namespace {

using packbert::test::run_command;
using packbert::test::TempDir;

const std::string kBin = PACKBERT_BINARY;
const std::string kWiki = std::string(PACKBERT_TEST_DATA) + "/wikipedia-seqlen-histogram-512.txt";

std::vector<int64_t> read_histogram(const std::string& path) {
  std::ifstream f(path);
  std::vector<int64_t> counts;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty() && line[0] != '#') counts.push_back(std::stoll(line));
  return counts;
}

// The command with its stderr (logs) dropped, so that the captured output is the JSON alone.
std::string stdout_only(const std::string& cmd) { return "(" + cmd + " 2>/dev/null)"; }

// Every strategy fits L and K; the strategies times repeats give back the histogram.
void check_strategies(const nlohmann::json& result, const std::vector<int64_t>& histogram, int L,
                      int K) {
  std::vector<int64_t> packed(histogram.size(), 0);
  int64_t packs = 0;
  for (const auto& s : result.at("strategies")) {
    const auto lengths = s.at("lengths").get<std::vector<int>>();
    const int64_t repeat = s.at("repeat").get<int64_t>();
    ASSERT_GT(repeat, 0);
    int sum = 0;
    for (int len : lengths) {
      ASSERT_GE(len, 1);
      ASSERT_LE(len, static_cast<int>(histogram.size()));
      packed[len - 1] += repeat;
      sum += len;
    }
    ASSERT_LE(sum, L) << result.at("algorithm");
    if (K > 0) {
      ASSERT_LE(static_cast<int>(lengths.size()), K) << result.at("algorithm");
    }
    packs += repeat;
  }
  EXPECT_EQ(packed, histogram) << result.at("algorithm") << ": not every sequence packed once";
  EXPECT_EQ(packs, result.at("packs").get<int64_t>());
}

TEST(PackCli, TableListsEveryAlgorithm) {
  std::string out;
  ASSERT_EQ(run_command(kBin + " pack --histogram " + kWiki +
                            " --max-seq-len 512 --max-seqs-per-pack 3 --algorithm all",
                        &out),
            0)
      << out;
  for (const char* name : {"spfhp", "lpfhp", "nnlshp", "exact-fit", "efficiency"})
    EXPECT_NE(out.find(name), std::string::npos) << name << " missing:\n" << out;
}

TEST(PackCli, JsonStrategiesReproduceTheHistogram) {
  const std::vector<int64_t> histogram = read_histogram(kWiki);
  for (int K : {3, 0}) {
    std::string out;
    ASSERT_EQ(run_command(stdout_only(kBin + " pack --histogram " + kWiki +
                                      " --max-seq-len 512 --max-seqs-per-pack " +
                                      std::to_string(K) + " --algorithm exact-fit --json"),
                          &out),
              0)
        << out;
    const auto j = nlohmann::json::parse(out);
    ASSERT_EQ(j.at("results").size(), 1u);
    const auto& r = j.at("results")[0];
    check_strategies(r, histogram, 512, K);
    // Efficiency recomputed from the strategies: tokens / (packs * L).
    int64_t tokens = 0;
    for (size_t i = 0; i < histogram.size(); ++i) tokens += histogram[i] * int64_t(i + 1);
    const double eff = double(tokens) / (r.at("packs").get<double>() * 512);
    EXPECT_NEAR(eff, r.at("efficiency").get<double>(), 1e-12);
    EXPECT_GE(eff, K == 3 ? 0.9975 : 0.999);
  }
}

TEST(PackCli, DataDirectoryUsesSampleLengths) {
  TempDir dir;
  std::mt19937_64 rng(packbert::test::test_seed());
  std::vector<packbert::Sample> samples;
  std::vector<int64_t> histogram(128, 0);
  for (int i = 0; i < 300; ++i) {
    samples.push_back(packbert::test::random_sample(rng, 5, 128, 20));
    histogram[samples.back().length() - 1]++;
  }
  packbert::ShardWriteOptions wo;
  wo.format = packbert::ShardFormat::var_length;
  packbert::write_shard(dir.file("a.h5"), samples, wo);
  std::string out;
  ASSERT_EQ(run_command(stdout_only(kBin + " pack --data " + dir.path() +
                                    " --max-seq-len 128 --max-seqs-per-pack 4 --algorithm all"
                                    " --json"),
                        &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_GE(j.at("results").size(), 3u);
  for (const auto& r : j.at("results")) check_strategies(r, histogram, 128, 4);
}

TEST(PackCli, BadInputFailsClearly) {
  TempDir dir;
  std::string out;
  EXPECT_NE(run_command(kBin + " pack --data " + dir.path(), &out), 0) << out;
  EXPECT_NE(out.find(dir.path()), std::string::npos) << out;
  EXPECT_NE(run_command(kBin + " pack", &out), 0) << out;
  EXPECT_NE(out.find("--histogram"), std::string::npos) << out;
  std::ofstream(dir.file("h.txt")) << "3\nfour\n";
  EXPECT_NE(run_command(kBin + " pack --histogram " + dir.file("h.txt"), &out), 0) << out;
  EXPECT_NE(out.find("h.txt"), std::string::npos) << out;
}

}  // namespace
