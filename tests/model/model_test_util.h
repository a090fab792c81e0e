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
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/batch.h"
#include "model/bert.h"
#include "measure.h"
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

// model_samples drawn again until their masked tokens number lo .. hi.
inline std::vector<Sample> model_samples_masked(std::mt19937_64& rng,
                                                const std::vector<int>& lengths,
                                                int max_predictions, int64_t vocab, int64_t lo,
                                                int64_t hi) {
  for (int tries = 0; tries < 100000; ++tries) {
    auto samples = model_samples(rng, lengths, max_predictions, vocab);
    const int64_t n = masked_count(samples);
    if (n >= lo && n <= hi) return samples;
  }
  throw std::runtime_error("model_samples_masked: these lengths do not give " + std::to_string(lo) +
                           " .. " + std::to_string(hi) + " masked tokens");
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

// The options of a precision, an MST chunk count and a recomputation mode.
inline BertOptions precision_options(Precision p, int64_t mst = 1, Recompute r = Recompute::none) {
  BertOptions o;
  o.precision = p;
  o.mst_chunks = mst;
  o.recompute = r;
  return o;
}

// |a - b| / |b|.
inline double rel(double a, double b) { return std::abs(a - b) / std::abs(b); }

// A global batch of n samples with mixed lengths up to max_len (an odd one, a minimal 5, a full
// one, the rest drawn) for the tiny model: the batch the equivalence and precision tests use.
inline std::vector<Sample> mixed_length_batch(std::mt19937_64& rng, int n, int64_t vocab,
                                              int max_len) {
  std::vector<int> lengths = {5, max_len, 33};
  while (static_cast<int>(lengths.size()) < n)
    lengths.push_back(std::uniform_int_distribution<int>(5, max_len)(rng));
  std::shuffle(lengths.begin(), lengths.end(), rng);
  return model_samples(rng, lengths, 10, vocab);
}

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

// ||a - b|| (infinity if either holds a NaN).
inline double l2_diff(const float* a, const float* b, int64_t n) {
  double num = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
  }
  return std::sqrt(num);
}

inline double l2(const float* a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * a[i];
  return std::sqrt(s);
}

