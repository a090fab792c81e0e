// Helpers of the `packbert train` end-to-end tests: a small data set, a config for it, running
// the binary in the background (to kill or signal it), and reading the metrics file.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/shards/shard.h"
#include "test_util.h"

namespace packbert::test {

inline const std::string kBin = PACKBERT_BINARY;
inline const std::string kVocab = std::string(PACKBERT_REPO_DATA) + "/vocab.txt";

// Random valid samples (BERT's ids, lengths 5..max_len) in `shards` training shards under
// dir/train and one eval shard dir/eval/eval.h5.
inline void write_train_data(const std::string& dir, uint64_t seed, int shards, int rows,
                             int eval_rows, int max_len, int max_predictions) {
  std::mt19937_64 rng(seed);
  std::filesystem::create_directories(dir + "/train");
  std::filesystem::create_directories(dir + "/eval");
  ShardWriteOptions w;
  w.max_seq_len = max_len;
  w.max_predictions = max_predictions;
  auto make = [&](int n) {
    std::vector<Sample> s;
    for (int r = 0; r < n; ++r) s.push_back(random_sample(rng, 5, max_len, max_predictions));
    return s;
  };
  for (int i = 0; i < shards; ++i)
    write_shard(fmt::format("{}/train/part_{:02d}.h5", dir, i), make(rows), w);
  write_shard(dir + "/eval/eval.h5", make(eval_rows), w);
}

// A tiny-model config over write_train_data's directory; `extra` is appended (TOML).
inline std::string write_train_config(const std::string& dir, uint64_t seed,
                                      const std::string& extra = "") {
  const std::string path = dir + "/config.toml";
  std::ofstream f(path);
  f << fmt::format(R"([model]
preset = "tiny"
[train]
max_steps = 12
global_batch_size = 8
gradient_accumulation_steps = 2
seed = {seed}
max_seq_len = 64
max_predictions_per_seq = 10
[optim]
lr = 2e-3
warmup_steps = 2
[data]
train_dir = "{dir}/train"
eval_dir = "{dir}/eval"
vocab = "{vocab}"
shuffle_block_rows = 16
shuffle_window_blocks = 2
[checkpoint]
dir = "{dir}/ckpt"
every_steps = 3
keep = 2
[eval]
every_samples = 32
max_samples = 40
batch_size = 16
[log]
every_steps = 1
metrics_file = "{dir}/metrics.jsonl"
)",
                   fmt::arg("seed", seed & 0x7fffffffu), fmt::arg("dir", dir),
                   fmt::arg("vocab", kVocab));
  f << extra;
  return path;
}

// The metrics file's records of one event kind ("train" or "eval"), in file order.
// The tensor data of a safetensors file: what follows its header (whose metadata may differ
// between two runs of the same tensors); empty when the file is shorter than its header says.
inline std::string checkpoint_tensor_bytes(const std::string& path) {
  const std::string f = read_file(path);
  uint64_t header = 0;
  if (f.size() >= 8) std::memcpy(&header, f.data(), 8);
  return f.size() >= 8 + header ? f.substr(8 + header) : std::string();
}

inline std::vector<nlohmann::json> read_records(const std::string& path, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;  // a line cut by a kill
    if (j.value("event", "") == event) out.push_back(std::move(j));
  }
  return out;
}

// Waits until no process holds the flock on `path` (a checkpoint directory's .packbert.lock:
// the ranks of a killed mpirun may outlive it briefly); false after timeout_s.
inline bool wait_unlocked(const std::string& path, double timeout_s = 60) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return true;  // no lock file: nothing holds it
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);  // releases it again
    if (free) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A shell command run in the background: `exec`ed, so pid is the command itself.
class Background {
 public:
  explicit Background(const std::string& cmd) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && !done_) {
      kill(-pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  void signal(int sig) { kill(pid_, sig); }
  void signal_group(int sig) { kill(-pid_, sig); }  // the command and everything it started
  // Exit status (128 + signal when killed); -1 when it did not end within timeout_s.
  int wait(double timeout_s = 600) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!done_) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        done_ = true;
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
        return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }
  bool running() {
    if (done_) return false;
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      done_ = true;
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return !done_;
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  int status_ = -1;
};

// Waits until the metrics file holds a train record with step >= step (false: the process
// ended first or timeout).
inline bool wait_for_step(Background& p, const std::string& metrics, int64_t step,
                          double timeout_s = 300) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s) {
    const auto recs = read_records(metrics, "train");
    if (!recs.empty() && recs.back().at("step").get<int64_t>() >= step) return true;
    if (!p.running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A test suite over one data set, written once for the suite (2 shards of 48 rows), and run
// directories with their own config over it.
class TrainDataSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    seed_ = test_seed();
    write_train_data(data_->path(), seed_, 2, 48, 40, 64, 10);
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  // A run directory with its own config (checkpoints in dir/ckpt, metrics) over the shared data.
  std::string run_dir(const std::string& name, const std::string& extra = "") {
    const std::string dir = tmp_.file(name);
    std::filesystem::create_directories(dir);
    std::filesystem::create_symlink(data_->path() + "/train", dir + "/train");
    std::filesystem::create_symlink(data_->path() + "/eval", dir + "/eval");
    write_train_config(dir, seed_, extra);
    return dir;
  }

  inline static TempDir* data_ = nullptr;
  inline static uint64_t seed_ = 0;
  TempDir tmp_;
};

}  // namespace packbert::test
