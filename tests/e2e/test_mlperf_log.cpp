// The MLPerf log of a real `packbert train` run passes the MLPerf compliance checker
// (mlperf-logging, training ruleset 5.0.0, closed bert), and so does a short CPU run of
// configs/bert_large_phase2_mlperf_448.toml: its global batch, schedule and LAMB
// hyper-parameters as written but the peak rate, the model, device and data made small.
//
// What it proves: the log of an actual run -- every required key, in the required order, with
// the values the ruleset checks (LAMB hyper-parameters, eval samples, eval_accuracy at or above
// the 0.720 target with epoch_num = samples seen, run_stop success) -- is accepted by the
// official checker.
// What it does not prove: that packbert reaches 0.720 on the MLPerf Wikipedia data. To reach the
// target in seconds, the data here is learnable by construction: every masked position keeps
// its original token (the 10% "keep" case of BERT's masking, made 100%), and the eval set is the
// training set. A tiny model with the tied decoder learns to copy the input token quickly.
// (15% of the masked positions keep a random token instead, see below.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "train_cli_util.h"

namespace packbert::test {
namespace {

// The tests' Python (tests/CMakeLists.txt: the repository's .venv when there is one); empty
// (and the reason in *why) when it has no mlperf-logging.
bool have_checker(std::string* why) {
  const std::string python = PACKBERT_PYTHON3;
  std::string out;
  if (run_command(python + " -c 'import mlperf_logging.compliance_checker' 2>&1", &out) == 0)
    return true;
  *why = "skipped: mlperf-logging is not installed for " + python +
         " (run scripts/install_deps.sh --tests)\n" + out;
  return false;
}

// Learnable shards under dir/train and dir/eval (the same samples): 85% of the masked positions
// keep their token, so the accuracy settles near 0.85: the ruleset wants an eval_accuracy in
// [0.720, 1.0), and a copy task alone would reach 1.0.
void write_learnable_shards(const std::string& dir, uint64_t seed, int samples_count) {
  std::mt19937_64 rng(seed);
  ShardWriteOptions w;
  w.max_seq_len = 32;
  w.max_predictions = 5;
  std::bernoulli_distribution keep(0.85);
  std::vector<Sample> samples;
  for (int i = 0; i < samples_count; ++i) {
    Sample s = random_sample(rng, 12, 32, 5);
    for (size_t k = 0; k < s.masked_lm_positions.size(); ++k)
      if (keep(rng))
        s.input_ids[static_cast<size_t>(s.masked_lm_positions[k])] = s.masked_lm_ids[k];
    samples.push_back(std::move(s));
  }
  std::filesystem::create_directories(dir + "/train");
  std::filesystem::create_directories(dir + "/eval");
  write_shard(dir + "/train/part_00.h5", samples, w);
  write_shard(dir + "/eval/eval.h5", samples, w);
}

// The checker's verdict on `log` under `ruleset` ("5.0.0"): SUCCESS expected.
void expect_compliant(const std::string& dir, const std::string& log, const std::string& ruleset) {
  std::string out;
  ASSERT_EQ(run_command("cd " + dir + " && " + std::string(PACKBERT_PYTHON3) +
                            " -m "
                            "mlperf_logging.compliance_checker --usage training --ruleset " +
                            ruleset + " " + log + " 2>&1",
                        &out),
            0)
      << out << "\nlog:\n"
      << read_file(log);
  EXPECT_NE(out.find("SUCCESS"), std::string::npos) << out << "\nlog:\n" << read_file(log);
  std::printf("%s", out.c_str());
}

TEST(MlperfLog, RealRunPassesTheComplianceChecker) {
  std::string out;
  if (!have_checker(&out)) GTEST_SKIP() << out;
  TempDir tmp;
  const uint64_t seed = test_seed();
  write_learnable_shards(tmp.path(), seed, 64);
  const std::string log = tmp.file("mlperf.log");
  const std::string config = write_train_config(tmp.path(), seed);
  const std::string cmd =
      kBin + " train --config " + config +
      " --train.max_steps=400 --train.global_batch_size=16 --train.gradient_accumulation_steps=1"
      " --train.max_seq_len=32 --train.max_predictions_per_seq=5 --train.dropout=false"
      " --optim.lr=5e-3 --optim.warmup_steps=10 --eval.every_samples=320 --eval.max_samples=0"
      " --eval.target_accuracy=0.72 --checkpoint.dir= --checkpoint.every_steps=0"
      " --log.every_steps=20"
      " --log.mllog_file=" +
      log +
      " --log.submission_org=packbert"
      " --log.submission_platform=cpu 2>&1";
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  ASSERT_NE(out.find("target mlm accuracy 0.72 reached"), std::string::npos)
      << "the run did not reach the target, so the checker would (rightly) fail:\n"
      << out;
  expect_compliant(tmp.path(), log, "5.0.0");
}

// configs/bert_large_phase2_mlperf_448.toml as written but for what a CPU test cannot run: the
// tiny model on the CPU in fp32, sequences of 32 from learnable shards, an evaluation every 10
// steps of the whole (896-sample) eval set instead of every 150000 samples of 10000, and a peak
// rate of 5e-3 instead of 4.25e-4 (at which the tiny model takes about 900 steps, 6 minutes on
// two cores, to reach the target). Its global batch (448), the other LAMB hyper-parameters, the
// schedule's length (6700 steps) and warmup (none) and the MLPerf keys are the config's, and the
// run stops at the 0.720 target.
TEST(MlperfLog, Config448RunPassesTheComplianceChecker) {
  std::string out;
  if (!have_checker(&out)) GTEST_SKIP() << out;
  TempDir tmp;
  const uint64_t seed = test_seed();
  write_learnable_shards(tmp.path(), seed, 896);  // two steps of 448 per epoch
  const std::string log = tmp.file("mlperf.log");
  const std::string cmd =
      kBin + " train --config " + std::string(PACKBERT_SOURCE_DIR) +
      "/configs/bert_large_phase2_mlperf_448.toml --model.preset=tiny --train.device=cpu"
      " --train.precision=fp32 --train.max_seq_len=32 --train.max_predictions_per_seq=5"
      " --train.seed=" +
      std::to_string(seed % 1000000) + " --optim.lr=5e-3" + " --data.train_dir=" + tmp.path() +
      "/train --data.eval_dir=" + tmp.path() +
      "/eval"
      " --data.vocab=" +
      kVocab +
      " --eval.every_samples=4480 --eval.max_samples=0"
      " --eval.batch_size=64 --log.every_steps=10 --log.metrics_file=" +
      tmp.file("m.jsonl") + " --log.mllog_file=" + log +
      " --log.submission_org=packbert"
      " --log.submission_platform=cpu 2>&1";
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  ASSERT_NE(out.find("target mlm accuracy 0.72 reached"), std::string::npos)
      << "the run did not reach the target, so the checker would (rightly) fail:\n"
      << out;
  const std::string text = read_file(log);
  for (const char* key : {"\"global_batch_size\", \"value\": 448",
                          "\"opt_learning_rate_training_steps\", \"value\": 6700",
                          "\"opt_learning_rate_warmup_steps\", \"value\": 0"})
    EXPECT_NE(text.find(key), std::string::npos) << key << " not in the log:\n" << text;
  expect_compliant(tmp.path(), log, "5.0.0");
}

}  // namespace
}  // namespace packbert::test
