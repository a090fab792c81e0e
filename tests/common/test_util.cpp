#include "test_util.h"

#include "kernels/base/error.h"
#include "data/packing/packing.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace packbert::test {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "packbert-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("PACKBERT_TEST_SEED"))
      return static_cast<uint64_t>(std::strtoull(s, nullptr, 10));
    uint64_t v = std::random_device{}();
    v = (v << 32) ^ std::random_device{}();
    std::cerr << "[test seed " << v << " — rerun with PACKBERT_TEST_SEED=" << v << "]\n";
    return v;
  }();
  return seed;
}

Sample random_sample(std::mt19937_64& rng, int min_len, int max_len, int max_predictions,
                     int64_t vocab_size) {
  constexpr int32_t kCls = 101, kSep = 102;
  Sample s;
  const int len = std::uniform_int_distribution<int>(std::max(min_len, 5), max_len)(rng);
  // A occupies [1, len_a), [SEP] at len_a, B occupies (len_a, len - 1), [SEP] at len - 1.
  const int len_a = std::uniform_int_distribution<int>(2, len - 3)(rng);
  std::uniform_int_distribution<int32_t> tok(999, static_cast<int32_t>(vocab_size - 1));
  s.input_ids.resize(len);
  s.segment_ids.resize(len);
  for (int i = 0; i < len; ++i) {
    s.input_ids[i] = tok(rng);
    s.segment_ids[i] = i > len_a ? 1 : 0;
  }
  s.input_ids[0] = kCls;
  s.input_ids[len_a] = kSep;
  s.input_ids[len - 1] = kSep;
  std::vector<int32_t> candidates;
  for (int i = 1; i < len; ++i)
    if (s.input_ids[i] != kSep) candidates.push_back(i);
  std::shuffle(candidates.begin(), candidates.end(), rng);
  const int p = std::min<int>(max_predictions, static_cast<int>(candidates.size()));
  const int np = std::uniform_int_distribution<int>(0, p)(rng);
  candidates.resize(np);
  std::sort(candidates.begin(), candidates.end());
  for (int32_t pos : candidates) {
    s.masked_lm_positions.push_back(pos);
    s.masked_lm_ids.push_back(tok(rng));
  }
  s.next_sentence_label = static_cast<int8_t>(rng() & 1);
  return s;
}

std::vector<std::vector<int32_t>> pack_samples(const std::vector<Sample>& samples, int max_seq_len,
                                               int max_seqs_per_pack) {
  std::vector<SeqRef> refs;
  for (size_t i = 0; i < samples.size(); ++i)
    refs.push_back({static_cast<int64_t>(i), samples[i].length()});
  std::vector<std::vector<int32_t>> packs;
  for (const auto& pack : pack_online(refs, PackingLimits{max_seq_len, max_seqs_per_pack}))
    packs.emplace_back(pack.begin(), pack.end());
  return packs;
}

StepBatch random_step_batch(std::mt19937_64& rng, int n, int micro_steps, int min_len, int max_len,
                            int max_predictions) {
  StepBatch b;
  b.micro_batches.resize(static_cast<size_t>(micro_steps));
  for (int i = 0; i < n; ++i) {
    Sample s = random_sample(rng, min_len, max_len, max_predictions);
    s.id = i;
    b.global_samples += 1;
    b.global_masked_tokens += s.num_masked();
    b.global_tokens += s.length();
    b.micro_batches[static_cast<size_t>(i % micro_steps)].samples.push_back(std::move(s));
  }
  for (LoaderMicroBatch& mb : b.micro_batches) mb.packs = pack_samples(mb.samples, max_len);
  return b;
}

int run_command(const std::string& cmd, std::string* output) {
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace packbert::test
