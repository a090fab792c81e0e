// `packbert train` with each learning-rate schedule (optim.schedule): the rate the metrics log
// at every step equals the schedule's formula, written out here for the run's 12 steps
// (peak 2e-3, warmup 2 steps, end_lr 0), and keys a schedule does not read are refused naming
// them. A schedule in tokens follows the tokens trained, also across a resume.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "train_cli_util.h"

namespace packbert::test {
namespace {

class ScheduleCli : public TrainDataSuite {
 protected:
  // Trains 12 steps with `keys` and expects every logged rate to be want(k) (1e-12 relative:
  // the same few double operations in another order).
  void expect_rates(const std::string& name, const std::string& keys,
                    const std::function<double(int64_t)>& want) {
    const std::string dir = run_dir(name);
    const std::string cmd = kBin + " train --config " + dir + "/config.toml " + keys +
                            " --eval.every_samples=0 --eval.at_end=false "
                            "--checkpoint.every_steps=0 > " +
                            dir + "/log.txt 2>&1";
    ASSERT_EQ(run_command(cmd), 0) << read_file(dir + "/log.txt");
    const auto recs = read_records(dir + "/metrics.jsonl", "train");
    ASSERT_EQ(recs.size(), 12u);
    for (const auto& r : recs) {
      const int64_t k = r.at("step").get<int64_t>();
      const double lr = r.at("lr").get<double>();
      EXPECT_NEAR(lr, want(k), 1e-12 * 2e-3) << name << " at step " << k;
    }
  }
};

constexpr double kPeak = 2e-3, kPi = 3.14159265358979323846;
double warmup(int64_t k) { return kPeak * static_cast<double>(k) / 2.0; }

TEST_F(ScheduleCli, LoggedRatesFollowEachSchedule) {
  // linear and cosine decay from the warmup's end (step 2) to 0 at step 12.
  expect_rates("linear", "--optim.schedule=linear", [](int64_t k) {
    return k < 2 ? warmup(k) : kPeak * (1.0 - static_cast<double>(k - 2) / 10.0);
  });
  expect_rates("cosine", "--optim.schedule=cosine", [](int64_t k) {
    return k < 2 ? warmup(k)
                 : kPeak * 0.5 * (1.0 + std::cos(kPi * static_cast<double>(k - 2) / 10.0));
  });
  // wsd: stable to step 8, then 4 steps of 1 - sqrt(t).
  expect_rates("wsd", "--optim.schedule=wsd --optim.decay_steps=4 --optim.decay_shape=1-sqrt",
               [](int64_t k) {
                 if (k < 2) return warmup(k);
                 if (k <= 8) return kPeak;
                 return kPeak * (1.0 - std::sqrt(static_cast<double>(k - 8) / 4.0));
               });
}

TEST_F(ScheduleCli, KeysTheScheduleDoesNotReadAreRefused) {
  const std::string dir = run_dir("refused");
  for (const char* keys : {"--optim.decay_steps=4", "--optim.schedule=cosine --optim.poly_power=2",
                           "--optim.schedule=wsd"}) {
    const std::string cmd =
        kBin + " train --config " + dir + "/config.toml " + keys + " > " + dir + "/log.txt 2>&1";
    EXPECT_NE(run_command(cmd), 0) << keys;
    const std::string log = read_file(dir + "/log.txt");
    EXPECT_NE(
        log.find(std::string(keys).find("poly_power") != std::string::npos ? "optim.poly_power"
                                                                           : "optim.decay_steps"),
        std::string::npos)
        << keys << ": " << log;
  }
}

// optim.schedule_unit = tokens: the rate logged at each step is the schedule's at the real tokens
// trained up to and including it (the record's `tokens`, cumulative), warmup 600 tokens, linear
// decay to 0 at 3000 (about step 10 of 12: the last steps sit at end_lr). A run resumed from
// the checkpoint of step 6 logs the same rates, bit for bit.
TEST_F(ScheduleCli, RatesInTokensFollowTheTokensTrainedAcrossAResume) {
  const std::string keys =
      " --optim.schedule=linear --optim.schedule_unit=tokens --optim.warmup_steps=0 "
      "--optim.warmup_tokens=600 "
      "--optim.schedule_tokens=3000 --eval.every_samples=0 --eval.at_end=false "
      "--checkpoint.keep=5";
  const std::string a = run_dir("tokens"), b = run_dir("tokens_resumed");
  ASSERT_EQ(run_command(kBin + " train --config " + a + "/config.toml" + keys + " > " + a +
                        "/log.txt 2>&1"),
            0)
      << read_file(a + "/log.txt");
  const auto recs = read_records(a + "/metrics.jsonl", "train");
  ASSERT_EQ(recs.size(), 12u);
  int64_t before = 0, past_end = 0;
  for (const auto& r : recs) {
    const int64_t tokens = r.at("tokens").get<int64_t>();
    ASSERT_GT(tokens, before);  // cumulative
    before = tokens;
    const double t = static_cast<double>(tokens);
    const double want = t < 600     ? kPeak * t / 600
                        : t >= 3000 ? 0.0
                                    : kPeak * (1 - (t - 600) / 2400);
    EXPECT_NEAR(r.at("lr").get<double>(), want, 1e-12 * kPeak) << "step " << r.at("step");
    past_end += tokens >= 3000;
  }
  EXPECT_GE(past_end, 1) << "the run never reached schedule_tokens: the test checks no end";
  EXPECT_LT(recs[0].at("tokens").get<int64_t>(), 600) << "the first step is past the warmup";

  ASSERT_EQ(run_command(kBin + " train --config " + b + "/config.toml" + keys + " --resume " + a +
                        "/ckpt/step_00000006 > " + b + "/log.txt 2>&1"),
            0)
      << read_file(b + "/log.txt");
  const auto resumed = read_records(b + "/metrics.jsonl", "train");
  ASSERT_EQ(resumed.size(), 6u);
  for (const auto& r : resumed) {
    const auto& want = recs[static_cast<size_t>(r.at("step").get<int64_t>() - 1)];
    EXPECT_EQ(r.at("tokens").get<int64_t>(), want.at("tokens").get<int64_t>());
    EXPECT_EQ(r.at("lr").get<double>(), want.at("lr").get<double>()) << "step " << r.at("step");
  }
}

// Each unit's lengths and none of the other's, named.
TEST_F(ScheduleCli, TokenAndStepLengthsAreNotMixed) {
  const std::string dir = run_dir("units");
  for (const auto& [keys, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--optim.schedule_unit=tokens", "optim.schedule_tokens"},
           {"--optim.schedule_unit=tokens --optim.schedule_tokens=900 --optim.warmup_steps=2",
            "optim.warmup_steps"},
           {"--optim.warmup_tokens=100", "optim.warmup_tokens"},
           {"--optim.schedule_unit=tokens --optim.schedule_tokens=900 --optim.warmup_steps=0 "
            "--optim.schedule=wsd --optim.decay_tokens=2000",
            "optim.decay_tokens"}}) {
    EXPECT_NE(run_command(kBin + " train --config " + dir + "/config.toml " + keys + " > " + dir +
                          "/log.txt 2>&1"),
              0)
        << keys;
    const std::string log = read_file(dir + "/log.txt");
    EXPECT_NE(log.find(needle), std::string::npos) << keys << ": " << log;
  }
}

}  // namespace
}  // namespace packbert::test
