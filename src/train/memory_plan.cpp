#include "train/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

#include "train/train_options.h"
#include "kernels/base/error.h"
#include "kernels/backend.h"
#include "kernels/device.h"
#include "model/bert.h"
#include "model/params.h"
#include "optim/distributed_lamb.h"
#include "optim/lamb.h"

namespace packbert {

namespace {

constexpr double kMiB = 1 << 20;

// Estimates of what the device keeps besides our buffers (MemoryItem::exact = false).
// A CUDA 12 context with lazy module loading, cuBLASLt's handle and our kernels: a few hundred
// MiB on A100 / H100; 512 MiB is taken as the estimate.
constexpr size_t kCudaContextBytes = size_t{512} << 20;
// NCCL's buffers on an 8-GPU NVLink node: NCCL_BUFFSIZE (4 MiB by default) per channel and peer
// for each protocol, over up to 32 channels; 512 MiB is taken as the estimate.
constexpr size_t kNcclBytes = size_t{512} << 20;

size_t mib_to_bytes(double mib) { return static_cast<size_t>(mib * kMiB); }

struct RankItems {
  std::vector<MemoryItem> items;
  size_t buffers = 0, estimated = 0;
  BertMemory model;
  size_t total() const { return buffers + estimated; }
};

// Every item of rank `rank` with the micro-batch bound `shape`.
RankItems rank_items(const TrainConfig& c, int ranks, int rank, const BatchShape& shape) {
  const BertConfig model = model_config(c);
  TrainerOptions o = trainer_options(c, model, ranks);
  const ParamTable table(model);
  const int64_t n = table.total();
  const bool cuda = o.device == Device::cuda;
  const bool graphs = cuda && o.bert.cuda_graphs != CudaGraphs::off;
  RankItems r;
  r.model = plan_bert_memory(model, o.bert, graphs, ranks,
                             BertReserve{shape, o.layout, o.deferred_forwards});
  auto add = [&](const std::string& key, const std::string& label, size_t bytes, bool exact,
                 const std::string& note = {}) {
    if (bytes == 0) return;
    r.items.push_back({key, label, bytes, exact, note, 0});
    (exact ? r.buffers : r.estimated) += bytes;
  };
  const auto f32n = static_cast<size_t>(std::max<int64_t>(4 * n, 1));
  const bool mixed = o.bert.precision != Precision::fp32;
  const bool sharded = o.sharded && ranks > 1;
  const std::vector<int64_t> bounds = DistributedLamb::shard_bounds(n, ranks);
  const int64_t begin = sharded ? bounds[static_cast<size_t>(rank)] : 0;
  const int64_t end = sharded ? bounds[static_cast<size_t>(rank) + 1] : n;
  // Sharded bf16 / fp16 keeps the rank's range of the masters (model/replica.h shard_masters).
  if (sharded && (o.bert.precision == Precision::bf16 || o.bert.precision == Precision::fp16)) {
    add("fp32_master_weights",
        fmt::format("parameters: fp32 master weights, this rank's 1/{}", ranks),
        static_cast<size_t>(std::max<int64_t>(4 * (end - begin), 1)), true);
    add("fp32_read_weights", "parameters: fp32 biases and LayerNorm the ops read",
        static_cast<size_t>(std::max<int64_t>(4 * fp32_read_elems(table), 1)), true);
  } else {
    add("fp32_master_weights",
        mixed ? "parameters: fp32 master weights" : "parameters (fp32, the master weights)", f32n,
        true);
  }
  add("lowp_weights", "parameters: 16-bit copy", r.model.lowp_weights, true);
  add("fp8_state", "parameters: FP8 copies and scaling state", r.model.fp8_state, true);
  add("gradients", "gradients (fp32)", f32n, true);

  // LAMB: this rank's share of the moments (optim.sharded), as the run reports it
  // (optimizer_state_bytes without the master weights, which are counted above).
  OptimizerLayout lamb;
  lamb.num_elems = n;
  lamb.table = lamb_params(table);
  const size_t moments = 2 * static_cast<size_t>(std::max<int64_t>(4 * (end - begin), 1));
  add("optimizer_moments",
      sharded ? fmt::format("optimizer: LAMB moments, this rank's 1/{}", ranks)
              : std::string("optimizer: LAMB moments"),
      moments, true);
  add("optimizer_scalars", "optimizer: LAMB norms, sums, scalars",
      optimizer_state_bytes(lamb, bounds, o.sharded, rank) - moments, true);
  // The update's graph reads its rate and scales from the device (LambOptions::graph).
  if (graphs && o.bert.cuda_graphs == CudaGraphs::full &&
      (!sharded || o.gpu_transport == GradTransport::nccl))
    add("optimizer_graph_scalars", "optimizer: the update graph's scalars", 16, true);

  add("activation_arena", "activations: the arena", r.model.arena, true,
      fmt::format("{} rows, {} sequences, {} masked; M = {}", r.model.laid.rows, r.model.laid.seqs,
                  r.model.laid.masked, r.model.mst_chunks));
  for (int k = 0; k < kActivationKinds; ++k) {
    const size_t b = r.model.arena_by_kind[static_cast<size_t>(k)];
    if (b == 0) continue;
    const auto kind = static_cast<ActivationKind>(k);
    std::string label = activation_kind_name(kind);
    if (kind == ActivationKind::mlm_logits) label += " (the MLM logits chunk)";
    r.items.push_back({std::string("arena_") + activation_kind_name(kind), label, b, true, {}, 1});
  }
  if (r.model.arena > 0) {
    size_t carved = 0;
    for (size_t b : r.model.arena_by_kind) carved += b;
    if (r.model.arena > carved)
      r.items.push_back({"arena_auto_margin",
                         "smaller batches at a smaller M (mst_chunks = 0)",
                         r.model.arena - carved,
                         true,
                         {},
                         1});
  }
  add("batch_buffers", "batch buffers (two, used in turn)", r.model.batch_buffers, true);
  add("fp8_workspace", "FP8 operand workspace", r.model.fp8_workspace, true);
  add("metric_slots", "loss sums per forward", r.model.metric_slots, true);
  r.items.push_back({"evaluation",
                     "evaluation forward: within the arena (batches split to fit)",
                     0,
                     true,
                     {},
                     0});

  if (cuda) {
    add("gemm_workspace", "backend: cuBLASLt workspace", kCudaGemmWorkspaceBytes, false,
        "kCudaGemmWorkspaceBytes");
    // The ops' grow-only scratch (a quarter of headroom each): an fp32 [rows, max(3H, I)]
    // product that a bias or GELU epilogue finishes, and the MLM decoder's dx and gradient block
    // [chunk, H] f32 + [chunk, V] 16-bit.
    const BatchShape& s = r.model.laid;
    const int64_t wide = std::max(3 * model.hidden, model.intermediate);
    const int64_t mlm_rows = o.bert.mlm_chunk_rows > 0
                                 ? std::min(o.bert.mlm_chunk_rows, s.masked)
                                 : (s.masked + r.model.mst_chunks - 1) / r.model.mst_chunks;
    const auto scratch = static_cast<size_t>(
        1.25 * static_cast<double>(4 * s.rows * wide + 4 * mlm_rows * model.hidden +
                                   2 * mlm_rows * model.vocab_size) +
        (size_t{1} << 20));
    add("op_scratch", "backend: op scratch (estimate)", scratch, false,
        "1.25 x (4 rows max(3H, I) + mlm chunk (4H + 2V)) + 1 MiB");
    add("cuda_context", "device: CUDA context, cuBLASLt, kernels (estimate)", kCudaContextBytes,
        false, "512 MiB, typical of a CUDA 12 context with lazy loading");
    if (ranks > 1 && o.gpu_transport == GradTransport::nccl)
      add("nccl", "device: NCCL buffers (estimate)", kNcclBytes, false,
          "NCCL_BUFFSIZE 4 MiB per channel, peer and protocol");
  }
  return r;
}

int largest_rank(const TrainConfig& c, int ranks, const BatchShape& shape) {
  if (!c.optim.sharded || ranks <= 1) return 0;
  int best = 0;
  size_t most = 0;
  for (int r = 0; r < ranks; ++r) {
    const size_t t = rank_items(c, ranks, r, shape).total();
    if (t > most) most = t, best = r;
  }
  return best;
}

size_t total_for(const TrainConfig& c, int ranks) {
  const BatchShape shape = largest_micro_batch(c, ranks);
  return rank_items(c, ranks, largest_rank(c, ranks, shape), shape).total();
}

}  // namespace

const std::vector<DeviceMemory>& known_gpus() {
  static const std::vector<DeviceMemory> gpus = {
      {"a100-40", mib_to_bytes(40960), "A100 40GB: 40960 MiB (NVML's total)"},
      {"a100-80", mib_to_bytes(81920), "A100 80GB: 81920 MiB (NVML's total)"},
      {"h100-80", mib_to_bytes(81559), "H100 80GB HBM3: 81559 MiB (NVML's total)"},
      {"h200-141", mib_to_bytes(143771), "H200 141GB: 143771 MiB (NVML's total)"},
      {"b200-180", size_t{180} * 1000 * 1000 * 1000, "B200: 180 GB, the product's figure"},
  };
  return gpus;
}

DeviceMemory parse_device_memory(const std::string& text) {
  for (const DeviceMemory& g : known_gpus())
    if (g.name == text) return g;
  std::string names;
  for (const DeviceMemory& g : known_gpus()) names += (names.empty() ? "" : ", ") + g.name;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit = end ? std::string(end) : std::string();
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  if (unit == "kib") scale = 1024.0;
  if (unit == "mib") scale = kMiB;
  if (unit == "gib") scale = kMiB * 1024;
  if (unit == "gb") scale = 1e9;
  if (unit == "mb") scale = 1e6;
  PB_REQUIRE(end != text.c_str() && scale > 0 && v > 0,
             "--gpu {}: expected one of {}, or a size (bytes, or with MiB / GiB / MB / GB)", text,
             names);
  return {text, static_cast<size_t>(v * scale), "given"};
}

DeviceMemory this_machine_memory(Device device) {
  DeviceMemory d;
  if (device == Device::cuda) {
    size_t free = 0, total = 0;
    if (cuda_device_memory(0, free, total)) {
      d.name = "cuda:0";
      d.bytes = total;
      d.source = "cudaMemGetInfo's total";
    }
    return d;
  }
  d.name = "this machine's available RAM";
  d.bytes = make_cpu_backend()->memory_info().free;
  d.source = "/proc/meminfo MemAvailable";
  return d;
}

MemoryPlan plan_memory(const TrainConfig& c, int ranks, const std::vector<DeviceMemory>& targets,
                       bool knobs, int rank) {
  PB_REQUIRE(ranks >= 1, "plan: --ranks {} must be >= 1", ranks);
  MemoryPlan p;
  p.ranks = ranks;
  p.device = c.train.device;
  const BatchShape shape = largest_micro_batch(c, ranks);
  p.rank = rank >= 0 ? rank : largest_rank(c, ranks, shape);
  PB_REQUIRE(p.rank < ranks, "plan: rank {} of {}", p.rank, ranks);
  const RankItems r = rank_items(c, ranks, p.rank, shape);
  p.items = r.items;
  p.buffers = r.buffers;
  p.estimated = r.estimated;
  p.micro_batch = r.model.laid;
  p.mst_chunks = r.model.mst_chunks;
  p.bound_strict = micro_batch_bound_strict(c, ranks);
  // Samples of max_seq_len per micro-batch: the largest that fits (bisection; the total grows
  // with the micro-batch).
  const int64_t len = c.train.max_seq_len;
  auto total_at = [&](int64_t samples) {
    BatchShape s;
    s.seqs = samples;
    s.rows = samples * len;
    s.masked = samples * c.train.max_predictions_per_seq;
    s.max_len = static_cast<int32_t>(len);
    return rank_items(c, ranks, p.rank, s).total();
  };
  for (const DeviceMemory& target : targets) {
    if (target.bytes == 0) continue;
    MemoryVerdict v;
    v.target = target;
    v.fits = p.total() <= target.bytes;
    v.spare = static_cast<int64_t>(target.bytes) - static_cast<int64_t>(p.total());
    int64_t lo = 0, hi = 1;
    while (hi < (int64_t{1} << 24) && total_at(hi) <= target.bytes) lo = hi, hi *= 2;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (total_at(mid) <= target.bytes ? lo : hi) = mid;
    }
    v.largest_samples = lo;
    p.verdicts.push_back(v);
  }
  if (knobs) {
    auto knob = [&](const std::string& key, const std::string& setting, TrainConfig v) {
      MemoryKnob k;
      k.key = key;
      k.setting = setting;
      k.total = total_for(v, ranks);
      k.saves = static_cast<int64_t>(p.total()) - static_cast<int64_t>(k.total);
      for (const MemoryVerdict& d : p.verdicts) k.fits.push_back(k.total <= d.target.bytes);
      p.knobs.push_back(k);
    };
    for (int64_t m : {2, 4, 8})
      if (c.model.mst_chunks != 0 && m > c.model.mst_chunks) {
        TrainConfig v = c;
        v.model.mst_chunks = m;
        knob("model.mst_chunks", std::to_string(m), v);
      }
    for (Recompute rc : {Recompute::mlp, Recompute::layer})
      if (rc != c.model.recompute) {
        TrainConfig v = c;
        v.model.recompute = rc;
        knob("model.recompute", recompute_name(rc), v);
      }
    if (ranks > 1) {
      TrainConfig v = c;
      v.optim.sharded = !c.optim.sharded;
      knob("optim.sharded", v.optim.sharded ? "true" : "false", v);
    }
    const int accum = c.train.gradient_accumulation_steps * 2;
    if (c.train.global_batch_size >= int64_t{accum} * ranks) {
      TrainConfig v = c;
      v.train.gradient_accumulation_steps = accum;
      knob("train.gradient_accumulation_steps", std::to_string(accum), v);
    }
    for (Precision pr : {Precision::fp32, Precision::bf16, Precision::fp8})
      if (pr != c.train.precision && (pr != Precision::fp8 || c.train.device == Device::cuda)) {
        TrainConfig v = c;
        v.train.precision = pr;
        knob("train.precision", precision_name(pr), v);
      }
  }
  return p;
}

