// packbert's CPU model against PyTorch (DESIGN.md, Testing: the llm.c test_gpt2 way).
// tests/reference/make_model_reference.py wrote tests/data/model_reference.bin: a tiny BERT's
// weights (by Hugging Face name), one batch, its loss and every gradient (float64 PyTorch), and
// the losses of 3 apex-FusedLAMB updates. Here the same weights go into packbert's flat buffer by
// name, the batch runs in the padded, packed and unpadded layouts with dropout off, and the loss,
// every gradient and the LAMB trajectory must match.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "optim/lamb.h"
#include "optim/lr_schedule.h"

namespace packbert::test {
namespace {

// Loss: the reference is float64, packbert fp32 (DESIGN.md's fp32-vs-fp64 tolerance).
constexpr double kLossTol = 1e-5;
// Gradients, rel L2 per tensor: DESIGN.md's fp32-vs-fp64 1e-5. Measured worst ~1.2e-6 in all
// three layouts (1.21e-6 over the 1000 seeds of tests/seed_sweeps.txt, margin 8.2; the losses
// 2.3e-7), whatever the sample order and MLM chunking (layer 1's query/key weights, or the
// pooler and NSP weights, which sum over only 5 [CLS] rows); the key bias is judged against its
// layer's QKV bias gradient (model_test_util.h: its true gradient is exactly 0). The margin is
// not slack: a reference with the tanh GELU moves the loss by only 5.7e-6 but the gradients by
// 6.6e-4, and LayerNorm eps 1e-5 instead of 1e-12 moves the loss 2e-7, the gradients 4.6e-4.
constexpr double kGradTol = 1e-5;
// LAMB losses after each of 3 updates. The updates are large (the loss falls 7.69 -> 5.16) and
// at step 1 u = m^ / (sqrt(v^) + eps) is ~sign(g) elementwise, so the fp32 gradient's rounding
// enters the weights undamped and compounds through three forward passes; measured worst
// 1.3e-7 (after update 3), so DESIGN.md's 1e-5 holds with a wide margin. A trust ratio on the
// no-decay tensors too (NVLAMB) or no bias correction in the reference is off by 5e-3 to 7e-2.
constexpr double kLambLossTol = 1e-5;

// ---- the reference file (format: tests/reference/make_model_reference.py) -----------------

struct Record {
  uint32_t dtype = 0;  // 0 f32, 1 f64, 2 i32, 3 i64
  std::vector<int64_t> dims;
  std::vector<char> bytes;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  template <typename T>
  std::vector<T> as(uint32_t want) const {
    EXPECT_EQ(dtype, want);
    std::vector<T> out(static_cast<size_t>(numel()));
    if (dtype == want && bytes.size() == out.size() * sizeof(T))
      std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  std::vector<float> f32() const { return as<float>(0); }
  std::vector<double> f64() const { return as<double>(1); }
  std::vector<int32_t> i32() const { return as<int32_t>(2); }
  int64_t i64_scalar() const { return as<int64_t>(3).at(0); }
  double f64_scalar() const { return f64().at(0); }
};

struct Reference {
  std::vector<std::string> order;  // record names in file order
  std::map<std::string, Record> records;

  const Record& at(const std::string& name) const {
    const auto it = records.find(name);
    if (it == records.end()) throw std::runtime_error("reference file lacks record " + name);
    return it->second;
  }
};

template <typename T>
bool read_pod(std::ifstream& f, T& v) {
  return static_cast<bool>(f.read(reinterpret_cast<char*>(&v), sizeof(T)));
}

// The file is little endian; so is every machine packbert runs on (x86-64, aarch64), which the
// magic check below would catch otherwise (the record count would be absurd).
Reference load_reference(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  char magic[8];
  uint32_t version = 0, count = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, "PBMREF01", 8) != 0 || !read_pod(f, version) ||
      version != 1 || !read_pod(f, count) || count > 100000)
    throw std::runtime_error(path + ": not a version 1 model reference");
  Reference ref;
  for (uint32_t r = 0; r < count; ++r) {
    uint32_t len = 0, ndim = 0;
    Record rec;
    if (!read_pod(f, len) || len > 1000) throw std::runtime_error(path + ": bad record name");
    std::string name(len, '\0');
    if (!f.read(name.data(), len) || !read_pod(f, rec.dtype) || rec.dtype > 3 ||
        !read_pod(f, ndim) || ndim > 8)
      throw std::runtime_error(path + ": bad record header " + name);
    rec.dims.resize(ndim);
    for (auto& d : rec.dims)
      if (!read_pod(f, d) || d < 0) throw std::runtime_error(path + ": bad dims of " + name);
    const size_t elem = rec.dtype == 0 || rec.dtype == 2 ? 4 : 8;
    rec.bytes.resize(static_cast<size_t>(rec.numel()) * elem);
    if (!f.read(rec.bytes.data(), static_cast<std::streamsize>(rec.bytes.size())))
      throw std::runtime_error(path + ": truncated at " + name);
    ref.order.push_back(name);
    ref.records.emplace(name, std::move(rec));
  }
  return ref;
}

const Reference& reference() {
  static const Reference ref = load_reference(PACKBERT_TEST_DATA "/model_reference.bin");
  return ref;
}

BertConfig reference_config(const Reference& ref) {
  auto get = [&](const char* k) { return ref.at(std::string("config.") + k).i64_scalar(); };
  BertConfig c;
  c.vocab_size = get("vocab_size");
  c.real_vocab_size = get("real_vocab_size");
  c.hidden = get("hidden");
  c.layers = get("layers");
  c.heads = get("heads");
  c.intermediate = get("intermediate");
  c.max_position_embeddings = get("max_position_embeddings");
  c.type_vocab_size = get("type_vocab_size");
  // The default rates (0.1) stay: ForwardOptions::dropout = false must switch them off.
  return c;
}

std::vector<Sample> reference_samples(const Reference& ref) {
  std::vector<Sample> out;
  const int64_t n = ref.at("num_samples").i64_scalar();
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "sample." + std::to_string(i) + ".";
    Sample s;
    s.id = ref.at(p + "id").i64_scalar();
    s.input_ids = ref.at(p + "input_ids").i32();
    for (int32_t v : ref.at(p + "segment_ids").i32())
      s.segment_ids.push_back(static_cast<int8_t>(v));
    s.masked_lm_positions = ref.at(p + "masked_positions").i32();
    s.masked_lm_ids = ref.at(p + "masked_labels").i32();
    s.next_sentence_label = static_cast<int8_t>(ref.at(p + "nsp_label").i32().at(0));
    out.push_back(std::move(s));
  }
  return out;
}

