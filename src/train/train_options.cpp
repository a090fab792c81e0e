#include "train/train_options.h"

#include <limits>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "data/prepare/corpus_tokenizer.h"
#include "kernels/device.h"
#include "train/model_flops.h"
#include "data/packing/planner.h"

namespace packbert {

LambOptions lamb_options(const TrainConfig& c) {
  LambOptions o;
  o.beta1 = static_cast<float>(c.optim.beta1);
  o.beta2 = static_cast<float>(c.optim.beta2);
  o.eps = static_cast<float>(c.optim.epsilon);
  o.weight_decay = static_cast<float>(c.optim.weight_decay);
  // 0: no clipping, an infinite threshold (max(1, norm / inf) = 1).
  o.max_grad_norm = c.optim.max_grad_norm > 0 ? static_cast<float>(c.optim.max_grad_norm)
                                              : std::numeric_limits<float>::infinity();
  o.rule = c.optim.name;
  o.decouple_lr = c.optim.decouple_lr;
  // A non-finite gradient skips the update, whatever train.max_nonfinite_steps says: the run
  // counts such steps and decides by that key (run_train.cpp, SkippedSteps), 0 included (the
  // first one is an error naming the step). A throw here instead would bypass the count and, on
  // the GPU, fire only on the steps that read the norm back.
  o.check_finite = true;
  o.skip_nonfinite = true;
  return o;
}

LoaderOptions loader_options(const TrainConfig& c) {
  LoaderOptions o;
  o.global_batch_size = c.train.global_batch_size;
  o.micro_steps = c.train.gradient_accumulation_steps;
  o.max_seq_len = c.train.max_seq_len;
  o.max_seqs_per_pack = c.train.max_seqs_per_pack;
  o.seed = c.train.seed;
  o.prefetch_steps = c.data.prefetch_steps;
  o.shuffle_block_rows = c.data.shuffle_block_rows;
  o.shuffle_window_blocks = c.data.shuffle_window_blocks;
  o.read_ahead_windows = c.data.read_ahead_windows;
  o.last_step = c.train.last_step;
  o.rules.max_seq_len = c.train.max_seq_len;
  o.rules.vocab_size = model_config(c).real_vocab_size;
  return o;
}

uint64_t derive_seed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {

// The rank's index on its node, from the launcher's environment (OpenMPI, MPICH / Intel MPI,
// Slurm); 0 when none says.
int local_rank_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name)) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0) return static_cast<int>(r);
    }
  return 0;
}

}  // namespace

namespace {
MicroBatchBound bound_of(const TrainConfig& c, int world) {
  const LoaderOptions lo = loader_options(c);
  PlannerConfig p;
  p.num_ranks = world;
  p.micro_steps = c.train.gradient_accumulation_steps;
  p.packing.max_seq_len = c.train.max_seq_len;
  p.cost = lo.cost;
  p.method = lo.balance;
  return micro_batch_bound(p, c.train.global_batch_size);
}
}  // namespace

bool micro_batch_bound_strict(const TrainConfig& c, int world) {
  return bound_of(c, world).samples_bounded;
}

BatchShape largest_micro_batch(const TrainConfig& c, int world) {
  const MicroBatchBound b = bound_of(c, world);
  const int64_t len = c.train.max_seq_len;
  BatchShape s;
  s.seqs = b.samples;
  // Packed rows: a pack holds one sample or more; padded: one each.
  s.rows = c.train.layout == BatchLayout::unpadded ? b.tokens : b.samples * len;
  s.masked = std::min(std::min(b.tokens, s.rows), b.samples * c.train.max_predictions_per_seq);
  s.max_len = c.train.max_seq_len;
  return s;
}