std::string format_memory_plan(const MemoryPlan& p) {
  std::string s;
  s += fmt::format("rank {} of {} (the rank that holds most), {}\n", p.rank, p.ranks,
                   device_name(p.device));
  s += fmt::format("micro-batch bound: {} rows, {} sequences, {} masked tokens (M = {}){}\n",
                   p.micro_batch.rows, p.micro_batch.seqs, p.micro_batch.masked, p.mst_chunks,
                   p.bound_strict ? ""
                                  : "; under lpt balance a micro-batch of more, shorter samples "
                                    "may exceed it (the arena then grows)");
  s += fmt::format("\n{:<62} {:>10} {:>13}\n", "item", "MiB", "bytes");
  for (const MemoryItem& it : p.items) {
    if (it.bytes == 0 && it.depth == 0) {
      s += fmt::format("{:<62} {:>10} {:>13}\n", it.label, "-", "-");
      continue;
    }
    const std::string label = (it.depth ? "    " : "") + it.label;
    s += fmt::format("{:<62} {:>10.1f} {:>13}\n", label, it.bytes / kMiB, it.bytes);
  }
  s += fmt::format("{:<62} {:>10.1f} {:>13}\n", "buffers (exact: train's device_allocated_bytes)",
                   p.buffers / kMiB, p.buffers);
  if (p.estimated > 0)
    s += fmt::format("{:<62} {:>10.1f} {:>13}\n", "backend and device (estimates)",
                     p.estimated / kMiB, p.estimated);
  s += fmt::format("{:<62} {:>10.1f} {:>13}\n", "total", p.total() / kMiB, p.total());
  for (const MemoryItem& it : p.items)
    if (!it.exact && !it.note.empty()) s += fmt::format("  {}: {}\n", it.label, it.note);
  if (p.verdicts.empty()) return s;
  s += fmt::format("\n{:<34} {:>10}  {:<8} {:>12}  {}\n", "device", "MiB", "verdict", "spare MiB",
                   "largest micro-batch that fits (samples x tokens)");
  for (const MemoryVerdict& v : p.verdicts)
    s += fmt::format("{:<34} {:>10.1f}  {:<8} {:>12.1f}  {} x {}\n", v.target.name,
                     v.target.bytes / kMiB, v.fits ? "fits" : "SHORT",
                     static_cast<double>(v.spare) / kMiB, v.largest_samples, p.micro_batch.max_len);
  if (!p.knobs.empty()) {
    s += fmt::format("\n{:<40} {:>10} {:>10}  {}\n", "knob", "total MiB", "saves MiB", "fits on");
    for (const MemoryKnob& k : p.knobs) {
      std::string on;
      for (size_t i = 0; i < k.fits.size(); ++i)
        if (k.fits[i]) on += (on.empty() ? "" : ", ") + p.verdicts[i].target.name;
      s +=
          fmt::format("{:<40} {:>10.1f} {:>10.1f}  {}\n", k.key + " = " + k.setting, k.total / kMiB,
                      static_cast<double>(k.saves) / kMiB, on.empty() ? "none" : on);
    }
  }
  return s;
}

