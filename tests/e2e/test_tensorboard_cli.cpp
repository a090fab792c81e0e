// `packbert train` with log.tensorboard_dir, read back by TensorBoard's own readers
// (tests/e2e/tensorboard_read.py: EventAccumulator and the raw EventFileLoader): every scalar of
// every metrics record equals the JSONL's exactly, the config is there, a live run shows the
// steps written so far, a killed run's complete records all read, and a resumed run leaves no
// step twice.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train_cli_util.h"

namespace packbert::test {
namespace {

using TagStep = std::pair<std::string, int64_t>;
using Scalars = std::map<TagStep, double>;

class TensorBoardCli : public TrainDataSuite {
 protected:
  static std::string train_cmd(const std::string& dir, const std::string& args) {
    return kBin + " train --config " + dir + "/config.toml " + args + " >> " + dir +
           "/log.txt 2>&1";
  }

  // What the readers see in each logdir (tensorboard_read.py's objects, in order).
  static std::vector<nlohmann::json> read_logdirs(const std::vector<std::string>& dirs) {
    std::string cmd = std::string(PACKBERT_PYTHON3) + " " + PACKBERT_SOURCE_DIR +
                      "/tests/e2e/tensorboard_read.py";
    for (const std::string& d : dirs) cmd += " " + d;
    std::string out;
    const int rc = run_command(cmd + " 2>/dev/null", &out);
    EXPECT_EQ(rc, 0) << cmd << " (tensorboard missing? scripts/install_deps.sh --tests)";
    if (rc != 0) return std::vector<nlohmann::json>(dirs.size());
    return nlohmann::json::parse(out).get<std::vector<nlohmann::json>>();
  }
  static nlohmann::json read_logdir(const std::string& dir) { return read_logdirs({dir})[0]; }

  static Scalars reader_scalars(const nlohmann::json& read) {
    Scalars s;
    for (const auto& v : read.at("scalars")) {
      const TagStep key{v[0].get<std::string>(), v[1].get<int64_t>()};
      EXPECT_TRUE(s.emplace(key, v[2].get<double>()).second)
          << key.first << " twice at step " << key.second;
    }
    return s;
  }

  // The numbers of metrics records as the writer tags them ("train/loss", objects flattened) and
  // as TensorBoard holds them; a later record of the same tag and step replaces an earlier one.
  static void add_record(const nlohmann::json& j, const std::string& prefix, Scalars& out,
                         int64_t step) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "event" || (prefix.find('/') == std::string::npos && it.key() == "step"))
        continue;
      if (it->is_object()) add_record(*it, prefix + "/" + it.key(), out, step);
      // TensorBoard's scalars are float32: the JSONL's double rounded to the nearest float.
      if (it->is_number())
        out[{prefix + "/" + it.key(), step}] = static_cast<float>(it->get<double>());
    }
  }
  static Scalars jsonl_scalars(const std::string& path, int64_t from_step = 0,
                               int64_t to_step = INT64_MAX) {
    Scalars s;
    for (const char* event : {"train", "eval"})
      for (const auto& r : read_records(path, event)) {
        const int64_t step = r.at("step").get<int64_t>();
        if (step >= from_step && step <= to_step) add_record(r, event, s, step);
      }
    return s;
  }

  // Every (tag, step) of every event of every file, raw: none twice.
  static void expect_no_step_twice(const nlohmann::json& read) {
    std::set<TagStep> seen;
    size_t events = 0;
    for (const auto& file : read.at("files"))
      for (const auto& e : file[1]) {
        ++events;
        for (const auto& tag : e[1])
          EXPECT_TRUE(seen.emplace(tag.get<std::string>(), e[0].get<int64_t>()).second)
              << tag << " at step " << e[0] << " twice in the raw files";
      }
    EXPECT_GT(events, 0u);
  }

  static void expect_equal(const Scalars& reader, const Scalars& want) {
    EXPECT_EQ(reader.size(), want.size());
    size_t compared = 0;
    for (const auto& [key, value] : want) {
      const auto it = reader.find(key);
      if (it == reader.end()) {
        ADD_FAILURE() << key.first << " at step " << key.second << " missing from TensorBoard";
        continue;
      }
      EXPECT_EQ(it->second, value) << key.first << " at step " << key.second;
      ++compared;
    }
    EXPECT_GT(compared, 0u);
  }
};

