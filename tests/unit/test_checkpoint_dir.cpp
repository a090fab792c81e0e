// One run per checkpoint directory (src/train/checkpoint_dir.h): the lock refuses a second
// holder, naming it, and is free again once its holder is killed; which entries of a directory
// count as checkpoints; which resumes continue checkpoint.dir; the config keys a resume changes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config/train_config.h"
#include "kernels/base/error.h"
#include "test_util.h"
#include "train/checkpoint_dir.h"

namespace packbert {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TempDir;

// A child process that takes the lock on dir and holds it until killed.
class LockHolder {
 public:
  explicit LockHolder(const std::string& dir) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      char ok = 'n';
      try {
        const CheckpointDirLock lock(dir);
        ok = lock.held() ? 'y' : 'n';
        (void)!::write(fds[1], &ok, 1);
        for (;;) ::pause();
      } catch (...) {
        (void)!::write(fds[1], &ok, 1);
      }
      ::_exit(1);
    }
    ::close(fds[1]);
    char ok = 0;
    EXPECT_EQ(::read(fds[0], &ok, 1), 1);
    ::close(fds[0]);
    held_ = ok == 'y';
  }
  ~LockHolder() { kill(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }
  bool held() const { return held_; }

 private:
  pid_t pid_ = -1;
  bool held_ = false;
};

std::string hostname() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

TEST(CheckpointDirLock, RefusesASecondRunNamingTheHolderAndFreesWithAKill) {
  TempDir tmp;
  LockHolder holder(tmp.path());
  ASSERT_TRUE(holder.held());
  const std::string err = error_of([&] { CheckpointDirLock second(tmp.path()); });
  EXPECT_NE(err.find("is in use by another run"), std::string::npos) << err;
  EXPECT_NE(err.find(fmt::format("host {}, pid {}, started ", hostname(), holder.pid())),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(CheckpointDirLock::path(tmp.path())), std::string::npos) << err;
  // SIGKILL leaves the lock file, not the lock.
  const pid_t killed = holder.pid();
  holder.kill();
  ASSERT_TRUE(fs::exists(CheckpointDirLock::path(tmp.path())));
  const CheckpointDirLock mine(tmp.path());
  EXPECT_TRUE(mine.held());
  const std::string record = test::read_file(CheckpointDirLock::path(tmp.path()));
  EXPECT_NE(record.find(fmt::format("pid {},", ::getpid())), std::string::npos) << record;
  EXPECT_EQ(record.find(fmt::format("pid {},", killed)), std::string::npos) << record;
}

TEST(CheckpointDirLock, IsExclusiveWithinOneProcessTooAndReleasedByItsEnd) {
  TempDir tmp;
  {
    const CheckpointDirLock first(tmp.path());
    ASSERT_TRUE(first.held());
    EXPECT_NE(error_of([&] { CheckpointDirLock again(tmp.path()); }).find("in use"),
              std::string::npos);
  }
  const CheckpointDirLock after(tmp.path());
  EXPECT_TRUE(after.held());
}

// existing() decides nothing in the directory: no lock file is made, and the record of the run
// that made one stays until record(); a held lock is refused, naming its holder, as by the
// constructor.
TEST(CheckpointDirLock, ExistingWritesNothingUntilRecord) {
  TempDir tmp;
  const std::string file = CheckpointDirLock::path(tmp.path());
  EXPECT_EQ(CheckpointDirLock::existing(tmp.path()), nullptr);
  EXPECT_FALSE(fs::exists(file));
  const std::string earlier =
      fmt::format("host elsewhere, pid {}, started then\n", 1 + test::test_seed() % 100000);
  std::ofstream(file) << earlier;
  {
    const std::unique_ptr<CheckpointDirLock> lock = CheckpointDirLock::existing(tmp.path());
    ASSERT_NE(lock, nullptr);
    EXPECT_TRUE(lock->held());
    EXPECT_EQ(test::read_file(file), earlier);
    EXPECT_NE(error_of([&] { CheckpointDirLock again(tmp.path()); }).find("in use"),
              std::string::npos);
    EXPECT_EQ(test::read_file(file), earlier);
    lock->record();
    EXPECT_NE(test::read_file(file).find(fmt::format("pid {},", ::getpid())), std::string::npos)
        << test::read_file(file);
  }
  LockHolder holder(tmp.path());
  ASSERT_TRUE(holder.held());
  const std::string err = error_of([&] { CheckpointDirLock::existing(tmp.path()); });
  EXPECT_NE(err.find(fmt::format("is in use by another run: host {}, pid {}, started ", hostname(),
                                 holder.pid())),
            std::string::npos)
      << err;
}

TEST(CheckpointDirLock, UnopenableLockFileIsAnErrorNamingIt) {
  TempDir tmp;
  const std::string missing = tmp.file("no/such/dir");
  const std::string err = error_of([&] { CheckpointDirLock lock(missing); });
  EXPECT_NE(err.find(CheckpointDirLock::path(missing)), std::string::npos) << err;
}

