// gpu label: the whole model (src/model/bert.h) on the CUDA backend, with its arena in the
// backend's memory (Backend::alloc), against the CPU backend on the tiny config: one forward +
// backward with dropout on, in the unpadded and padded layouts; the loss and every parameter
// gradient; with either GELU; and the segmented CUDA graphs against the ops run one by one.
//
// Tolerance: rel L2 <= 1e-4 per tensor (DESIGN.md, Testing). Both sides are fp32; the GPU sums
// in other orders (cuBLASLt tiles, tree reductions, online softmax), and the errors of ~1e-6
// per op compound through 2 layers forward and backward. The key bias, whose true gradient is
// zero, is measured against its layer's QKV bias gradient (model_test_util.h).
#include <gtest/gtest.h>

#include <iostream>
#include <set>

#include "kernels/common/philox.h"
#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include "../model/model_test_util.h"
#include "cuda_test_util.h"

namespace packbert::test {
namespace {

constexpr int kMaxSeqLen = 64;
constexpr double kModelTol = 1e-4;

StepOutput run_cuda_step(Backend& gpu, HostModel& m, const Batch& batch, int64_t global_masked,
                         int64_t global_samples, uint32_t step, uint64_t seed,
                         const BertOptions& options = {}) {
  const int64_t total = m.table.total();
  DevBuf<float> params({total}, m.params), grads({total});
  gpu.zero(grads.tensor());
  StepOutput out;
  {
    Bert bert(m.config, gpu, params.tensor(), grads.tensor(), options);
    out.result = bert.forward(batch, global_masked, global_samples, step, seed);
    bert.backward();
    gpu.synchronize();
  }
  EXPECT_TRUE(grads.guards_intact());
  EXPECT_TRUE(params.guards_intact());
  EXPECT_EQ(params.values(), m.params) << "the model changed its parameters";
  out.grads = grads.values();
  return out;
}

// The model of `config` on the CUDA backend against the CPU backend's, in each layout (packed:
// the samples packed to kMaxSeqLen), the CUDA side with `options` (MST, recomputation).
void check_against_cpu(const BertConfig& config, double tol, const std::string& name,
                       const std::vector<BatchLayout>& layouts, const BertOptions& options = {}) {
  auto rng = model_rng(101);
  auto cpu = make_cpu_backend();
  CudaBackendOptions o;
  o.sync_each_op = true;
  auto gpu = make_cuda_backend(0, o);
  HostModel m(config, rng());
  std::vector<int> lengths = {5, kMaxSeqLen, 33, 1 + kMaxSeqLen / 2, 17, 6, 64, 40};
  const auto samples = model_samples(rng, lengths, 10, m.config.real_vocab_size);
  const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
  const auto step = static_cast<uint32_t>(rng() % kDropoutMaxStep);
  const uint64_t seed = rng();
  for (BatchLayout layout : layouts) {
    const Batch batch = make_batch(samples, layout, kMaxSeqLen, pack_samples(samples, kMaxSeqLen));
    const StepOutput want = run_step(*cpu, m, {batch}, gm, gs, step, seed);
    const StepOutput got = run_cuda_step(*gpu, m, batch, gm, gs, step, seed, options);
    const std::string what = "cuda vs cpu, " + name + batch_layout_name(layout);
    std::printf("[model-error] %s: loss %.6f vs %.6f\n", what.c_str(), got.result.loss,
                want.result.loss);
    ASSERT_TRUE(std::isfinite(got.result.loss));
    expect_measure(what + ": loss",
                   std::abs(got.result.loss - want.result.loss) / std::abs(want.result.loss), tol);
    // Counts of argmax == label: a near-tie may flip one token between backends.
    expect_measure(what + ": mlm correct count",
                   std::abs(static_cast<double>(got.result.mlm_correct - want.result.mlm_correct)),
                   1);
    expect_measure(what + ": nsp correct count",
                   std::abs(static_cast<double>(got.result.nsp_correct - want.result.nsp_correct)),
                   1);
    expect_grads_close(m.table, got.grads, want.grads, tol, what, with_nsp_floor(gs));
  }
}

void check_tiny_bert(Gelu form, double tol) {
  BertConfig config = bert_preset("tiny");
  config.hidden_act = form;
  check_against_cpu(config, tol, form == Gelu::tanh ? "tanh GELU, " : "",
                    {BatchLayout::unpadded, BatchLayout::padded});
}

TEST(CudaModel, TinyBertMatchesCpu) {
  PB_REQUIRE_CUDA_DEVICE();
  check_tiny_bert(Gelu::erf, kModelTol);
}

// ModernBERT's options (modern_tiny: pre-norm, rotary positions, GeGLU, a local and a global
// layer's windows, no biases) in every layout, and with MST chunks and layer recomputation on
// the GPU, at the same bar: over 200 emulated seeds (tests/seed_sweeps.txt) the worst tensor
// was 8.4e-7 (margin 119), the loss 1.2e-7.
TEST(CudaModel, TinyModernBertMatchesCpu) {
  PB_REQUIRE_CUDA_DEVICE();
  const std::vector<BatchLayout> all = {BatchLayout::unpadded, BatchLayout::packed,
                                        BatchLayout::padded};
  check_against_cpu(modern_tiny(), kModelTol, "modern, ", all);
  BertOptions mst;
  mst.mst_chunks = 3;
  mst.recompute = Recompute::layer;
  check_against_cpu(modern_tiny(), kModelTol, "modern M=3 recompute layer, ", {BatchLayout::packed},
                    mst);
}

// model.hidden_act = "gelu_tanh": the MLP's GELU in cuBLASLt's GELU_AUX_BIAS / DGELU epilogues
// (H = 128, I = 512 take them), whose tanh may be the hardware approximation (relative error
// ~2^-11 per element, kGeluEpilogueTol of the ops test): 5e-3 here.
TEST(CudaModel, TinyBertTanhGeluMatchesCpu) {
  PB_REQUIRE_CUDA_DEVICE();
  check_tiny_bert(Gelu::tanh, 5e-3);
}

// The tiny model twice over the same weights: op by op and with graphs (segmented unless said),
// each with a gradient of its own, on one backend as the trainer's (no index validation, which
// waits for the device), both sized for the largest batch up front as the trainer does (an arena
// that grew for a batch with more masked tokens would move, and the layers' graphs with it).
struct GraphedPair {
  GraphedPair(std::mt19937_64& rng, Precision precision, const BatchShape& largest,
              CudaGraphs graphs = CudaGraphs::segmented)
      : gpu(make_cuda_backend(0, backend_options())),
        config(bert_preset("tiny")),
        m(config, rng()),
        params({m.table.total()}, m.params),
        grads_off({m.table.total()}),
        grads_on({m.table.total()}),
        off(bert_options(precision, CudaGraphs::off)),
        on(bert_options(precision, graphs)),
        eager(m.config, *gpu, params.tensor(), grads_off.tensor(), off),
        graphed(m.config, *gpu, params.tensor(), grads_on.tensor(), on) {
    eager.grow_for(largest);
    graphed.grow_for(largest);
  }
  static CudaBackendOptions backend_options() {
    CudaBackendOptions bo;
    bo.validate_indices = false;
    return bo;
  }
  static BertOptions bert_options(Precision precision, CudaGraphs graphs) {
    BertOptions o;
    o.precision = precision;
    o.cuda_graphs = graphs;
    return o;
  }
  std::unique_ptr<Backend> gpu;
  BertConfig config;
  HostModel m;
  DevBuf<float> params, grads_off, grads_on;
  BertOptions off, on;
  Bert eager, graphed;
};

// The pair's weights forward only (evaluation: models without gradients, no dropout), op by op
// and with the pair's graphs.
struct EvalPair {
  EvalPair(GraphedPair& p, const BatchShape& largest)
      : off(p.m.config, *p.gpu, p.params.tensor(), Tensor(), p.off),
        on(p.m.config, *p.gpu, p.params.tensor(), Tensor(), p.on) {
    off.grow_for(largest, false);
    on.grow_for(largest, false);
    fo.gradients = false;
    fo.dropout = false;
  }
  Bert off, on;
  ForwardOptions fo;
};

// n sequence lengths of 5 .. 64 tokens totalling `target` (5 n <= target <= 64 n): random
// lengths, then the total moved onto the target one token at a time on sequences that can take
// it.
std::vector<int> lengths_totalling(std::mt19937_64& rng, int n, int target) {
  std::vector<int> lengths(static_cast<size_t>(n));
  for (int& len : lengths) len = 5 + static_cast<int>(rng() % (kMaxSeqLen - 4));
  int sum = 0;
  for (int len : lengths) sum += len;
  for (size_t i = 0; sum != target; i = (i + 1) % lengths.size()) {
    if (sum < target && lengths[i] < kMaxSeqLen) ++lengths[i], ++sum;
    if (sum > target && lengths[i] > 5) --lengths[i], --sum;
  }
  return lengths;
}

// BertOptions::cuda_graphs = segmented: each encoder layer's forward and backward, and the
// heads, recorded at a shape's second use and replayed after give the loss and every gradient
// of the ops run one by one, bit for bit, step after step with dropout on (a new step, new
// batches of the padded layout's one shape, and an unpadded batch of another shape between
// them; 31 to 45 masked tokens, laid into the bound's 60: GraphCapacity), in fp32
// and bf16; once recorded, a step launches a graph per layer and direction and one for the
// heads, and fewer kernels; and evaluation's forwards, whose layers and heads replay their own
// graphs.
TEST(CudaModel, SegmentedGraphsGiveTheOpsBits) {
  PB_REQUIRE_CUDA_DEVICE();
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    auto rng = model_rng(102);
    const BatchShape largest{6 * kMaxSeqLen, 6 * 10, 6, kMaxSeqLen};
    GraphedPair pair(rng, precision, largest);
    const uint64_t seed = rng();
    BackendCounters before_off{}, before_on{};
    int64_t launches_off = 0, launches_on = 0, graphs_on = 0;
    for (int step = 0; step < 8; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      std::vector<int> lengths(6);
      // 13 .. 64 tokens: room for 10 masked tokens in each, so 31 .. 45 in all can be drawn.
      for (int& len : lengths) len = 13 + static_cast<int>(rng() % (kMaxSeqLen - 12));
      const auto samples =
          model_samples_masked(rng, lengths, 10, pair.m.config.real_vocab_size, 31, 45);
      const BatchLayout layout = step == 5 ? BatchLayout::unpadded : BatchLayout::padded;
      const Batch batch = make_batch(samples, layout, kMaxSeqLen);
      const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
      const auto s = static_cast<uint32_t>(1000 + 7 * step);
      auto run = [&](Bert& bert, DevBuf<float>& grads, BackendCounters& before) {
        pair.gpu->zero(grads.tensor());
        pair.gpu->synchronize();
        before = pair.gpu->counters();
        const ForwardResult r = bert.forward(batch, gm, gs, s, seed);
        bert.backward();
        pair.gpu->synchronize();
        return r;
      };
      const ForwardResult want = run(pair.eager, pair.grads_off, before_off);
      const BackendCounters after_off = pair.gpu->counters();
      const ForwardResult got = run(pair.graphed, pair.grads_on, before_on);
      const BackendCounters after_on = pair.gpu->counters();
      EXPECT_EQ(got.loss, want.loss);
      EXPECT_EQ(got.mlm_correct, want.mlm_correct);
      EXPECT_EQ(got.nsp_correct, want.nsp_correct);
      EXPECT_EQ(pair.grads_on.values(), pair.grads_off.values()) << "the gradients differ";
      if (step >= 6) {  // recorded at step 1 (the batch buffer's second use), replayed
        launches_off += after_off.launches - before_off.launches;
        launches_on += after_on.launches - before_on.launches;
        graphs_on += after_on.graph_launches - before_on.graph_launches;
        EXPECT_EQ(after_off.graph_launches, before_off.graph_launches);
      }
    }
    EXPECT_EQ(graphs_on, 2 * (2 * pair.config.layers + 1))
        << "a graph per layer and direction, and the heads', per step";

    // Evaluation (forward only, no dropout, a model without gradients): its layers' graphs too.
    EvalPair eval(pair, largest);
    const BackendCounters eval_before = pair.gpu->counters();
    for (int k = 0; k < 5; ++k) {
      std::vector<int> lengths(6);
      for (int& len : lengths) len = 13 + static_cast<int>(rng() % (kMaxSeqLen - 12));
      const auto samples =
          model_samples_masked(rng, lengths, 10, pair.m.config.real_vocab_size, 31, 45);
      const Batch batch = make_batch(samples, BatchLayout::padded, kMaxSeqLen);
      const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
      const ForwardResult want = eval.off.forward(batch, gm, gs, 0, seed, eval.fo);
      const ForwardResult got = eval.on.forward(batch, gm, gs, 0, seed, eval.fo);
      EXPECT_EQ(got.loss, want.loss) << "evaluation batch " << k;
      EXPECT_EQ(got.mlm_correct, want.mlm_correct) << "evaluation batch " << k;
    }
    // Recorded at the second batch (one batch buffer with graphs), replayed at the next three:
    // a graph per layer and the heads' at each of the four.
    EXPECT_EQ(pair.gpu->counters().graph_launches - eval_before.graph_launches,
              4 * (pair.config.layers + 1));
    EXPECT_LT(launches_on, launches_off);
    std::printf(
        "[graphs] %s: launches per step %lld op by op, %lld with segmented graphs (+%lld "
        "graph launches)\n",
        precision_name(precision), static_cast<long long>(launches_off / 2),
        static_cast<long long>(launches_on / 2), static_cast<long long>(graphs_on / 2));
    EXPECT_TRUE(pair.grads_on.guards_intact() && pair.grads_off.guards_intact() &&
                pair.params.guards_intact());
  }
}

// Unpadded batches rarely repeat a shape; laid into a capacity (GraphCapacity: rows up to a
// bucket of the bound's 1/32, the bound's sequence slots), they share one. Under the bound of 256
// rows, 80 masked tokens and 8 sequences, batches of 5 to 8 sequences, 249 to 256 tokens and 21
// to 40 masked tokens all take 256 rows, 8 slots and the bound's 80 masked slots: each layer, and
// the heads,
// are recorded at the second step and replayed from then on, and every step gives the bits of
// the same batch run op by op without the padding.
TEST(CudaModel, SegmentedGraphsReplayUnpaddedBatchesInTheirCapacity) {
  PB_REQUIRE_CUDA_DEVICE();
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    auto rng = model_rng(104);
    GraphedPair pair(rng, precision, {256, 8 * 10, 8, kMaxSeqLen});
    const uint64_t seed = rng();
    int64_t graphs = 0;
    std::vector<int64_t> rows_seen, seqs_seen;
    for (int step = 0; step < 8; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      // n sequences of 5 .. 64 tokens whose total is in [249, 256] (5 x 64 >= 256).
      const int n = 5 + static_cast<int>(rng() % 4);
      const int target = 249 + static_cast<int>(rng() % 8);
      const std::vector<int> lengths = lengths_totalling(rng, n, target);
      const auto samples =
          model_samples_masked(rng, lengths, 10, pair.m.config.real_vocab_size, 21, 40);
      const Batch batch = make_batch(samples, BatchLayout::unpadded, kMaxSeqLen);
      rows_seen.push_back(batch.rows);
      seqs_seen.push_back(batch.num_seqs());
      const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
      const auto s = static_cast<uint32_t>(2000 + 3 * step);
      auto run = [&](Bert& bert, DevBuf<float>& grads) {
        pair.gpu->zero(grads.tensor());
        const ForwardResult r = bert.forward(batch, gm, gs, s, seed);
        bert.backward();
        pair.gpu->synchronize();
        return r;
      };
      const ForwardResult want = run(pair.eager, pair.grads_off);
      const BackendCounters before = pair.gpu->counters();
      const ForwardResult got = run(pair.graphed, pair.grads_on);
      const int64_t replays = pair.gpu->counters().graph_launches - before.graph_launches;
      EXPECT_EQ(got.loss, want.loss);
      EXPECT_EQ(got.mlm_correct, want.mlm_correct);
      EXPECT_EQ(got.nsp_correct, want.nsp_correct);
      EXPECT_EQ(got.sequences, want.sequences);
      EXPECT_EQ(pair.grads_on.values(), pair.grads_off.values()) << "the gradients differ";
      // Step 0 runs the ops; from step 1 on (recorded, then replayed) every layer launches in
      // both directions, and the heads once.
      EXPECT_EQ(replays, step < 1 ? 0 : 2 * pair.config.layers + 1);
      graphs += replays;
    }
    EXPECT_EQ(graphs, 7 * (2 * pair.config.layers + 1));
    // The batches did differ in shape: without the capacity they would not have replayed.
    EXPECT_GT(std::set<int64_t>(rows_seen.begin(), rows_seen.end()).size(), 1u);
    EXPECT_TRUE(pair.grads_on.guards_intact() && pair.grads_off.guards_intact() &&
                pair.params.guards_intact());
  }
}