// A finished run: every scalar of every train and eval record, and nothing else, at its step,
// equal to the JSONL's double rounded to the nearest float; the config text is `--print-config`'s.
TEST_F(TensorBoardCli, ScalarsEqualTheJsonlExactlyAndTheConfigIsThere) {
  const std::string dir = run_dir("run");
  const std::string args = "--log.tensorboard_dir=" + dir + "/tb";
  ASSERT_EQ(run_command(train_cmd(dir, args)), 0) << read_file(dir + "/log.txt");
  const Scalars want = jsonl_scalars(dir + "/metrics.jsonl");
  ASSERT_EQ(read_records(dir + "/metrics.jsonl", "train").size(), 12u);
  ASSERT_EQ(read_records(dir + "/metrics.jsonl", "eval").size(), 3u);
  EXPECT_TRUE(want.count({"train/loss", 12}) && want.count({"eval/eval_accuracy", 12}));
  const nlohmann::json read = read_logdir(dir + "/tb");
  expect_equal(reader_scalars(read), want);
  expect_no_step_twice(read);

  std::string config;
  ASSERT_EQ(run_command(kBin + " train --config " + dir + "/config.toml " + args +
                            " --print-config 2>/dev/null",
                        &config),
            0);
  ASSERT_EQ(read.at("texts").size(), 1u);
  EXPECT_EQ(read["texts"][0][0], "config");
  EXPECT_EQ(read["texts"][0][1], 0);
  EXPECT_EQ(read["texts"][0][2].get<std::string>(), "```toml\n" + config + "```");
}

// A run still going: the reader sees every step the JSONL holds (the event file is written
// first and flushed), while the process runs.
TEST_F(TensorBoardCli, LiveRunShowsTheStepsWrittenSoFar) {
  const std::string dir = run_dir("live");
  Background p(train_cmd(dir, "--log.tensorboard_dir=" + dir +
                                  "/tb --train.max_steps=100000 "
                                  "--checkpoint.every_steps=0 --eval.every_samples=0 "
                                  "--eval.at_end=false"));
  ASSERT_TRUE(wait_for_step(p, dir + "/metrics.jsonl", 5)) << read_file(dir + "/log.txt");
  const Scalars so_far = jsonl_scalars(dir + "/metrics.jsonl");
  const Scalars reader = reader_scalars(read_logdir(dir + "/tb"));
  ASSERT_TRUE(p.running()) << "the run ended before the reader was done";
  p.signal_group(SIGKILL);
  p.wait();
  size_t found = 0;
  for (const auto& [key, value] : so_far) {
    const auto it = reader.find(key);
    ASSERT_NE(it, reader.end()) << key.first << " at step " << key.second;
    EXPECT_EQ(it->second, value) << key.first << " at step " << key.second;
    ++found;
  }
  EXPECT_GE(found, 5u);
  std::printf("live: the reader saw %zu scalars (the JSONL held %zu) while the run went on\n",
              reader.size(), so_far.size());
}

// A run resumed from its checkpoint of step 6 after it logged up to step 12: the files are cut
// after step 6, so that no reader sees a step twice, and TensorBoard shows steps 1..6 of the
// first run and 7..12 of the resumed one (the config text of each: at 0 and at 7).
TEST_F(TensorBoardCli, ResumeLeavesNoStepTwice) {
  const std::string a = run_dir("first"), b = run_dir("resumed");
  const std::string tb = "--log.tensorboard_dir=" + a + "/tb";
  ASSERT_EQ(run_command(train_cmd(a, tb + " --checkpoint.keep=5")), 0) << read_file(a + "/log.txt");
  ASSERT_EQ(run_command(train_cmd(b, tb + " --resume " + a + "/ckpt/step_00000006")), 0)
      << read_file(b + "/log.txt");
  Scalars want = jsonl_scalars(a + "/metrics.jsonl", 0, 6);
  const Scalars later = jsonl_scalars(b + "/metrics.jsonl");
  for (const auto& [key, value] : later) ASSERT_GE(key.second, 7) << key.first;
  want.insert(later.begin(), later.end());
  ASSERT_TRUE(want.count({"train/loss", 12}) && want.count({"eval/eval_accuracy", 4}) &&
              want.count({"eval/eval_accuracy", 12}));

  const nlohmann::json read = read_logdir(a + "/tb");
  EXPECT_EQ(read.at("files").size(), 2u);
  expect_no_step_twice(read);
  expect_equal(reader_scalars(read), want);
  std::vector<std::pair<std::string, int64_t>> texts;
  for (const auto& t : read.at("texts")) texts.emplace_back(t[0], t[1]);
  EXPECT_EQ(texts, (std::vector<std::pair<std::string, int64_t>>{{"config", 0}, {"config", 7}}));
}

