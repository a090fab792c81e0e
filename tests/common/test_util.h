// Shared helpers for tests and benchmarks: temp dirs, random samples, running the binary.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "data/loader/loader.h"
#include "data/shards/sample.h"

namespace packbert::test {

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A seed fresh each run (tests use random inputs, never the same fixed ones); printed so a
// failure can be reproduced with PACKBERT_TEST_SEED=<seed>.
uint64_t test_seed();

// A valid random sample: [CLS] A [SEP] B [SEP] (A, B non-empty), length in
// [max(min_len, 5), max_len],
// up to max_predictions masked positions (never [CLS]/[SEP]), ids in [999, vocab_size).
Sample random_sample(std::mt19937_64& rng, int min_len, int max_len, int max_predictions,
                     int64_t vocab_size = 30522);

// The packs a loader hands with these samples (LoaderMicroBatch::packs: indices into samples,
// by pack_online under (max_seq_len, max_seqs_per_pack)), for make_batch's packed layout.
std::vector<std::vector<int32_t>> pack_samples(const std::vector<Sample>& samples, int max_seq_len,
                                               int max_seqs_per_pack = 3);

// One rank's whole optimizer step without a loader: n random samples (ids 0..n-1, as
// random_sample draws them) dealt round-robin into micro_steps micro-batches, with the global
// counts set (step 0) and each micro-batch's packs (pack_samples under max_len).
StepBatch random_step_batch(std::mt19937_64& rng, int n, int micro_steps, int min_len, int max_len,
                            int max_predictions);

// Runs a shell command, returns its exit status; its stdout+stderr go to *output if given.
int run_command(const std::string& cmd, std::string* output = nullptr);

std::string read_file(const std::string& path);
// The file's lines without their newlines (empty when the file is missing).
std::vector<std::string> read_lines(const std::string& path);

// The message of the packbert::Error f throws, "<no error>" when it throws none (other
// exceptions propagate).
std::string error_of(const std::function<void()>& f);

}  // namespace packbert::test