// BertOptions::cuda_graphs = full: a micro-step's whole forward (embeddings, layers, both heads
// and their gradients) and its whole backward are one graph each, recorded at the capacity's
// second use and replayed from then on. Unpadded batches of 8 sequences, 249 to 256 tokens and
// 49 to 64 masked tokens share one capacity (256 rows, 8 slots, 64 masked slots); the global
// counts, and in fp16 the loss scale, change every step, which the heads read from device
// memory. Every step gives the bits of the same batch run op by op without any padding, in fp32,
// bf16 and fp16; from the second step a step is two graph launches, from the third not one kernel
// launch; evaluation's forwards replay a graph of their own. (In fp16 the MLM decoder's range
// scaling is the power of two of its factor, a key of the graph: there the factor changes within
// one.)
TEST(CudaModel, FullGraphsGiveTheOpsBitsInTwoLaunches) {
  PB_REQUIRE_CUDA_DEVICE();
  for (Precision precision : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(precision_name(precision));
    auto rng = model_rng(105);
    const BatchShape largest{256, 64, 8, kMaxSeqLen};
    GraphedPair pair(rng, precision, largest, CudaGraphs::full);
    const uint64_t seed = rng();
    std::set<int64_t> rows_seen, masked_seen;
    // 8 sequences of 5 .. 64 tokens totalling 249 .. 256, with 49 .. 64 masked tokens (drawn
    // again until they are).
    auto draw = [&] {
      const int target = 249 + static_cast<int>(rng() % 8);
      const std::vector<int> lengths = lengths_totalling(rng, 8, target);
      return model_samples_masked(rng, lengths, 12, pair.m.config.real_vocab_size, 49, 64);
    };
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const auto samples = draw();
      const Batch batch = make_batch(samples, BatchLayout::unpadded, kMaxSeqLen);
      rows_seen.insert(batch.rows);
      masked_seen.insert(batch.num_masked());
      // Counts of a global batch larger than this micro-batch, different every step (fp16: with
      // 2^12 / gm in [2^5, 2^6)).
      const bool fp16 = precision == Precision::fp16;
      const int64_t gm = fp16 ? 65 + 7 * step : masked_count(samples) + 7 * step;
      const int64_t gs = static_cast<int64_t>(samples.size()) + step;
      ForwardOptions fo;
      if (fp16) fo.loss_scale = 4096.f;
      const auto s = static_cast<uint32_t>(3000 + 5 * step);
      BackendCounters before{}, after{};
      auto run = [&](Bert& bert, DevBuf<float>& grads) {
        pair.gpu->zero(grads.tensor());
        pair.gpu->synchronize();
        before = pair.gpu->counters();
        const ForwardResult r = bert.forward(batch, gm, gs, s, seed, fo);
        bert.backward();
        pair.gpu->synchronize();
        after = pair.gpu->counters();
        return r;
      };
      const ForwardResult want = run(pair.eager, pair.grads_off);
      const ForwardResult got = run(pair.graphed, pair.grads_on);
      EXPECT_EQ(got.loss, want.loss);
      EXPECT_EQ(got.mlm_loss_sum, want.mlm_loss_sum);
      EXPECT_EQ(got.nsp_loss_sum, want.nsp_loss_sum);
      EXPECT_EQ(got.mlm_correct, want.mlm_correct);
      EXPECT_EQ(got.nsp_correct, want.nsp_correct);
      EXPECT_EQ(got.masked_tokens, want.masked_tokens);
      EXPECT_EQ(got.sequences, want.sequences);
      EXPECT_EQ(pair.grads_on.values(), pair.grads_off.values()) << "the gradients differ";
      // Step 0 runs the ops, step 1 records (a recorded op counts as a launch) and replays, and
      // every step from the third is its two graphs and nothing else (the synchronize is a host
      // synchronisation, not a launch).
      if (step >= 1) {
        EXPECT_EQ(after.graph_launches - before.graph_launches, 2);
      }
      if (step >= 2) {
        EXPECT_EQ(after.launches - before.launches, 0);
      }
    }
    // The batches did differ in shape: without the capacity they would not have replayed.
    EXPECT_GT(rows_seen.size(), 1u);
    EXPECT_GT(masked_seen.size(), 1u);

    // Evaluation (forward only, no dropout, a model without gradients): one graph per forward
    // from its second.
    EvalPair eval(pair, largest);
    for (int k = 0; k < 4; ++k) {
      const auto samples = draw();
      const Batch batch = make_batch(samples, BatchLayout::unpadded, kMaxSeqLen);
      const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
      const ForwardResult want = eval.off.forward(batch, gm, gs, 0, seed, eval.fo);
      const BackendCounters before = pair.gpu->counters();
      const ForwardResult got = eval.on.forward(batch, gm, gs, 0, seed, eval.fo);
      const BackendCounters after = pair.gpu->counters();
      EXPECT_EQ(got.loss, want.loss) << "evaluation batch " << k;
      EXPECT_EQ(got.mlm_correct, want.mlm_correct) << "evaluation batch " << k;
      EXPECT_EQ(got.nsp_correct, want.nsp_correct) << "evaluation batch " << k;
      EXPECT_EQ(after.graph_launches - before.graph_launches, k < 1 ? 0 : 1)
          << "evaluation batch " << k;
    }
    EXPECT_TRUE(pair.grads_on.guards_intact() && pair.grads_off.guards_intact() &&
                pair.params.guards_intact());
  }
}

