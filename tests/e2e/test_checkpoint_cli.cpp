// Checkpoint integrity through the binary: a flipped bit in a weight, a moment and a header, a
// truncated file and a missing one are each caught by `packbert inspect`, `train --resume DIR`
// and `eval`, naming the file and the tensor; `--resume auto` falls back over one and over two
// damaged checkpoints (moving them aside) and then trains exactly as a run resumed from that
// checkpoint directly; with none valid it fails, also on the next try; a checkpoint without
// checksums loads with one warning; two ranks fall back together.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>

#include "train/safetensors.h"
#include "train_cli_util.h"

namespace packbert::test {
namespace {

namespace fs = std::filesystem;

const std::string kArgs = "--eval.at_end=false --eval.every_samples=0 --checkpoint.keep=5";

// A data set and one reference run for the whole file: 12 steps, checkpoints at 3, 6, 9, 12.
class CheckpointCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    seed_ = test_seed();
    write_train_data(data_->path(), seed_, 2, 48, 40, 64, 10);
    const std::string ref = data_->file("ref");
    make_run_dir(ref);
    ASSERT_EQ(run_command(train_cmd(ref, kArgs)), 0) << read_file(ref + "/log.txt");
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  static void make_run_dir(const std::string& dir) {
    fs::create_directories(dir);
    fs::create_symlink(data_->path() + "/train", dir + "/train");
    fs::create_symlink(data_->path() + "/eval", dir + "/eval");
    write_train_config(dir, seed_);
  }
  static std::string train_cmd(const std::string& dir, const std::string& args) {
    return kBin + " train --config " + dir + "/config.toml " + args + " > " + dir + "/log.txt 2>&1";
  }
  static std::string ref_ckpt(int64_t step) {
    return fmt::format("{}/ref/ckpt/step_{:08d}", data_->path(), step);
  }
  // A run directory whose ckpt/ holds copies of the reference's checkpoints of these steps.
  std::string run_dir(const std::string& name, const std::vector<int64_t>& steps = {}) {
    const std::string dir = tmp_.file(name);
    make_run_dir(dir);
    fs::create_directories(dir + "/ckpt");
    for (int64_t s : steps)
      fs::copy(ref_ckpt(s), fmt::format("{}/ckpt/step_{:08d}", dir, s),
               fs::copy_options::recursive);
    return dir;
  }
  // The train records of a run that resumed from `from`, at most steps 1..12.
  static std::vector<nlohmann::json> train_records(const std::string& dir) {
    return read_records(dir + "/metrics.jsonl", "train");
  }
  static void expect_same_losses(const std::vector<nlohmann::json>& got,
                                 const std::vector<nlohmann::json>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].at("step"), want[i].at("step"));
      for (const char* key : {"loss", "mlm_loss", "nsp_loss", "lr", "grad_norm"})
        EXPECT_EQ(got[i].at(key).get<double>(), want[i].at(key).get<double>())
            << key << " at step " << got[i].at("step");
    }
  }

  static TempDir* data_;
  static uint64_t seed_;
  TempDir tmp_;
};
TempDir* CheckpointCli::data_ = nullptr;
uint64_t CheckpointCli::seed_ = 0;

