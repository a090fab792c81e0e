// One run per checkpoint directory, through the binary (src/train/checkpoint_dir.h): a run that
// starts fresh (or from weights, or from a checkpoint elsewhere) into a directory holding
// checkpoints, damaged ones included, refuses before any data is loaded and leaves every byte
// of the directory as it was, the lock file that names their run included, on one rank and on
// two; --resume auto and checkpoint.overwrite still work;
// two runs started together on one directory: one runs, the other refuses naming it, on one
// rank and on two; a run killed with SIGKILL (rank 0 of two, too) never blocks --resume auto;
// a resume that changes keys logs one warning naming each, old -> new.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "train_cli_util.h"

namespace packbert::test {
namespace {

namespace fs = std::filesystem;

const std::string kArgs = "--eval.at_end=false --eval.every_samples=0";

// `packbert train` on dir's config, its output into dir/LOG.
std::string train_cmd(const std::string& dir, const std::string& args,
                      const std::string& log = "log.txt") {
  return kBin + " train --config " + dir + "/config.toml " + kArgs + " " + args + " > " + dir +
         "/" + log + " 2>&1";
}

class CheckpointDirCli : public TrainDataSuite {
 protected:
  static std::string mpirun(int np) {
    return std::string(PACKBERT_MPIEXEC) +
           " --allow-run-as-root --oversubscribe --mca btl self,vader -x OMP_NUM_THREADS=1 "
           "-x OPENBLAS_NUM_THREADS=1 -np " +
           std::to_string(np) + " ";
  }
};

// Every file under root's checkpoints (step_* and set-aside directories) -> its bytes.
std::map<std::string, std::string> checkpoint_bytes(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string rel = fs::relative(e.path(), root).string();
    if (rel.rfind("step_", 0) == 0 && e.is_regular_file()) out[rel] = read_file(e.path());
  }
  return out;
}

// Every entry under root, the lock file included -> its bytes ("(directory)" for a directory).
std::map<std::string, std::string> every_byte(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    out[fs::relative(e.path(), root).string()] =
        e.is_directory() ? std::string("(directory)") : read_file(e.path());
  return out;
}

// The entries whose bytes differ between two every_byte() maps, or that only one holds; for a
// text file of a few lines (the lock file), with both texts.
std::string changed(const std::map<std::string, std::string>& before,
                    const std::map<std::string, std::string>& after) {
  std::string out;
  for (const auto* side : {&before, &after})
    for (const auto& [name, bytes] : *side) {
      const auto b = before.find(name), a = after.find(name);
      if (side == &after && b != before.end()) continue;  // seen from before
      if (b == before.end() || a == after.end()) {
        out += fmt::format("{} {}\n", name, b == before.end() ? "appeared" : "disappeared");
      } else if (b->second != a->second) {
        out += name + " changed";
        if (b->second.size() < 256 && a->second.size() < 256)
          out += fmt::format(": \"{}\" -> \"{}\"", b->second, a->second);
        out += "\n";
      }
    }
  return out;
}

std::vector<std::string> entries(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t recorded_seed(const std::string& ckpt) {
  return nlohmann::json::parse(read_file(ckpt + "/trainer_state.json"))
      .at("rng")
      .at("train_seed")
      .get<uint64_t>();
}

// The refusal's text: the directory, its newest checkpoint, the three ways on, nothing trained.
void expect_refusal(const std::string& out, const std::string& ckpt_dir,
                    const std::string& newest) {
  EXPECT_NE(out.find("error: checkpoint.dir " + ckpt_dir + " holds "), std::string::npos) << out;
  EXPECT_NE(out.find("(newest: " + newest), std::string::npos) << out;
  for (const char* way : {"--resume auto", "another checkpoint.dir", "--checkpoint.overwrite=true"})
    EXPECT_NE(out.find(way), std::string::npos) << way << "\n" << out;
  EXPECT_EQ(out.find("data: "), std::string::npos) << "loaded data before refusing:\n" << out;
  EXPECT_EQ(out.find("step 1/"), std::string::npos) << "trained:\n" << out;
}

TEST_F(CheckpointDirCli, FreshRunRefusesADirectoryWithCheckpointsAndChangesNoByte) {
  const std::string dir = run_dir("fresh");
  const std::string ckpt = dir + "/ckpt";
  ASSERT_EQ(run_command(train_cmd(dir, "")), 0) << read_file(dir + "/log.txt");
  const auto before = checkpoint_bytes(ckpt);
  const auto names = entries(ckpt);
  ASSERT_EQ(names, (std::vector<std::string>{".packbert.lock", "step_00000009", "step_00000012"}));

  // Fresh with another seed, on one rank and on two; from weights only; from a checkpoint
  // elsewhere.
  const std::string other = run_dir("other");
  ASSERT_EQ(run_command(train_cmd(other, "--train.max_steps=3")), 0);
  const std::vector<std::pair<std::string, std::string>> tries = {
      {"", "--train.seed=" + std::to_string((seed_ + 1) & 0x7fffffff)},
      {mpirun(2), "--train.seed=" + std::to_string((seed_ + 1) & 0x7fffffff)},
      {"", "--init-checkpoint " + other + "/ckpt/step_00000003"},
      {"", "--resume " + other + "/ckpt/step_00000003"}};
  for (const auto& [launcher, args] : tries) {
    SCOPED_TRACE(launcher + args);
    EXPECT_NE(run_command(launcher + train_cmd(dir, args, "refused.txt")), 0);
    const std::string out = read_file(dir + "/refused.txt");
    expect_refusal(out, ckpt, "step_00000012");
    if (args.rfind("--resume", 0) == 0) {
      EXPECT_NE(out.find("which is not one of them"), std::string::npos) << out;
    }
    EXPECT_EQ(checkpoint_bytes(ckpt), before);
    EXPECT_EQ(entries(ckpt), names);
  }

  // --resume auto continues that run.
  ASSERT_EQ(run_command(train_cmd(dir, "--resume auto --train.max_steps=14")), 0)
      << read_file(dir + "/log.txt");
  EXPECT_NE(read_file(dir + "/log.txt").find("loaded from " + ckpt + "/step_00000012"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(ckpt + "/step_00000014"));

  // The explicit overwrite deletes them and starts here; what is left is the new run's alone.
  const uint64_t new_seed = (seed_ + 2) & 0x7fffffff;
  ASSERT_EQ(run_command(train_cmd(dir, fmt::format("--checkpoint.overwrite=true "
                                                   "--train.seed={} --train.max_steps=6",
                                                   new_seed))),
            0)
      << read_file(dir + "/log.txt");
  const std::string log = read_file(dir + "/log.txt");
  EXPECT_NE(log.find("checkpoint.overwrite: deleted 2 checkpoint(s) under " + ckpt),
            std::string::npos)
      << log;
  EXPECT_EQ(entries(ckpt),
            (std::vector<std::string>{".packbert.lock", "step_00000003", "step_00000006"}));
  for (const char* s : {"/step_00000003", "/step_00000006"})
    EXPECT_EQ(recorded_seed(ckpt + s), new_seed);
  // The overwrite continues nothing: with --resume it is a config error.
  EXPECT_NE(run_command(train_cmd(dir, "--checkpoint.overwrite=true --resume auto", "x.txt")), 0);
  EXPECT_NE(read_file(dir + "/x.txt").find("give one of the two"), std::string::npos);
}

// Damaged checkpoints set aside count too: a fresh run never starts beside them.
TEST_F(CheckpointDirCli, DamagedCheckpointsSetAsideCountAsCheckpoints) {
  const std::string dir = run_dir("aside");
  const std::string ckpt = dir + "/ckpt";
  ASSERT_EQ(run_command(train_cmd(dir, "--train.max_steps=3")), 0);
  fs::rename(ckpt + "/step_00000003", ckpt + "/step_00000003.corrupt");
  const auto before = checkpoint_bytes(ckpt);
  EXPECT_NE(run_command(train_cmd(dir, "")), 0);
  const std::string out = read_file(dir + "/log.txt");
  expect_refusal(out, ckpt, "step_00000003.corrupt");
  EXPECT_NE(out.find("damaged and set aside"), std::string::npos) << out;
  EXPECT_EQ(checkpoint_bytes(ckpt), before);
}

// The pid a run's rank logs at its start ("packbert train: N rank(s), pid P").
std::string logged_pid(const std::string& log, int rank) {
  std::smatch m;
  const std::regex re(
      fmt::format(R"(\[rank {}\][^\n]*packbert train: \d+ rank\(s\), pid (\d+))", rank));
  return std::regex_search(log, m, re) ? m[1].str() : std::string();
}

// A refused fresh run changes nothing in checkpoint.dir: the lock file still names the run that
// wrote the checkpoints, not the one refused (its refusal says "Nothing was changed"), on one
// rank and on two; and where there is no lock file (checkpoints copied in), none is made.
TEST_F(CheckpointDirCli, RefusedFreshRunLeavesTheLockFileAndEveryOtherByte) {
  const std::string dir = run_dir("refused_lock");
  const std::string ckpt = dir + "/ckpt";
  ASSERT_EQ(run_command(train_cmd(dir, "--train.max_steps=3")), 0) << read_file(dir + "/log.txt");
  const std::string pid = logged_pid(read_file(dir + "/log.txt"), 0);
  ASSERT_FALSE(pid.empty()) << read_file(dir + "/log.txt");
  const std::string lock = ckpt + "/.packbert.lock";
  ASSERT_NE(read_file(lock).find("pid " + pid + ","), std::string::npos) << read_file(lock);
  const std::string fresh = "--train.seed=" + std::to_string((seed_ + 1) & 0x7fffffff);
  for (const bool lock_file : {true, false}) {
    if (!lock_file) {
      ASSERT_TRUE(fs::remove(lock));
    }
    const auto before = every_byte(ckpt);
    ASSERT_EQ(before.count(".packbert.lock"), lock_file ? 1u : 0u);
    for (const std::string& launcher : {std::string(), mpirun(2)}) {
      SCOPED_TRACE(fmt::format("lock file {}, {}", lock_file, launcher));
      EXPECT_NE(run_command(launcher + train_cmd(dir, fresh, "refused.txt")), 0);
      const std::string out = read_file(dir + "/refused.txt");
      expect_refusal(out, ckpt, "step_00000003");
      EXPECT_NE(out.find("Nothing was changed"), std::string::npos) << out;
      EXPECT_EQ(changed(before, every_byte(ckpt)), "");
    }
  }
}

// Two runs started together on one empty directory: exactly one runs, the other exits non-zero
// naming the holder (rank 0's host and pid); the one that runs stops cleanly on a signal.
void expect_one_of_two(const std::string& dir, const std::string& launcher, int stop_signal) {
  const std::string args =
      "--train.max_steps=100000 --checkpoint.every_steps=2 --log.metrics_file=" + dir;
  Background a(launcher + train_cmd(dir, args + "/a.jsonl", "a.txt"));
  Background b(launcher + train_cmd(dir, args + "/b.jsonl", "b.txt"));
  // The loser ends within seconds; the winner trains until stopped.
  const auto t0 = std::chrono::steady_clock::now();
  while (a.running() && b.running() &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(!a.running() || !b.running()) << "both still run after 120 s";
  ASSERT_FALSE(!a.running() && !b.running())
      << "both ended\n"
      << read_file(dir + "/a.txt") << read_file(dir + "/b.txt");
  Background& winner = a.running() ? a : b;
  Background& loser = a.running() ? b : a;
  const std::string win_log = dir + (a.running() ? "/a.txt" : "/b.txt");
  const std::string lose_out = read_file(dir + (a.running() ? "/b.txt" : "/a.txt"));
  EXPECT_NE(loser.wait(10), 0) << lose_out;
  ASSERT_TRUE(wait_for_step(winner, dir + (a.running() ? "/a.jsonl" : "/b.jsonl"), 2))
      << read_file(win_log);
  const std::string pid = logged_pid(read_file(win_log), 0);
  ASSERT_FALSE(pid.empty()) << read_file(win_log);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_NE(lose_out.find(fmt::format("error: checkpoint.dir {}/ckpt is in use by another run: "
                                      "host {}, pid {}, started ",
                                      dir, host, pid)),
            std::string::npos)
      << lose_out;
  EXPECT_EQ(lose_out.find("step 1/"), std::string::npos) << lose_out;
  winner.signal(stop_signal);
  EXPECT_EQ(winner.wait(120), 0) << read_file(win_log);
  EXPECT_EQ(read_file(win_log).find("error"), std::string::npos) << read_file(win_log);
}

TEST_F(CheckpointDirCli, TwoRunsAtOnceOneRunsTheOtherNamesIt) {
  expect_one_of_two(run_dir("together"), "", SIGTERM);
}

// Under mpirun the lock is rank 0's; mpirun passes SIGUSR1 on to the ranks and waits for them.
TEST_F(CheckpointDirCli, TwoRunsAtOnceOnTwoRanksEach) {
  expect_one_of_two(run_dir("together_np2"), mpirun(2), SIGUSR1);
}

// SIGKILL leaves the lock file behind, never the lock: --resume auto goes on at once.
TEST_F(CheckpointDirCli, SigkilledRunNeverBlocksResumeAuto) {
  for (const int np : {1, 2}) {
    SCOPED_TRACE(np);
    const std::string dir = run_dir(fmt::format("killed_np{}", np));
    const std::string launcher = np == 1 ? "" : mpirun(np);
    {
      Background p(launcher + train_cmd(dir, "--train.max_steps=100000", "log.txt"));
      ASSERT_TRUE(wait_for_step(p, dir + "/metrics.jsonl", 4)) << read_file(dir + "/log.txt");
      const std::string pid = logged_pid(read_file(dir + "/log.txt"), 0);
      ASSERT_FALSE(pid.empty());
      ASSERT_EQ(kill(std::stoi(pid), SIGKILL), 0);  // the lock's holder
      EXPECT_NE(p.wait(60), 0);
    }
    ASSERT_TRUE(fs::exists(dir + "/ckpt/.packbert.lock"));
    ASSERT_TRUE(fs::exists(dir + "/ckpt/step_00000003"));
    const int64_t last = read_records(dir + "/metrics.jsonl", "train").back().at("step");
    ASSERT_EQ(
        run_command(launcher +
                    train_cmd(dir, fmt::format("--resume auto --train.max_steps={}", last + 1),
                              "resumed.txt")),
        0)
        << read_file(dir + "/resumed.txt");
    EXPECT_NE(read_file(dir + "/resumed.txt").find("loaded from " + dir + "/ckpt/step_"),
              std::string::npos);
  }
}

// A resume logs one warning naming every changed key with both values; an unchanged one none.
TEST_F(CheckpointDirCli, ResumeListsEveryChangedKeyOnce) {
  const std::string dir = run_dir("changes");
  ASSERT_EQ(run_command(train_cmd(dir, "--train.max_steps=6 --checkpoint.every_steps=3")), 0);
  const std::string from = dir + "/ckpt/step_00000003";
  ASSERT_EQ(
      run_command(train_cmd(dir, "--train.max_steps=6 --checkpoint.every_steps=3 --resume " + from,
                            "same.txt")),
      0);
  EXPECT_EQ(read_file(dir + "/same.txt").find("differ"), std::string::npos)
      << read_file(dir + "/same.txt");
  // write_train_config sets optim.lr = 2e-3 and the default precision, fp32.
  const double lr = 5e-4;
  ASSERT_EQ(run_command(train_cmd(dir,
                                  fmt::format("--train.max_steps=6 --checkpoint.every_steps=3 "
                                              "--optim.lr={} --train.precision=bf16 "
                                              "--resume {}",
                                              lr, from),
                                  "changed.txt")),
            0)
      << read_file(dir + "/changed.txt");
  const std::string out = read_file(dir + "/changed.txt");
  const std::regex warning(R"(\[warning\] resume: [^\n]*differ)");
  const auto n =
      std::distance(std::sregex_iterator(out.begin(), out.end(), warning), std::sregex_iterator());
  EXPECT_EQ(n, 1) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(\[warning\] resume: ([^\n]*))"))) << out;
  const std::string line = m[1];
  EXPECT_NE(line.find("2 config key(s) differ"), std::string::npos) << line;
  EXPECT_NE(line.find(from), std::string::npos) << line;
  EXPECT_NE(line.find("train.precision \"fp32\" -> \"bf16\""), std::string::npos) << line;
  EXPECT_NE(line.find(fmt::format("optim.lr {} -> {}", 2e-3, lr)), std::string::npos) << line;
}

}  // namespace
}  // namespace packbert::test