// A flat table-ordered buffer from the records "<prefix><hf name>", each checked for its shape.
std::vector<float> flat_from(const Reference& ref, const ParamTable& table,
                             const std::string& prefix) {
  std::vector<float> flat(static_cast<size_t>(table.total()), 0.f);
  for (const ParamTensor& t : table.tensors()) {
    const Record& r = ref.at(prefix + t.name);
    EXPECT_EQ(r.dims, t.shape) << prefix << t.name;
    const std::vector<float> v = r.f32();
    if (static_cast<int64_t>(v.size()) == t.size)
      std::copy(v.begin(), v.end(), flat.begin() + t.offset);
  }
  return flat;
}

struct Fixture {
  const Reference& ref = reference();
  BertConfig config = reference_config(ref);
  ParamTable table{config};
  std::vector<Sample> samples = reference_samples(ref);
  int max_seq_len = static_cast<int>(ref.at("config.max_seq_len").i64_scalar());
  int64_t global_masked = masked_count(samples);
  int64_t global_samples = static_cast<int64_t>(samples.size());
};

// One forward + backward with dropout off; grads is zeroed first.
ForwardResult forward_backward(Backend& be, const Fixture& fx, std::vector<float>& params,
                               std::vector<float>& grads, const Batch& batch,
                               const BertOptions& options = {}) {
  std::fill(grads.begin(), grads.end(), 0.f);
  Bert bert(fx.config, be, view(params.data(), {fx.table.total()}),
            view(grads.data(), {fx.table.total()}), options);
  ForwardOptions opts;
  opts.dropout = false;
  // step and seed would key dropout masks; arbitrary values show they do not matter here.
  const ForwardResult r =
      bert.forward(batch, fx.global_masked, fx.global_samples, 12345, 678, opts);
  bert.backward();
  return r;
}

TEST(ModelReference, TableMatchesTheFile) {
  const Fixture fx;
  // The parameter count PyTorch printed (tied decoder counted once, as HF counts it).
  EXPECT_EQ(fx.table.total(), fx.ref.at("num_params").i64_scalar());
  std::printf("parameters: %lld (%s)\n", static_cast<long long>(fx.table.total()),
              describe(fx.config).c_str());
  // The file lists the parameters in packbert's table order, by the same names.
  std::vector<std::string> file_params;
  for (const std::string& n : fx.ref.order)
    if (n.rfind("param.", 0) == 0) file_params.push_back(n.substr(6));
  ASSERT_EQ(file_params.size(), fx.table.tensors().size());
  for (size_t i = 0; i < file_params.size(); ++i) {
    const ParamTensor& t = fx.table.tensors()[i];
    EXPECT_EQ(file_params[i], t.name) << "tensor " << i;
    EXPECT_EQ(fx.ref.at("param." + t.name).dims, t.shape) << t.name;
    // The table's no_decay and MLPerf's name rule (what the script's LAMB used) agree.
    EXPECT_EQ(t.no_decay, mlperf_no_decay(t.name)) << t.name;
  }
}

