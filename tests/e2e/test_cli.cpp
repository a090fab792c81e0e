// The packbert binary as a user meets it: --help on each subcommand, TOML configs, log levels,
// errors that name what is wrong and exit non-zero.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "data/shards/shard.h"
#include "test_util.h"

namespace {

using packbert::test::run_command;
using packbert::test::TempDir;

const std::string kBin = PACKBERT_BINARY;

TEST(Cli, HelpOnEverySubcommand) {
  std::string out;
  ASSERT_EQ(run_command(kBin + " --help", &out), 0) << out;
  EXPECT_NE(out.find("prepare"), std::string::npos) << out;
  EXPECT_NE(out.find("inspect"), std::string::npos) << out;
  EXPECT_NE(out.find("--log-level"), std::string::npos) << out;
  ASSERT_EQ(run_command(kBin + " prepare --help", &out), 0) << out;
  for (const char* opt :
       {"--input", "--vocab", "--output", "--max-seq-len", "--max-predictions-per-seq",
        "--masked-lm-prob", "--dupe-factor", "--short-seq-prob", "--seed", "--num-shards",
        "--eval-samples", "--format", "--whole-word-masking", "--config", "--print-config",
        "--section.key=VALUE", "[prepare.max_seq_len]"})
    EXPECT_NE(out.find(opt), std::string::npos) << opt << " missing from prepare --help";
  for (const char* cmd : {"inspect", "pack", "train", "eval"}) {
    ASSERT_EQ(run_command(kBin + " " + cmd + " --help", &out), 0) << out;
    EXPECT_NE(out.find("--config"), std::string::npos) << cmd << "\n" << out;
    EXPECT_NE(out.find("--section.key=VALUE"), std::string::npos) << cmd << "\n" << out;
  }
  ASSERT_EQ(run_command(kBin + " inspect --help", &out), 0) << out;
  EXPECT_NE(out.find("--vocab-size"), std::string::npos) << out;
}

TEST(Cli, NoSubcommandOrUnknownOptionFails) {
  std::string out;
  EXPECT_NE(run_command(kBin, &out), 0) << out;
  EXPECT_NE(run_command(kBin + " inspect /nonexistent --no-such-option", &out), 0);
  EXPECT_NE(out.find("--no-such-option"), std::string::npos) << out;
}

TEST(Cli, UnknownLogLevelIsAnError) {
  std::string out;
  EXPECT_NE(run_command(kBin + " --log-level=loud inspect /nonexistent", &out), 0);
  EXPECT_NE(out.find("loud"), std::string::npos) << out;
}

TEST(Cli, ErrorNamesTheMissingPath) {
  TempDir dir;
  std::string out;
  const std::string missing = dir.file("no-such-shard.h5");
  EXPECT_EQ(run_command(kBin + " inspect " + missing, &out), 1) << out;
  EXPECT_NE(out.find(missing), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 0]"), std::string::npos) << "errors carry the rank prefix: " << out;
}

// Options come from a TOML file through --config after the subcommand; the command line
// overrides the file.
TEST(Cli, TomlConfigSetsSubcommandOptions) {
  TempDir dir;
  std::mt19937_64 rng(packbert::test::test_seed());
  std::vector<packbert::Sample> samples;
  for (int i = 0; i < 20; ++i) samples.push_back(packbert::test::random_sample(rng, 5, 64, 8));
  packbert::ShardWriteOptions wo;
  wo.max_seq_len = 64;
  wo.max_predictions = 8;
  const std::string shard = dir.file("s.h5");
  packbert::write_shard(shard, samples, wo);

  int64_t max_id = 0;
  for (const auto& s : samples) {
    for (int32_t t : s.input_ids) max_id = std::max<int64_t>(max_id, t);
    for (int32_t t : s.masked_lm_ids) max_id = std::max<int64_t>(max_id, t);
  }
  // A vocabulary smaller than the largest id: the shard must be rejected.
  const std::string cfg = dir.file("inspect.toml");
  std::ofstream(cfg) << "[inspect]\nvocab_size = " << max_id << "\n";
  std::string out;
  EXPECT_NE(run_command(kBin + " --log-level warn inspect --config " + cfg + " " + shard, &out), 0)
      << out;
  EXPECT_NE(out.find("outside the vocabulary"), std::string::npos) << out;
  EXPECT_NE(out.find(shard), std::string::npos) << out;
  // The command line wins over the file: an option, or the key as an override.
  EXPECT_EQ(run_command(kBin + " inspect --config " + cfg + " " + shard + " --vocab-size " +
                            std::to_string(max_id + 1),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("20"), std::string::npos) << out;
  EXPECT_EQ(run_command(kBin + " inspect --config " + cfg + " " + shard +
                            " --inspect.vocab_size=" + std::to_string(max_id + 1),
                        &out),
            0)
      << out;
  // The path may come from the file too.
  std::ofstream(cfg) << "[inspect]\npath = \"" << shard << "\"\n";
  EXPECT_EQ(run_command(kBin + " inspect --config " + cfg, &out), 0) << out;
  EXPECT_NE(out.find("20"), std::string::npos) << out;
}

}  // namespace