TrainerOptions trainer_options(const TrainConfig& c, const BertConfig& model, int world) {
  TrainerOptions o;
  o.config = model;
  o.bert.mlm_chunk_rows = c.model.mlm_chunk_rows;
  o.bert.mst_chunks = c.model.mst_chunks;
  o.bert.activation_budget_bytes = static_cast<size_t>(c.model.activation_budget_mb) << 20;
  o.bert.recompute = c.model.recompute;
  o.layout = c.train.layout;
  o.max_seq_len = c.train.max_seq_len;
  o.init_seed = derive_seed(c.train.seed, 1);
  o.dropout_seed = derive_seed(c.train.seed, 2);
  o.dropout = c.train.dropout;
  o.lr = lr_schedule_config(c);
  o.lamb = lamb_options(c);  // skips a non-finite update; SkippedSteps counts it
  o.sharded = c.optim.sharded;
  o.bert.precision = c.train.precision;
  o.bert.fp8.history = c.train.fp8_history;
  o.bert.fp8.margin = c.train.fp8_margin;
  o.bert.cuda_graphs = c.train.cuda_graphs;
  o.loss_scaler.init_scale = static_cast<float>(c.train.loss_scale_init);
  o.loss_scaler.growth_interval = c.train.loss_scale_growth_interval;
  o.device = c.train.device;
  o.reserve = largest_micro_batch(c, world);
  o.deferred_forwards = int64_t{c.train.gradient_accumulation_steps} * c.log.every_steps;
  o.gpu_transport =
      c.train.gpu_allreduce == GpuAllreduce::host ? GradTransport::mpi : GradTransport::nccl;
  // One GPU per rank: a launcher that shows each rank only its own GPU (scripts/
  // run_mlperf_8gpu.sh) leaves one device; a plain mpirun on a node shows them all, and local
  // rank r takes GPU r (mod the count).
  if (o.device == Device::cuda) {
    const int gpus = cuda_device_count();
    o.cuda_device = gpus > 1 ? local_rank_from_env() % gpus : 0;
  }
  return o;
}

double device_peak(const TrainConfig& c, int cuda_device) {
  if (c.train.device != Device::cuda) return 0.0;
  if (c.log.peak_tflops > 0) return c.log.peak_tflops * 1e12;
  // describe_devices(): a line "cuda:N NAME, sm_XY, ..." per device.
  const std::string lines = describe_devices(), tag = fmt::format("cuda:{} ", cuda_device);
  const size_t at = lines.find(tag);
  if (at == std::string::npos) return 0.0;
  const size_t begin = at + tag.size();
  const std::string name = lines.substr(begin, lines.find_first_of(",\n", begin) - begin);
  const double peak = device_peak_flops(name, c.train.precision);
  if (peak == 0.0)
    spdlog::warn("mfu: no {} peak known for \"{}\"; set log.peak_tflops to report mfu",
                 precision_name(c.train.precision), name);
  return peak;
}

std::optional<CorpusTokenizer> data_tokenizer(const TrainConfig& c) {
  if (c.data.vocab.empty()) return std::nullopt;
  return CorpusTokenizer::load(c.data.vocab);
}

std::shared_ptr<const LoaderOptions::Masking> dynamic_masking(const TrainConfig& c,
                                                              const CorpusTokenizer* tokenizer) {
  if (c.data.masking != MaskingMode::dynamic) return nullptr;
  const auto& d = c.data;
  PB_CHECK(tokenizer != nullptr, "dynamic masking without data.vocab (the config checks it)");
  auto m = std::make_shared<LoaderOptions::Masking>();
  m->rule = mask_rule(d.mlm_probability, c.train.max_predictions_per_seq, d.mask_count,
                      d.whole_word_masking, d.mask_token_share, d.random_token_share);
  PB_REQUIRE(!d.whole_word_masking || tokenizer->word_pieces(),
             "data.whole_word_masking: data.vocab {} is a {}; whole words are WordPiece's "
             "(\"##\" pieces)",
             d.vocab, tokenizer->kind());
  m->vocab = tokenizer->mask_vocab();
  return m;
}

// The sample rules of the data: the tokenizer file's size and special ids, and what shards that
// record their making must agree with (the tokenizer, the model's vocabulary, masks for static
// masking, NSP pairs for an NSP head).
SampleRules sample_rules(const TrainConfig& c, const BertConfig& model,
                         const CorpusTokenizer* tokenizer) {
  SampleRules rules;
  rules.vocab_size = model.real_vocab_size;
  rules.max_seq_len = c.train.max_seq_len;
  if (tokenizer) {
    PB_REQUIRE(tokenizer->meta().vocab_size <= model.real_vocab_size,
               "data.vocab: {} has {} tokens, more than the model's vocabulary ({}; set "
               "model.vocab_size)",
               c.data.vocab, tokenizer->meta().vocab_size, model.real_vocab_size);
    rules = tokenizer->sample_rules(c.train.max_seq_len);
  }
  rules.model_vocab_size = model.real_vocab_size;
  rules.needs_masks = c.data.masking == MaskingMode::static_masks;
  rules.needs_pairs = model.nsp_head;
  return rules;
}

}  // namespace packbert
