// `packbert train` against shards that record how they were made (ShardMeta): shards of another
// tokenizer, of another vocabulary size, without masks under static masking, or document chunks
// under an NSP head are refused before training, naming the shard and both sides; shards
// prepared as documents without masks train an MLM-only model with dynamic masking.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "train_cli_util.h"

namespace packbert::test {
namespace {

const std::string kCorpus = std::string(PACKBERT_REPO_DATA) + "/kjv-bible-docs.txt.gz";

// The file's SHA-256 as coreutils' sha256sum prints it.
std::string sha256_of(const std::string& path) {
  std::string out;
  EXPECT_EQ(run_command("sha256sum " + path, &out), 0) << out;
  return out.substr(0, 64);
}

class OwnCorpusCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    // Pairs with static masks, and documents without masks, both from the bundled corpus.
    const std::string common = kBin + " prepare --input " + kCorpus + " --vocab " + kVocab +
                               " --max-seq-len 64 --max-predictions-per-seq 10 --eval-samples "
                               "40 --dupe-factor 1 --format varlength --threads 2";
    std::string out;
    ASSERT_EQ(run_command(common + " --output " + dir_->file("pairs"), &out), 0) << out;
    ASSERT_EQ(
        run_command(common + " --samples documents --masks none --output " + dir_->file("docs"),
                    &out),
        0)
        << out;
    // A vocabulary of the same size whose file differs (one token renamed).
    std::string vocab = read_file(kVocab);
    const size_t at = vocab.find("[unused0]");
    ASSERT_NE(at, std::string::npos);
    vocab.replace(at, 9, "[unused_]");
    std::ofstream(dir_->file("other_vocab.txt")) << vocab;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // `packbert train` for 3 steps on the prepared `data` ("pairs" or "docs"), with `args`.
  static int train(const std::string& data, const std::string& args, std::string* out) {
    const std::string run = dir_->file("run_" + std::to_string(runs_++));
    std::filesystem::create_directories(run);
    write_train_config(run, 7,
                       "");  // the tiny model over run/, redirected below to the prepared data
    const std::string d = dir_->file(data);
    return run_command(kBin + " train --config " + run + "/config.toml --train.max_steps=3" +
                           " --data.train_dir=" + d + "/train --data.eval_dir=" + d + "/eval " +
                           args + " 2>&1",
                       out);
  }

  static TempDir* dir_;
  static int runs_;
};
TempDir* OwnCorpusCli::dir_ = nullptr;
int OwnCorpusCli::runs_ = 0;

TEST_F(OwnCorpusCli, ShardsMadeOtherwiseAreRefusedNamingBothSides) {
  struct Case {
    const char* name;
    std::string data, args;
    std::vector<std::string> needles;
  };
  const std::string sha = sha256_of(kVocab), other = dir_->file("other_vocab.txt");
  const std::vector<Case> cases = {
      {"another tokenizer",
       "pairs",
       "--data.vocab=" + other,
       {"part-00000-of-00001.h5", "made with tokenizer vocab.txt (sha256 " + sha + ")",
        "the configured tokenizer is " + other + " (sha256 " + sha256_of(other) + ")"}},
      {"another vocabulary size",
       "pairs",
       "--model.vocab_size=40000",
       {"part-00000-of-00001.h5", "has 30522 tokens, but the model's vocabulary has 40000",
        "model.vocab_size = 30522"}},
      {"no masks, static masking",
       "docs",
       "--model.nsp_head=false",
       {"part-00000-of-00001.h5", "holds no masks (prepare --masks none)"}},
      {"documents, NSP head",
       "docs",
       "--data.masking=dynamic",
       {"part-00000-of-00001.h5", "document chunks without NSP pairs", "model.nsp_head = false"}},
  };
  for (const Case& c : cases) {
    std::string out;
    EXPECT_NE(train(c.data, c.args, &out), 0) << c.name << "\n" << out;
    for (const std::string& n : c.needles)
      EXPECT_NE(out.find(n), std::string::npos) << c.name << ": no \"" << n << "\" in\n" << out;
    EXPECT_EQ(out.find("step 1/3"), std::string::npos) << c.name << ": trained\n" << out;
  }
}

TEST_F(OwnCorpusCli, DocumentsWithoutMasksTrainWithDynamicMasking) {
  std::string out;
  ASSERT_EQ(train("docs", "--model.nsp_head=false --data.masking=dynamic", &out), 0) << out;
  EXPECT_NE(out.find("step 3/3"), std::string::npos) << out;
  EXPECT_NE(out.find("eval at step"), std::string::npos) << out;  // the masked eval shard
  // inspect prints the record of the shards' making: the eval shard is masked either way.
  ASSERT_EQ(run_command(kBin + " inspect " + dir_->file("docs/train"), &out), 0) << out;
  EXPECT_NE(out.find("masks none, samples documents"), std::string::npos) << out;
  EXPECT_NE(out.find("vocab.txt (sha256 " + sha256_of(kVocab) + "), 30522 tokens"),
            std::string::npos)
      << out;
  ASSERT_EQ(run_command(kBin + " inspect " + dir_->file("docs/eval"), &out), 0) << out;
  EXPECT_NE(out.find("masks static, samples documents"), std::string::npos) << out;
}

}  // namespace
}  // namespace packbert::test