nlohmann::json memory_plan_json(const MemoryPlan& p) {
  nlohmann::json j;
  j["ranks"] = p.ranks;
  j["rank"] = p.rank;
  j["device"] = device_name(p.device);
  j["micro_batch"] = {{"rows", p.micro_batch.rows},
                      {"seqs", p.micro_batch.seqs},
                      {"masked", p.micro_batch.masked},
                      {"mst_chunks", p.mst_chunks},
                      {"bound_strict", p.bound_strict}};
  nlohmann::json items = nlohmann::json::array();
  for (const MemoryItem& it : p.items) {
    nlohmann::json i = {
        {"key", it.key}, {"label", it.label}, {"bytes", it.bytes}, {"exact", it.exact}};
    if (it.depth) i["part_of"] = "activation_arena";
    if (!it.note.empty()) i["note"] = it.note;
    items.push_back(i);
  }
  j["items"] = items;
  j["buffers_bytes"] = p.buffers;
  j["estimated_bytes"] = p.estimated;
  j["total_bytes"] = p.total();
  nlohmann::json verdicts = nlohmann::json::array();
  for (const MemoryVerdict& v : p.verdicts)
    verdicts.push_back({{"name", v.target.name},
                        {"bytes", v.target.bytes},
                        {"source", v.target.source},
                        {"fits", v.fits},
                        {"spare_bytes", v.spare},
                        {"largest_micro_batch",
                         {{"samples", v.largest_samples},
                          {"tokens", v.largest_samples * p.micro_batch.max_len}}}});
  j["targets"] = verdicts;
  nlohmann::json knobs = nlohmann::json::array();
  for (const MemoryKnob& k : p.knobs)
    knobs.push_back({{"key", k.key},
                     {"setting", k.setting},
                     {"total_bytes", k.total},
                     {"saves_bytes", k.saves},
                     {"fits", k.fits}});
  j["knobs"] = knobs;
  return j;
}

}  // namespace packbert