TEST(CheckpointDir, CheckpointsInCountsEveryStepDirectoryAndDamagedOnes) {
  TempDir tmp;
  const std::string d = tmp.path();
  std::mt19937_64 rng(test::test_seed());
  const int64_t a = 1 + static_cast<int64_t>(rng() % 1000), b = a + 1 + rng() % 1000,
                c = b + 1 + rng() % 1000;
  auto name = [](int64_t s) { return fmt::format("step_{:08d}", s); };
  fs::create_directories(d + "/" + name(c));  // complete or not: a checkpoint
  fs::create_directories(d + "/" + name(a));
  fs::create_directories(d + "/" + name(b) + ".corrupt");  // set aside
  fs::create_directories(d + "/" + name(b) + ".corrupt-2");
  fs::create_directories(d + "/." + name(c + 1) + ".tmp-123");  // a write's leftover
  fs::create_directories(d + "/step_12");                       // too few digits
  fs::create_directories(d + "/notes");
  std::ofstream(d + "/" + name(c + 2)) << "a file, not a checkpoint";
  std::ofstream(d + "/.packbert.lock") << "x";
  const std::vector<std::string> want = {name(a), name(b) + ".corrupt", name(b) + ".corrupt-2",
                                         name(c)};
  EXPECT_EQ(checkpoints_in(d), want);
  EXPECT_TRUE(checkpoints_in(d + "/missing").empty());
}

TEST(CheckpointDir, ContinuesOnlyAutoOrACheckpointUnderTheDir) {
  TempDir tmp;
  TrainConfig::Checkpoint k;
  k.dir = tmp.file("ckpt");
  fs::create_directories(k.dir + "/step_00000010");
  EXPECT_FALSE(continues_checkpoint_dir(k));  // fresh
  k.resume = "auto";
  EXPECT_TRUE(continues_checkpoint_dir(k));
  k.resume = k.dir + "/step_00000010";
  EXPECT_TRUE(continues_checkpoint_dir(k));
  k.resume = k.dir + "/step_00000010/";
  EXPECT_TRUE(continues_checkpoint_dir(k));
  k.resume = tmp.path() + "/./ckpt/../ckpt/step_00000010";
  EXPECT_TRUE(continues_checkpoint_dir(k));
  fs::create_directory_symlink(k.dir, tmp.file("link"));
  k.resume = tmp.file("link") + "/step_00000010";
  EXPECT_TRUE(continues_checkpoint_dir(k));
  k.resume = tmp.file("other/step_00000010");
  EXPECT_FALSE(continues_checkpoint_dir(k));
  k.resume = k.dir;  // the root itself is not one of its checkpoints
  EXPECT_FALSE(continues_checkpoint_dir(k));
}

// The line `name = VALUE` of section [section] in a config's TOML: VALUE as written.
std::string value_in(const std::string& toml, const std::string& section, const std::string& name) {
  const size_t s = toml.find("[" + section + "]\n");
  const size_t at = toml.find("\n" + name + " = ", s);
  const size_t b = at + name.size() + 4, e = toml.find('\n', b);
  return toml.substr(b, e - b);
}

TEST(ConfigChanges, NameEachChangedKeyWithBothValuesLeavingOutHowTheRunStarts) {
  std::mt19937_64 rng(test::test_seed());
  TrainConfig before;
  before.optim.lr = std::uniform_real_distribution<double>(1e-5, 1e-2)(rng);
  TrainConfig after = before;
  after.optim.lr = before.optim.lr * std::uniform_real_distribution<double>(1.5, 4)(rng);
  after.train.precision = rng() % 2 ? Precision::bf16 : Precision::fp16;
  after.checkpoint.resume = "auto";  // how the run starts: not a change
  before.checkpoint.overwrite = true;
  const std::string tb = train_config_to_toml(before), ta = train_config_to_toml(after);
  const std::vector<ConfigChange> got = config_changes(tb, ta);
  ASSERT_EQ(got.size(), 2u) << describe(got);
  // In the key table's order: [train] before [optim].
  EXPECT_EQ(got[0].key, "train.precision");
  EXPECT_EQ(got[0].before, value_in(tb, "train", "precision"));
  EXPECT_EQ(got[0].after, value_in(ta, "train", "precision"));
  EXPECT_EQ(got[0].after, fmt::format("\"{}\"", config_name(after.train.precision)));
  EXPECT_EQ(got[1].key, "optim.lr");
  EXPECT_EQ(got[1].before, value_in(tb, "optim", "lr"));
  EXPECT_EQ(got[1].after, value_in(ta, "optim", "lr"));
  EXPECT_EQ(describe(got), fmt::format("train.precision {} -> {}; optim.lr {} -> {}", got[0].before,
                                       got[0].after, got[1].before, got[1].after));
  EXPECT_TRUE(config_changes(tb, tb).empty());
}

TEST(ConfigChanges, KeysOnlyOneSideHasAreChangesToo) {
  const TrainConfig c;
  const std::string text = train_config_to_toml(c);
  // An older run's config: without checkpoint.keep, with a key since retired.
  std::string older = text;
  const size_t keep = older.find("\nkeep = ", older.find("[checkpoint]"));
  older.erase(keep, older.find('\n', keep + 1) - keep);
  older.insert(older.find("[optim]\n") + 8, "retired = 5\n");
  const std::vector<ConfigChange> got = config_changes(older, text);
  ASSERT_EQ(got.size(), 2u) << describe(got);
  EXPECT_EQ(got[0].key, "checkpoint.keep");
  EXPECT_EQ(got[0].before, "(absent)");
  EXPECT_EQ(got[0].after, value_in(text, "checkpoint", "keep"));
  EXPECT_EQ(got[1].key, "optim.retired");
  EXPECT_EQ(got[1].before, "5");
  EXPECT_EQ(got[1].after, "(absent)");
}

TEST(ConfigChanges, TextThatIsNotTomlIsAnError) {
  const std::string text = train_config_to_toml(TrainConfig{});
  EXPECT_NE(error_of([&] { config_changes("[train\nx = ", text); }).find("not TOML"),
            std::string::npos);
}

}  // namespace
}  // namespace packbert