// The table of graphs is bounded (32 shapes' worth: 128 entries of a layer's weight for the
// tiny model's 2 layers); shapes seen once must not keep a recurring one from being recorded:
// after 70 one-off shapes (forward only, one sequence of 44 tokens under 70 different attention
// bounds, the max_seq_len of its make_batch: 210 weight in segmented, 140 in full), a batch that
// comes 5 times is recorded at its second forward and replayed at the next three, with the
// ops' losses: segmented, a graph per layer and the heads'; full, one per forward (a whole
// micro-step's graph counts as all layers).
TEST(CudaModel, GraphsOutliveOneOffShapes) {
  PB_REQUIRE_CUDA_DEVICE();
  for (CudaGraphs mode : {CudaGraphs::segmented, CudaGraphs::full}) {
    SCOPED_TRACE(cuda_graphs_name(mode));
    auto rng = model_rng(103);
    CudaBackendOptions bo;
    bo.validate_indices = false;
    auto gpu = make_cuda_backend(0, bo);
    const BertConfig config = bert_preset("tiny");
    HostModel m(config, rng());
    DevBuf<float> params({m.table.total()}, m.params);
    BertOptions off, on;
    on.cuda_graphs = mode;
    Bert eager(m.config, *gpu, params.tensor(), Tensor(), off);
    Bert graphed(m.config, *gpu, params.tensor(), Tensor(), on);
    const BatchShape largest{kMaxSeqLen, 10, 1, kMaxSeqLen};
    eager.grow_for(largest, false);
    graphed.grow_for(largest, false);
    ForwardOptions fo;
    fo.gradients = false;
    fo.dropout = false;
    auto forward = [&](const std::vector<Sample>& samples, int max_seq_len) {
      const Batch batch = make_batch(samples, BatchLayout::unpadded, max_seq_len);
      const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
      const ForwardResult want = eager.forward(batch, gm, gs, 0, 1, fo);
      const ForwardResult got = graphed.forward(batch, gm, gs, 0, 1, fo);
      EXPECT_EQ(got.loss, want.loss) << batch.rows << " rows";
    };
    for (int bound = kMaxSeqLen + 1; bound <= kMaxSeqLen + 70; ++bound)
      forward(model_samples(rng, {44}, 10, m.config.real_vocab_size), bound);
    const auto recurring = model_samples(rng, {50}, 10, m.config.real_vocab_size);
    const BackendCounters before = gpu->counters();
    for (int k = 0; k < 5; ++k) forward(recurring, kMaxSeqLen);
    EXPECT_EQ(gpu->counters().graph_launches - before.graph_launches,
              mode == CudaGraphs::full ? 4 : 4 * (config.layers + 1));
  }
}
// A forward whose logits go to the host (ForwardOptions::mlm_logits / nsp_logits, evaluation's
// hooks) runs its heads op by op, graphs or not: its hooks see the batch's own masked tokens
// and sequences, none of the padded slots a graphed forward before it made the capacity hold,
// with the logits of the ops run one by one, bit for bit; and the graphed forwards after it
// still replay their graphs.
TEST(CudaModel, LogitsHooksSeeOnlyTheBatchsTokensWithGraphs) {
  PB_REQUIRE_CUDA_DEVICE();
  for (CudaGraphs mode : {CudaGraphs::segmented, CudaGraphs::full}) {
    SCOPED_TRACE(cuda_graphs_name(mode));
    auto rng = model_rng(107);
    const BatchShape largest{kMaxSeqLen * 6, 64, 6, kMaxSeqLen};
    GraphedPair pair(rng, Precision::fp32, largest, mode);
    EvalPair eval(pair, largest);
    const int64_t vocab = pair.m.config.real_vocab_size;
    auto lengths = [&] {
      std::vector<int> out(6);
      for (int& len : out) len = 13 + static_cast<int>(rng() % (kMaxSeqLen - 12));
      return out;
    };
    struct Seen {
      std::vector<float> mlm, nsp;
      int64_t rows = 0, seqs = 0;
    };
    auto hooked = [&](Bert& model, const Batch& batch, int64_t gm, int64_t gs) {
      Seen seen;
      ForwardOptions fo = eval.fo;
      fo.mlm_logits = [&](int64_t first, const std::vector<float>& z, int64_t n) {
        EXPECT_EQ(first, seen.rows);
        seen.rows += n;
        seen.mlm.insert(seen.mlm.end(), z.begin(), z.end());
      };
      fo.nsp_logits = [&](const std::vector<float>& z, int64_t s) {
        seen.seqs += s;
        seen.nsp.insert(seen.nsp.end(), z.begin(), z.end());
      };
      const ForwardResult r = model.forward(batch, gm, gs, 0, 1, fo);
      EXPECT_EQ(r.masked_tokens, batch.num_masked());
      return seen;
    };
    // Graphed forwards of 49 .. 64 masked tokens first: a masked capacity of 64 slots.
    for (int k = 0; k < 3; ++k) {
      const auto samples = model_samples_masked(rng, lengths(), 12, vocab, 49, 64);
      const Batch batch = make_batch(samples, BatchLayout::padded, kMaxSeqLen);
      const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
      EXPECT_EQ(eval.on.forward(batch, gm, gs, 0, 1, eval.fo).loss,
                eval.off.forward(batch, gm, gs, 0, 1, eval.fo).loss);
    }
    // Then hooked forwards of fewer.
    for (int k = 0; k < 2; ++k) {
      const auto samples = model_samples_masked(rng, lengths(), 12, vocab, 17, 40);
      const Batch batch = make_batch(samples, BatchLayout::padded, kMaxSeqLen);
      const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
      const Seen want = hooked(eval.off, batch, gm, gs);
      const Seen got = hooked(eval.on, batch, gm, gs);
      EXPECT_EQ(got.rows, batch.num_masked()) << "hooked forward " << k;
      EXPECT_EQ(got.seqs, batch.num_seqs()) << "hooked forward " << k;
      EXPECT_EQ(got.mlm, want.mlm) << "hooked forward " << k;
      EXPECT_EQ(got.nsp, want.nsp) << "hooked forward " << k;
    }
    // The graphs recorded before the hooked forwards replay after them.
    const auto samples = model_samples_masked(rng, lengths(), 12, vocab, 49, 64);
    const Batch batch = make_batch(samples, BatchLayout::padded, kMaxSeqLen);
    const int64_t gm = masked_count(samples), gs = static_cast<int64_t>(samples.size());
    const BackendCounters before = pair.gpu->counters();
    const ForwardResult got = eval.on.forward(batch, gm, gs, 0, 1, eval.fo);
    const BackendCounters after = pair.gpu->counters();
    EXPECT_EQ(got.loss, eval.off.forward(batch, gm, gs, 0, 1, eval.fo).loss);
    EXPECT_EQ(after.graph_launches - before.graph_launches,
              mode == CudaGraphs::full ? 1 : pair.config.layers + 1);
  }
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaModel, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