// SIGKILL at a random step: the reader reads every complete record of the file, and of the file
// cut at random bytes (a record cut short by the kill) exactly the records that end before the
// cut; then `--resume auto` leaves no step twice and the JSONL's latest values.
TEST_F(TensorBoardCli, KilledRunReadsEveryCompleteRecordAndResumes) {
  std::mt19937_64 rng(seed_);
  const std::string dir = run_dir("killed");
  const std::string args = "--log.tensorboard_dir=" + dir + "/tb --train.max_steps=20";
  const int64_t kill_at = std::uniform_int_distribution<int64_t>(4, 12)(rng);
  {
    Background p(train_cmd(dir, args));
    ASSERT_TRUE(wait_for_step(p, dir + "/metrics.jsonl", kill_at)) << read_file(dir + "/log.txt");
    p.signal_group(SIGKILL);
    EXPECT_EQ(p.wait(), 128 + SIGKILL);
    ASSERT_TRUE(wait_unlocked(dir + "/ckpt/.packbert.lock"));
  }
  const auto files = std::filesystem::directory_iterator(dir + "/tb");
  const std::string file = files->path().string();
  const std::string bytes = read_file(file);

  // Cuts of the killed run's file, each in a logdir of its own.
  std::vector<std::string> dirs = {dir + "/tb"};
  std::vector<size_t> cuts;
  for (int i = 0; i < 6; ++i) {
    cuts.push_back(std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng));
    dirs.push_back(dir + "/cut" + std::to_string(i));
    std::filesystem::create_directories(dirs.back());
    std::FILE* f =
        std::fopen((dirs.back() + "/" + files->path().filename().string()).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, cuts.back(), f);
    std::fclose(f);
  }
  const std::vector<nlohmann::json> reads = read_logdirs(dirs);
  const auto& whole = reads[0].at("files")[0];
  const std::vector<size_t> ends = whole[2].get<std::vector<size_t>>();
  EXPECT_EQ(whole[1].size(), ends.size()) << "complete records the loader did not read";
  ASSERT_GE(ends.size(), static_cast<size_t>(kill_at) + 2);  // version, config, the steps
  for (size_t i = 0; i < cuts.size(); ++i) {
    const size_t complete =
        static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), cuts[i]) - ends.begin());
    const auto& cut = reads[i + 1].at("files")[0][1];
    EXPECT_EQ(cut.size(), complete) << "file cut at byte " << cuts[i] << " of " << bytes.size();
    for (size_t k = 0; k < std::min(cut.size(), complete); ++k) EXPECT_EQ(cut[k], whole[1][k]);
  }

  ASSERT_EQ(run_command(train_cmd(dir, args + " --resume auto")), 0) << read_file(dir + "/log.txt");
  const nlohmann::json read = read_logdir(dir + "/tb");
  expect_no_step_twice(read);
  expect_equal(reader_scalars(read), jsonl_scalars(dir + "/metrics.jsonl"));
  std::printf("killed at step %lld or after; %zu complete records; cut at %zu random bytes\n",
              static_cast<long long>(kill_at), ends.size(), cuts.size());
}

// A fresh run does not write into another run's logdir.
TEST_F(TensorBoardCli, FreshRunRefusesALogdirWithEventFiles) {
  const std::string a = run_dir("one"), b = run_dir("two");
  const std::string tb = "--log.tensorboard_dir=" + a + "/tb";
  ASSERT_EQ(run_command(train_cmd(a, tb + " --train.max_steps=2")), 0) << read_file(a + "/log.txt");
  EXPECT_NE(run_command(train_cmd(b, tb + " --train.max_steps=2")), 0);
  const std::string log = read_file(b + "/log.txt");
  EXPECT_NE(log.find(a + "/tb"), std::string::npos) << log;
  EXPECT_NE(log.find("log.tensorboard_dir"), std::string::npos) << log;
}

}  // namespace
}  // namespace packbert::test