inline double rel_l2(const float* a, const float* b, int64_t n) {
  const double den = l2(b, n);
  return den > 0 ? l2_diff(a, b, n) / den : l2_diff(a, b, n);
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// BERT's tiny shape with ModernBERT's layer options: pre-norm with a final norm, rotary
// positions (local and global bases), GeGLU, layer 1 local with a window of 16 (the tests'
// sequences reach 64 tokens), no biases but the decoder's, norms without a bias, no token
// types, epsilon 1e-5, no NSP head; dropout kept at 0.1 so that every dropout site runs.
inline BertConfig modern_tiny() {
  BertConfig c = bert_preset("tiny");
  c.norm = NormPlacement::pre;
  c.position = Positions::rope;
  c.rope_theta = 160000.f;
  c.local_window = 16;
  c.global_every = 2;
  c.mlp = MlpKind::geglu;
  c.intermediate = 192;
  c.bias = c.norm_bias = c.token_types = c.nsp_head = false;
  c.layer_norm_eps = 1e-5f;
  return c;
}

inline bool is_key_bias(const std::string& name) {
  return ends_with(name, "attention.self.key.bias");
}

// The gradients that are sums which cancel at initialisation, so that an fp32 or storage
// rounding upstream, a small change of their terms, is a large one of their small sum:
// - attention's query weight and bias and key weight: the softmax gradient
//   P * (dP - rowsum(P * dP)) of a nearly uniform P;
// - the NSP head's (pooler dense, classifier weight): sums over sequences of terms carrying
//   the sign of (p - label), p ~ 0.5, which cancel when the labels balance.
// (The key bias and the NSP bias are measured differently instead: grad_error.)
inline bool cancels_at_init(const std::string& name) {
  return ends_with(name, "attention.self.query.weight") ||
         ends_with(name, "attention.self.query.bias") ||
         ends_with(name, "attention.self.key.weight") || name == "bert.pooler.dense.weight" ||
         name == "bert.pooler.dense.bias" || name == "cls.seq_relationship.weight";
}

// The error of a Q or K bias gradient measured against the norm of its layer's whole QKV bias
// gradient (the three biases are one [3H] tensor in the table, query first).
inline double qkv_bias_error(const ParamTable& table, const ParamTensor& t,
                             const std::vector<float>& got, const std::vector<float>& want) {
  const std::string layer = t.name.substr(0, t.name.rfind("attention.self."));
  const ParamTensor& q = table.at(layer + "attention.self.query.bias");
  return l2_diff(got.data() + t.offset, want.data() + t.offset, t.size) /
         l2(want.data() + q.offset, 3 * t.size);
}

// The NSP classifier's bias gradient is the mean over the gs sequences of (softmax - onehot):
// two numbers [s, -s], a sum of terms of size ~0.5 / gs (p ~ 0.5 at init) whose signs follow
// the labels, so it cancels to far below its terms when the labels balance. The terms'
// rounding errors do not cancel, so its relative error is unbounded there (fp32: 2.4e-6 for a
// chunked run against its 2e-6 bar, one seed in ~100; fp16: 1.3e-2). It is measured against
// max(its norm, the norm such a random-sign sum has, 0.5 sqrt(2 / gs)) instead: the same bound
// where it does not cancel, the noise floor where it does.
inline double nsp_bias_error(const ParamTensor& t, const std::vector<float>& got,
                             const std::vector<float>& want, int64_t global_samples) {
  const double floor = 0.5 * std::sqrt(2.0 / static_cast<double>(global_samples));
  return l2_diff(got.data() + t.offset, want.data() + t.offset, t.size) /
         std::max(l2(want.data() + t.offset, t.size), floor);
}

// How expect_grads_close measures and bounds. Set the fields by name: an aggregate's
// positional `true` would land in cancelling_tol.
struct GradCompare {
  // > 0: the global batch's sequence count, and the NSP bias is measured by nsp_bias_error.
  int64_t global_samples = 0;
  // > 0: the bar of the tensors of cancels_at_init() (0: the common one).
  double cancelling_tol = 0;
  bool print_all = false;  // a line per tensor, not only the worst
};

inline GradCompare with_nsp_floor(int64_t global_samples, double cancelling_tol = 0) {
  GradCompare c;
  c.global_samples = global_samples;
  c.cancelling_tol = cancelling_tol;
  return c;
}

// One tensor's error as expect_grads_close measures it: rel L2, except the key bias (its true
// gradient is exactly zero: a bias on every key adds the same q.b to each score of a query
// row, which softmax cancels, so both sides hold rounding noise only; qkv_bias_error) and,
// given the sequence count, the NSP bias (nsp_bias_error).
inline double grad_error(const ParamTable& table, const ParamTensor& t,
                         const std::vector<float>& got, const std::vector<float>& want,
                         const GradCompare& c) {
  if (is_key_bias(t.name)) return qkv_bias_error(table, t, got, want);
  if (c.global_samples > 0 && t.name == "cls.seq_relationship.bias")
    return nsp_bias_error(t, got, want, c.global_samples);
  return rel_l2(got.data() + t.offset, want.data() + t.offset, t.size);
}

// Every tensor of `got` against `want`: grad_error <= tol (c.cancelling_tol for the sums that
// cancel, when set), each expected by name. The worst over the tensors is printed as a measure
// ("WHAT: worst tensor", and "WHAT: worst cancelling tensor" when they have their own bar), with
// an "[model-error]" line naming the tensor. Returns the worst error and its tensor.
inline std::pair<double, std::string> expect_grads_close(const ParamTable& table,
                                                         const std::vector<float>& got,
                                                         const std::vector<float>& want, double tol,
                                                         const std::string& what,
                                                         const GradCompare& c = {}) {
  std::pair<double, std::string> worst{0.0, ""}, worst_cancelling{0.0, ""};
  for (const ParamTensor& t : table.tensors()) {
    const double e = grad_error(table, t, got, want, c);
    if (c.print_all) std::printf("[model-error] %s %-62s %.2e\n", what.c_str(), t.name.c_str(), e);
    const bool own_bar = c.cancelling_tol > 0 && cancels_at_init(t.name);
    EXPECT_LE(e, own_bar ? c.cancelling_tol : tol) << what << ": " << t.name;
    auto& w = own_bar ? worst_cancelling : worst;
    if (!(e <= w.first)) w = {e, t.name};
  }
  if (c.cancelling_tol > 0) {
    std::printf("[model-error] %s: worst cancelling tensor %s\n", what.c_str(),
                worst_cancelling.second.c_str());
    print_measure(what + ": worst cancelling tensor", worst_cancelling.first, c.cancelling_tol);
  }
  std::printf("[model-error] %s: worst %stensor %s\n", what.c_str(),
              c.cancelling_tol > 0 ? "other " : "", worst.second.c_str());
  print_measure(what + ": worst " + (c.cancelling_tol > 0 ? "other " : "") + "tensor", worst.first,
                tol);
  return worst_cancelling.first > worst.first ? worst_cancelling : worst;
}

// got's loss against want's, relative, as a measure under tol (printed either way).
inline void expect_loss_close(const StepOutput& got, const StepOutput& want, double tol,
                              const std::string& what) {
  ASSERT_TRUE(std::isfinite(got.result.loss)) << what;
  std::printf("[model-error] %s: loss %.6f vs %.6f\n", what.c_str(), got.result.loss,
              want.result.loss);
  expect_measure(what + ": loss", rel(got.result.loss, want.result.loss), tol);
}

}  // namespace packbert::test
