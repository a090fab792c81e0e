// Helpers for the model tests (label model): random samples for any vocabulary, a model with
// its own host parameter and gradient buffers, one forward + backward, and per-tensor gradient
// comparison over the parameter table.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/batch.h"
#include "model/bert.h"
#include "model/params.h"
#include "test_util.h"
#include "train/batching.h"

namespace packbert::test {

inline std::mt19937_64 model_rng(uint64_t salt) {
  return std::mt19937_64(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
}

// A sample of `len` tokens (len >= 5): [CLS] A [SEP] B [SEP] with ids from [first_id, vocab),
// 1..max_predictions masked positions (never [CLS]/[SEP]), a random NSP label.
inline Sample model_sample(std::mt19937_64& rng, int64_t id, int len, int max_predictions,
                           int64_t vocab, int32_t first_id = 3) {
  constexpr int32_t kCls = 1, kSep = 2;  // any ids below first_id
  Sample s;
  s.id = id;
  const int len_a = std::uniform_int_distribution<int>(2, len - 3)(rng);
  std::uniform_int_distribution<int32_t> tok(first_id, static_cast<int32_t>(vocab - 1));
  for (int i = 0; i < len; ++i) {
    s.input_ids.push_back(tok(rng));
    s.segment_ids.push_back(i > len_a ? 1 : 0);
  }
  s.input_ids[0] = kCls;
  s.input_ids[len_a] = kSep;
  s.input_ids[len - 1] = kSep;
  std::vector<int32_t> cand;
  for (int i = 1; i < len; ++i)
    if (s.input_ids[i] != kSep) cand.push_back(i);
  std::shuffle(cand.begin(), cand.end(), rng);
  const int p = std::uniform_int_distribution<int>(
      1, std::min<int>(max_predictions, static_cast<int>(cand.size())))(rng);
  cand.resize(p);
  std::sort(cand.begin(), cand.end());
  for (int32_t pos : cand) {
    s.masked_lm_positions.push_back(pos);
    s.masked_lm_ids.push_back(tok(rng));
  }
  s.next_sentence_label = static_cast<int8_t>(rng() & 1);
  return s;
}

// Samples with the given lengths and distinct ids spread over the 44-bit dropout key range.
inline std::vector<Sample> model_samples(std::mt19937_64& rng, const std::vector<int>& lengths,
                                         int max_predictions, int64_t vocab) {
  std::vector<Sample> out;
  std::uniform_int_distribution<int64_t> id(0, (int64_t{1} << 44) - 1);
  for (int len : lengths) {
    int64_t v;
    do v = id(rng);
    while (std::any_of(out.begin(), out.end(), [&](const Sample& s) { return s.id == v; }));
    out.push_back(model_sample(rng, v, len, max_predictions, vocab));
  }
  return out;
}

inline int64_t masked_count(const std::vector<Sample>& samples) {
  int64_t n = 0;
  for (const Sample& s : samples) n += s.num_masked();
  return n;
}

// Host parameters initialised as the model would be.
struct HostModel {
  BertConfig config;
  ParamTable table;
  std::vector<float> params;

  HostModel(const BertConfig& c, uint64_t seed, float std = 0.02f)
      : config(c), table(c), params(static_cast<size_t>(table.total())) {
    init_parameters(table, InitOptions{seed, std}, params.data());
  }
  Tensor params_view() { return view(params.data(), {table.total()}); }
};

struct StepOutput {
  ForwardResult result;
  std::vector<float> grads;
};

// forward + backward of `batches` in order (micro-steps) into one gradient buffer.
inline StepOutput run_step(Backend& be, HostModel& m, const std::vector<Batch>& batches,
                           int64_t global_masked, int64_t global_samples, uint32_t step,
                           uint64_t seed, const BertOptions& options = {}) {
  StepOutput out;
  out.grads.assign(m.params.size(), 0.f);
  Bert bert(m.config, be, m.params_view(), view(out.grads.data(), {m.table.total()}), options);
  for (const Batch& b : batches) {
    const ForwardResult r = bert.forward(b, global_masked, global_samples, step, seed);
    bert.backward();
    out.result.loss += r.loss;
    out.result.mlm_loss_sum += r.mlm_loss_sum;
    out.result.nsp_loss_sum += r.nsp_loss_sum;
    out.result.mlm_correct += r.mlm_correct;
    out.result.nsp_correct += r.nsp_correct;
    out.result.masked_tokens += r.masked_tokens;
    out.result.sequences += r.sequences;
  }
  return out;
}

inline double rel_l2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline double l2(const float* a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * a[i];
  return std::sqrt(s);
}

inline bool is_key_bias(const std::string& name) {
  const std::string suffix = "attention.self.key.bias";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every tensor of `got` against `want`: rel L2 <= tol, printed as "[model-error] ...". The key
// bias is special: its true gradient is exactly zero (a bias on every key adds the same q.b to
// each score of a query row, which softmax cancels), so both sides hold rounding noise only;
// it is measured against the norm of its layer's whole QKV bias gradient instead. Returns the
// worst error and its tensor.
inline std::pair<double, std::string> expect_grads_close(const ParamTable& table,
                                                         const std::vector<float>& got,
                                                         const std::vector<float>& want,
                                                         double tol, const std::string& what,
                                                         bool print_all = false) {
  std::pair<double, std::string> worst{0.0, ""};
  for (const ParamTensor& t : table.tensors()) {
    const float* a = got.data() + t.offset;
    const float* b = want.data() + t.offset;
    double e;
    if (is_key_bias(t.name)) {
      const ParamTensor& q = table.at(t.name.substr(0, t.name.size() - 8) + "query.bias");
      std::vector<float> diff(t.size);
      for (int64_t i = 0; i < t.size; ++i) diff[i] = a[i] - b[i];
      e = l2(diff.data(), t.size) / l2(want.data() + q.offset, 3 * t.size);
    } else {
      e = rel_l2(a, b, t.size);
    }
    if (print_all) std::printf("[model-error] %s %-62s %.2e\n", what.c_str(), t.name.c_str(), e);
    EXPECT_LE(e, tol) << what << ": " << t.name;
    if (!(e <= worst.first)) worst = {e, t.name};
  }
  std::printf("[model-error] %s: worst tensor %s %.2e\n", what.c_str(), worst.second.c_str(),
              worst.first);
  return worst;
}

}  // namespace packbert::test