TEST(ModelReference, LossAndGradientsMatchPyTorchInEveryLayout) {
  const Fixture fx;
  auto be = make_cpu_backend();
  std::vector<float> params = flat_from(fx.ref, fx.table, "param.");
  const std::vector<float> want = flat_from(fx.ref, fx.table, "grad.");
  const double want_loss = fx.ref.at("loss").f64_scalar();
  const double want_mlm = fx.ref.at("mlm_loss_sum").f64_scalar();
  const double want_nsp = fx.ref.at("nsp_loss_sum").f64_scalar();
  std::vector<float> grads(params.size());
  // The file is fixed, but what must not matter varies each run (DESIGN.md: fresh inputs): the
  // order of the samples in the batch and the MLM decoder's chunking (0: one chunk).
  auto rng = model_rng(71);
  std::vector<Sample> samples = fx.samples;
  std::shuffle(samples.begin(), samples.end(), rng);
  BertOptions options;
  options.mlm_chunk_rows = std::uniform_int_distribution<int64_t>(0, fx.global_masked)(rng);
  std::printf("sample order shuffled, mlm_chunk_rows %lld\n",
              static_cast<long long>(options.mlm_chunk_rows));
  for (BatchLayout layout : {BatchLayout::padded, BatchLayout::packed, BatchLayout::unpadded}) {
    const std::string name = batch_layout_name(layout);
    const Batch batch =
        make_batch(samples, layout, fx.max_seq_len, pack_samples(samples, fx.max_seq_len));
    const ForwardResult r = forward_backward(*be, fx, params, grads, batch, options);
    std::printf("[model-error] %s: loss %.9f vs torch %.9f\n", name.c_str(), r.loss, want_loss);
    expect_measure(name + " vs torch: loss", rel(r.loss, want_loss), kLossTol);
    expect_measure(name + " vs torch: mlm loss sum", rel(r.mlm_loss_sum, want_mlm), kLossTol);
    expect_measure(name + " vs torch: nsp loss sum", rel(r.nsp_loss_sum, want_nsp), kLossTol);
    EXPECT_EQ(r.masked_tokens, fx.global_masked);
    EXPECT_EQ(r.sequences, fx.global_samples);
    // Print every tensor for the padded layout (the record of the measured errors).
    GradCompare every_tensor;
    every_tensor.print_all = layout == BatchLayout::padded;
    expect_grads_close(fx.table, grads, want, kGradTol, name + " vs torch", every_tensor);
  }
}

TEST(ModelReference, ThreeLambStepsFollowPyTorch) {
  const Fixture fx;
  auto be = make_cpu_backend();
  const Reference& ref = fx.ref;
  std::vector<float> params = flat_from(ref, fx.table, "param.");
  std::vector<float> grads(params.size(), 0.f);

  LrScheduleConfig sc;
  sc.base_lr = ref.at("lamb.base_lr").f64_scalar();
  sc.max_steps = ref.at("lamb.max_steps").i64_scalar();
  sc.num_warmup_steps = ref.at("lamb.warmup_steps").i64_scalar();
  sc.poly_power = ref.at("lamb.poly_power").f64_scalar();
  const LrSchedule schedule(sc);
  LambOptions lo;
  lo.beta1 = static_cast<float>(ref.at("lamb.beta1").f64_scalar());
  lo.beta2 = static_cast<float>(ref.at("lamb.beta2").f64_scalar());
  lo.eps = static_cast<float>(ref.at("lamb.eps").f64_scalar());
  lo.weight_decay = static_cast<float>(ref.at("lamb.weight_decay").f64_scalar());
  lo.max_grad_norm = static_cast<float>(ref.at("lamb.max_grad_norm").f64_scalar());
  std::vector<LambParam> lamb_params;
  for (const ParamTensor& t : fx.table.tensors())
    lamb_params.push_back({t.name, t.offset, t.size, t.no_decay});
  Lamb lamb(*be, lamb_params, fx.table.total(), schedule, lo);

  const int64_t steps = ref.at("lamb.steps").i64_scalar();
  const std::vector<double> want_lr = ref.at("lamb.lr").f64();
  const std::vector<double> want_loss = ref.at("lamb.loss").f64();
  ASSERT_EQ(static_cast<int64_t>(want_lr.size()), steps);
  ASSERT_EQ(static_cast<int64_t>(want_loss.size()), steps + 1);
  const Batch batch = make_batch(fx.samples, BatchLayout::unpadded, fx.max_seq_len);
  const Tensor p = view(params.data(), {fx.table.total()});
  const Tensor g = view(grads.data(), {fx.table.total()});
  for (int64_t k = 0; k <= steps; ++k) {
    const ForwardResult r = forward_backward(*be, fx, params, grads, batch);
    std::printf("[model-error] LAMB after %lld updates: loss %.9f vs torch %.9f\n",
                static_cast<long long>(k), r.loss, want_loss[static_cast<size_t>(k)]);
    expect_measure("LAMB after " + std::to_string(k) + " updates: loss vs torch",
                   rel(r.loss, want_loss[static_cast<size_t>(k)]), kLambLossTol);
    if (k == steps) break;
    const LambStepInfo info = lamb.step(p, g);
    EXPECT_NEAR(info.lr, want_lr[static_cast<size_t>(k)], 1e-12) << "update " << k + 1;
    // The script's gradient norm exceeds max_grad_norm, so clipping is exercised (printed).
    std::printf("  update %lld: lr %.6g, grad norm %.6f\n", static_cast<long long>(info.step),
                info.lr, info.grad_norm);
  }
}

}  // namespace
}  // namespace packbert::test