void flip_bit(const std::string& path, uint64_t offset, int bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// Ways to damage a checkpoint directory: each returns a piece of the error every reader must
// print besides the file's path (the tensor, or what is wrong).
struct Damage {
  std::string name;
  std::string file;
  std::function<std::string(const std::string& dir, std::mt19937_64& rng)> apply;
};

// A random bit of a random tensor of a safetensors file whose name starts with `prefix`.
std::string flip_tensor_bit(const std::string& path, const std::string& prefix,
                            std::mt19937_64& rng) {
  SafetensorsFile f(path);
  std::vector<std::string> names;
  for (const std::string& n : f.names())
    if (n.compare(0, prefix.size(), prefix) == 0) names.push_back(n);
  const std::string name = names[rng() % names.size()];
  const StTensorInfo& t = f.info(name);
  const uint64_t at = fs::file_size(path) - f.data_bytes() + t.begin + rng() % (t.end - t.begin);
  f.close();
  flip_bit(path, at, static_cast<int>(rng() % 8));
  return "'" + name + "'";
}

const std::vector<Damage>& damages() {
  static const std::vector<Damage> all = {
      {"weight bit", "model.safetensors",
       [](const std::string& d, std::mt19937_64& rng) {
         return flip_tensor_bit(d + "/model.safetensors", "", rng);
       }},
      {"moment bit", "optimizer.safetensors",
       [](const std::string& d, std::mt19937_64& rng) {
         return flip_tensor_bit(d + "/optimizer.safetensors", "exp_avg", rng);
       }},
      {"header bit", "model.safetensors",
       [](const std::string& d, std::mt19937_64& rng) {
         const std::string path = d + "/model.safetensors";
         const uint64_t header = fs::file_size(path) - SafetensorsFile(path).data_bytes() - 8;
         flip_bit(path, 8 + rng() % header, static_cast<int>(rng() % 8));
         return std::string("header");
       }},
      {"truncation", "optimizer.safetensors",
       [](const std::string& d, std::mt19937_64& rng) {
         const std::string path = d + "/optimizer.safetensors";
         fs::resize_file(path, fs::file_size(path) - 1 - rng() % 1000);
         return std::string("truncated");
       }},
      {"missing file", "model.safetensors",
       [](const std::string& d, std::mt19937_64&) {
         fs::remove(d + "/model.safetensors");
         return std::string("missing");
       }},
  };
  return all;
}

TEST_F(CheckpointCli, InspectVerifiesEveryCheckpointOfARoot) {
  std::string out;
  ASSERT_EQ(run_command(kBin + " inspect " + data_->file("ref/ckpt") + " 2>&1", &out), 0) << out;
  for (const char* want :
       {"step_00000003", "step_00000012", "step 6, samples 48, tokens",
        "config: L=", "model.safetensors", "optimizer.safetensors", "trainer_state.json", "tensors",
        "verdict: ok", "4 checkpoint(s), 4 ok, 0 damaged"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  // One damaged among them: exit 1, the damaged one named with the tensor.
  const std::string dir = run_dir("root", {3, 6});
  std::mt19937_64 rng(seed_);
  const std::string tensor = damages()[0].apply(dir + "/ckpt/step_00000006", rng);
  EXPECT_EQ(run_command(kBin + " inspect " + dir + "/ckpt 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("verdict: DAMAGED"), std::string::npos) << out;
  EXPECT_NE(out.find(dir + "/ckpt/step_00000006/model.safetensors: tensor " + tensor),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("2 checkpoint(s), 1 ok, 1 damaged"), std::string::npos) << out;
}

TEST_F(CheckpointCli, EachDamageIsCaughtByInspectResumeAndEval) {
  std::mt19937_64 rng(seed_ + 1);
  for (const Damage& d : damages()) {
    const std::string dir = run_dir("damage_" + std::to_string(&d - damages().data()), {6});
    const std::string ckpt = dir + "/ckpt/step_00000006";
    const std::string needle = d.apply(ckpt, rng);
    const std::string file = ckpt + "/" + d.file;
    std::string out;
    EXPECT_EQ(run_command(kBin + " inspect " + ckpt + " 2>&1", &out), 1) << d.name << "\n" << out;
    EXPECT_NE(out.find("DAMAGED"), std::string::npos) << d.name << "\n" << out;
    EXPECT_NE(out.find(file), std::string::npos) << d.name << "\n" << out;
    EXPECT_NE(out.find(needle), std::string::npos) << d.name << "\n" << out;
    // --resume DIR never falls back: an error naming the file and the tensor, nothing trained.
    EXPECT_NE(run_command(train_cmd(dir, kArgs + " --resume " + ckpt)), 0) << d.name;
    const std::string log = read_file(dir + "/log.txt");
    EXPECT_NE(log.find(file), std::string::npos) << d.name << "\n" << log;
    EXPECT_NE(log.find(needle), std::string::npos) << d.name << "\n" << log;
    EXPECT_TRUE(train_records(dir).empty()) << d.name;
    EXPECT_TRUE(fs::exists(ckpt)) << d.name;  // never moved aside when named
    if (d.file == "model.safetensors") {
      EXPECT_NE(
          run_command(
              kBin + " eval --config " + dir + "/config.toml --checkpoint " + ckpt + " 2>&1", &out),
          0)
          << d.name;
      EXPECT_NE(out.find(needle), std::string::npos) << d.name << "\n" << out;
    }
  }
}

TEST_F(CheckpointCli, AutoResumeFallsBackOverOneAndTwoDamaged) {
  std::mt19937_64 rng(seed_ + 2);
  // Resumed directly from the checkpoints of steps 6 and 3: what the fallbacks must match.
  std::map<int64_t, std::vector<nlohmann::json>> direct;
  for (int64_t from : {6, 3}) {
    const std::string dir = run_dir("direct_" + std::to_string(from));
    ASSERT_EQ(run_command(train_cmd(dir, kArgs + " --resume " + ref_ckpt(from))), 0)
        << read_file(dir + "/log.txt");
    direct[from] = train_records(dir);
    ASSERT_EQ(direct[from].size(), static_cast<size_t>(12 - from));
  }
  struct Case {
    std::vector<int> damaged;  // indices into damages(), applied to steps 9, 6, ...
    int64_t resumes_from;
  };
  for (const Case& c : {Case{{0}, 6}, Case{{1, 2}, 3}, Case{{3, 4}, 3}}) {
    const std::string dir =
        run_dir(fmt::format("auto_{}_{}", c.damaged.size(), c.damaged.back()), {3, 6, 9});
    std::vector<std::string> needles;
    for (size_t k = 0; k < c.damaged.size(); ++k)
      needles.push_back(damages()[static_cast<size_t>(c.damaged[k])].apply(
          fmt::format("{}/ckpt/step_{:08d}", dir, 9 - 3 * static_cast<int64_t>(k)), rng));
    ASSERT_EQ(run_command(train_cmd(dir, kArgs + " --resume auto")), 0)
        << read_file(dir + "/log.txt");
    const std::string log = read_file(dir + "/log.txt");
    for (size_t k = 0; k < c.damaged.size(); ++k) {
      const std::string step = fmt::format("step_{:08d}", 9 - 3 * static_cast<int64_t>(k));
      EXPECT_TRUE(fs::exists(dir + "/ckpt/" + step + ".corrupt")) << step;
      EXPECT_NE(log.find(dir + "/ckpt/" + step + " is damaged"), std::string::npos) << log;
      EXPECT_NE(log.find(needles[k]), std::string::npos) << needles[k] << "\n" << log;
    }
    EXPECT_NE(log.find(fmt::format("loaded from {}/ckpt/step_{:08d}", dir, c.resumes_from)),
              std::string::npos)
        << log;
    expect_same_losses(train_records(dir), direct[c.resumes_from]);
  }
}

TEST_F(CheckpointCli, AutoResumeWithNoValidCheckpointFailsAndKeepsFailing) {
  std::mt19937_64 rng(seed_ + 3);
  const std::string dir = run_dir("none_valid", {3, 6});
  damages()[0].apply(dir + "/ckpt/step_00000006", rng);
  damages()[3].apply(dir + "/ckpt/step_00000003", rng);
  EXPECT_NE(run_command(train_cmd(dir, kArgs + " --resume auto")), 0);
  std::string log = read_file(dir + "/log.txt");
  EXPECT_NE(log.find("resume auto: no valid checkpoint under " + dir + "/ckpt"), std::string::npos)
      << log;
  EXPECT_NE(log.find("step_00000003.corrupt"), std::string::npos) << log;
  EXPECT_TRUE(train_records(dir).empty());
  // The next try does not start fresh over them either.
  EXPECT_NE(run_command(train_cmd(dir, kArgs + " --resume auto")), 0);
  log = read_file(dir + "/log.txt");
  EXPECT_NE(log.find("only damaged ones set aside earlier"), std::string::npos) << log;
  EXPECT_TRUE(train_records(dir).empty());
}

// A checkpoint as written before checksums existed: the same files without them.
void strip_checksums(const std::string& ckpt) {
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string path = ckpt + "/" + name;
    SafetensorsFile f(path);
    std::vector<std::vector<char>> bufs;
    std::vector<StTensor> ts;
    for (const std::string& n : f.names()) {
      const StTensorInfo& info = f.info(n);
      bufs.emplace_back(info.end - info.begin);
      f.read_raw(n, bufs.back().data());
      ts.push_back({n, info.dtype, info.shape, bufs.back().data()});
    }
    std::map<std::string, std::string> md = f.metadata();
    md.erase("config_json_checksum");
    md.erase("trainer_state_json_checksum");
    f.close();
    write_safetensors(path, ts, md, /*checksums=*/false);
  }
}

TEST_F(CheckpointCli, CheckpointWithoutChecksumsLoadsWithOneWarning) {
  const std::string dir = run_dir("legacy", {6});
  const std::string ckpt = dir + "/ckpt/step_00000006";
  strip_checksums(ckpt);
  ASSERT_EQ(read_file(ckpt + "/model.safetensors").find("checksum"), std::string::npos);
  const std::string direct = run_dir("legacy_direct");
  ASSERT_EQ(run_command(train_cmd(direct, kArgs + " --resume " + ref_ckpt(6))), 0);
  ASSERT_EQ(run_command(train_cmd(dir, kArgs + " --resume " + ckpt)), 0)
      << read_file(dir + "/log.txt");
  const std::string log = read_file(dir + "/log.txt");
  const std::regex warning(
      "no checksums for model.safetensors, config.json, "
      "optimizer.safetensors, trainer_state.json");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(log.begin(), log.end(), warning), std::sregex_iterator()),
      1)
      << log;
  expect_same_losses(train_records(dir), train_records(direct));
  std::string out;
  EXPECT_EQ(
      run_command(kBin + " eval --config " + dir + "/config.toml --checkpoint " + ckpt + " 2>&1",
                  &out),
      0)
      << out;
  EXPECT_NE(out.find("no checksums for model.safetensors, config.json ("), std::string::npos)
      << out;
  EXPECT_EQ(run_command(kBin + " inspect " + ckpt + " 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("not verified"), std::string::npos) << out;
}

// Two ranks, the newest checkpoint damaged: both resume from the one before, rank 0 moves it
// aside once, and the run completes.
TEST_F(CheckpointCli, TwoRanksFallBackTogether) {
  std::mt19937_64 rng(seed_ + 4);
  const std::string dir = run_dir("np2", {3, 6, 9});
  const std::string needle = damages()[1].apply(dir + "/ckpt/step_00000009", rng);
  ASSERT_EQ(run_command(std::string(PACKBERT_MPIEXEC) +
                        " --allow-run-as-root --oversubscribe --mca btl self,vader "
                        "-x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 -np 2 " +
                        train_cmd(dir, kArgs + " --resume auto")),
            0)
      << read_file(dir + "/log.txt");
  const std::string log = read_file(dir + "/log.txt");
  for (int rank : {0, 1})
    EXPECT_TRUE(std::regex_search(
        log, std::regex(
                 fmt::format(R"(\[rank {}\][^\n]*loaded from {}/ckpt/step_00000006)", rank, dir))))
        << "rank " << rank << "\n"
        << log;
  const std::regex warning(R"(\[rank 0\][^\n]*step_00000009 is damaged)");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(log.begin(), log.end(), warning), std::sregex_iterator()),
      1)
      << log;
  EXPECT_NE(log.find(needle), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(dir + "/ckpt/step_00000009.corrupt"));
  const auto recs = train_records(dir);
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.front().at("step").get<int64_t>(), 7);
  EXPECT_EQ(recs.back().at("step").get<int64_t>(), 12);
}

}  // namespace
}  // namespace packbert::test
