// The key table of TrainConfig: every key once, with its field, type, default and doc. Reading,
// equality, the TOML writer (--print-config, the effective config in the log and in
// checkpoints) and docs/configuration.md's table are derived from it.
#include <string>
#include <vector>

#include "config/config.h"
#include "config/train_config.h"
#include "config/train_config_schema.h"
#include "model/config.h"  // bert_preset_names

namespace packbert {

namespace {

using config::EnumTable;
using config::key;

// An enum's table from the name function its module already has (one list of names).
template <class E>
EnumTable<E> named(std::initializer_list<E> values, const char* (*name)(E)) {
  EnumTable<E> t;
  for (E v : values) t.push_back({v, name(v)});
  return t;
}

const EnumTable<BatchLayout>& layout_table() {
  static const auto t =
      named({BatchLayout::unpadded, BatchLayout::packed, BatchLayout::padded}, batch_layout_name);
  return t;
}
const EnumTable<LastStepPolicy>& last_step_table() {
  static const auto t =
      named({LastStepPolicy::partial, LastStepPolicy::drop}, last_step_policy_name);
  return t;
}
const EnumTable<Device>& device_table() {
  static const auto t = named({Device::cpu, Device::cuda}, device_name);
  return t;
}
const EnumTable<Precision>& precision_table() {
  static const auto t =
      named({Precision::fp32, Precision::bf16, Precision::fp16, Precision::fp8}, precision_name);
  return t;
}
const EnumTable<CudaGraphs>& cuda_graphs_table() {
  static const auto t =
      named({CudaGraphs::off, CudaGraphs::segmented, CudaGraphs::full}, cuda_graphs_name);
  return t;
}
const EnumTable<Recompute>& recompute_table() {
  static const auto t = named({Recompute::none, Recompute::mlp, Recompute::layer}, recompute_name);
  return t;
}
// Hugging Face's names are "gelu" and "gelu_new" (checkpoint_config.cpp writes those into
// config.json).
const EnumTable<Gelu>& gelu_table() {
  static const EnumTable<Gelu> t = {{Gelu::erf, "gelu"}, {Gelu::tanh, "gelu_tanh"}};
  return t;
}
const EnumTable<LrScheduleKind>& schedule_table() {
  static const auto t = named(
      {LrScheduleKind::poly, LrScheduleKind::linear, LrScheduleKind::cosine, LrScheduleKind::wsd},
      lr_schedule_kind_name);
  return t;
}
const EnumTable<DecayShape>& decay_shape_table() {
  static const auto t =
      named({DecayShape::linear, DecayShape::one_minus_sqrt, DecayShape::cosine}, decay_shape_name);
  return t;
}
const EnumTable<UpdateRule>& optimizer_table() {
  static const EnumTable<UpdateRule> t = {{UpdateRule::lamb, "lamb"},
                                          {UpdateRule::adamw, "adamw"},
                                          {UpdateRule::stable_adamw, "stable_adamw"}};
  return t;
}
const EnumTable<ScheduleUnit>& schedule_unit_table() {
  static const auto t = named({ScheduleUnit::steps, ScheduleUnit::tokens}, schedule_unit_name);
  return t;
}
const EnumTable<NormPlacement>& norm_table() {
  static const EnumTable<NormPlacement> t = {{NormPlacement::post, "post"},
                                             {NormPlacement::pre, "pre"}};
  return t;
}
const EnumTable<Positions>& position_table() {
  static const EnumTable<Positions> t = {{Positions::learned, "learned"},
                                         {Positions::rope, "rope"}};
  return t;
}
const EnumTable<MlpKind>& mlp_table() {
  static const EnumTable<MlpKind> t = {
      {MlpKind::gelu, "gelu"}, {MlpKind::geglu, "geglu"}, {MlpKind::swiglu, "swiglu"}};
  return t;
}
const EnumTable<GpuAllreduce>& gpu_allreduce_table() {
  static const EnumTable<GpuAllreduce> t = {{GpuAllreduce::nccl, "nccl"},
                                            {GpuAllreduce::host, "host"}};
  return t;
}
const EnumTable<MaskingMode>& masking_table() {
  static const EnumTable<MaskingMode> t = {{MaskingMode::static_masks, "static"},
                                           {MaskingMode::dynamic, "dynamic"}};
  return t;
}
const EnumTable<MaskCount>& mask_count_table() {
  static const EnumTable<MaskCount> t = {{MaskCount::fixed, "fixed"},
                                         {MaskCount::bernoulli, "bernoulli"}};
  return t;
}
const EnumTable<SubmissionDivision>& division_table() {
  static const EnumTable<SubmissionDivision> t = {{SubmissionDivision::closed, "closed"},
                                                  {SubmissionDivision::open, "open"}};
  return t;
}
const EnumTable<SubmissionStatus>& status_table() {
  static const EnumTable<SubmissionStatus> t = {{SubmissionStatus::onprem, "onprem"},
                                                {SubmissionStatus::cloud, "cloud"},
                                                {SubmissionStatus::research, "research"}};
  return t;
}

using C = TrainConfig;
using Key = config::Key<C>;

// A model key whose default is the preset's (load_train_config resolves it).
Key preset_key(Key k) {
  k.default_doc = "preset's";
  return k;
}

std::vector<Key> make_keys() {
  std::vector<Key> k;
  using M = C::Model;
  using T = C::Train;
  using O = C::Optim;
  using D = C::Data;
  using K = C::Checkpoint;
  using E = C::Eval;
  using L = C::Log;
  // [model]
  k.push_back(
      config::choice_key("model.preset", &C::model, &M::preset, bert_preset_names(),
                         "model: BERT's tiny (L2 H128), mini (L4 H256), base (L12 H768), large "
                         "(L24 H1024), or ModernBERT's modernbert-tiny (L4 H128), -base (L22 "
                         "H768), -large (L28 H1024); the keys below override single values"));
  k.push_back(preset_key(key("model.layers", &C::model, &M::layers, "encoder layers")));
  k.push_back(preset_key(key("model.hidden", &C::model, &M::hidden, "hidden size")));
  k.push_back(
      preset_key(key("model.heads", &C::model, &M::heads, "attention heads (divide hidden)")));
  k.push_back(
      preset_key(key("model.intermediate", &C::model, &M::intermediate, "feed-forward size")));
  k.push_back(
      preset_key(key("model.max_position_embeddings", &C::model, &M::max_position_embeddings,
                     "position embedding rows (>= train.max_seq_len)")));
  k.push_back(preset_key(key("model.vocab_size", &C::model, &M::vocab_size,
                             "tokens of the tokenizer (the shards record theirs); the "
                             "embedding and decoder pad it to a multiple of 8")));
  k.push_back(preset_key(key("model.hidden_dropout", &C::model, &M::hidden_dropout,
                             "dropout after embeddings, attention output and FFN, in [0, 1)")));
  k.push_back(preset_key(key("model.attention_dropout", &C::model, &M::attention_dropout,
                             "dropout on attention probabilities, in [0, 1)")));
  k.push_back(key("model.hidden_act", &C::model, &M::hidden_act, gelu_table(),
                  "GELU of the MLP and MLM transform: gelu (exact, erf; Hugging Face "
                  "\"gelu\") or gelu_tanh (the tanh approximation of Google's BERT and "
                  "NVIDIA's MLPerf BERT; Hugging Face \"gelu_new\"; fused into cuBLASLt's "
                  "GELU epilogues on CUDA)"));
  // The architecture options (docs/architectures.md).
  k.push_back(preset_key(key("model.norm", &C::model, &M::norm, norm_table(),
                             "where the norms sit: post (after each residual sum, BERT) or pre "
                             "(before each block, with a final norm; ModernBERT)")));
  k.push_back(preset_key(key("model.position", &C::model, &M::position, position_table(),
                             "positions: learned (a table added to the embeddings) or rope "
                             "(rotary embeddings on queries and keys, per sequence)")));
  k.push_back(preset_key(key("model.rope_theta", &C::model, &M::rope_theta,
                             "RoPE base of the global layers (ModernBERT: 160000)")));
  k.push_back(preset_key(key("model.local_rope_theta", &C::model, &M::local_rope_theta,
                             "RoPE base of the local layers (ModernBERT: 10000)")));
  k.push_back(preset_key(key("model.mlp", &C::model, &M::mlp, mlp_table(),
                             "MLP: gelu (dense-GELU-dense), geglu or swiglu (gated: Wi gives 2 x "
                             "intermediate, act(first half) * second half)")));
  k.push_back(preset_key(key("model.bias", &C::model, &M::bias,
                             "biases of the encoder's and the MLM transform's linear layers (the "
                             "decoder keeps its bias)")));
  k.push_back(preset_key(key("model.norm_bias", &C::model, &M::norm_bias, "the norms' biases")));
  k.push_back(preset_key(
      key("model.token_types", &C::model, &M::token_types, "token-type (segment) embeddings")));
  k.push_back(preset_key(key("model.local_window", &C::model, &M::local_window,
                             "local attention window w: a local layer's query i sees the keys j "
                             "of its sequence with |i - j| <= w / 2; 0 = every layer global")));
  k.push_back(preset_key(key("model.global_every", &C::model, &M::global_every,
                             "layer l is global when l % global_every == 0 (ModernBERT: 3)")));
  k.push_back(preset_key(key("model.nsp_head", &C::model, &M::nsp_head,
                             "the pooler and the NSP classifier (and the NSP loss)")));
  k.push_back(preset_key(key("model.layer_norm_eps", &C::model, &M::layer_norm_eps,
                             "every norm's epsilon (BERT 1e-12, ModernBERT 1e-5)")));
  k.push_back(key("model.mlm_chunk_rows", &C::model, &M::mlm_chunk_rows,
                  "masked tokens per MLM-head chunk (mini-sequence, saves memory); 0 = all at "
                  "once"));
  k.push_back(key("model.mst_chunks", &C::model, &M::mst_chunks,
                  "mini-sequence chunks M: the MLP runs over M token chunks (its intermediate "
                  "recomputed in backward), the MLM head over M masked-token chunks "
                  "(model.mlm_chunk_rows wins if set); 1 = off; 0 = auto: the smallest of "
                  "1, 2, 4, .., 64 that fits model.activation_budget_mb"));
  k.push_back(key("model.activation_budget_mb", &C::model, &M::activation_budget_mb,
                  "activation arena budget in MiB per rank for model.mst_chunks = 0"));
  k.push_back(key("model.recompute", &C::model, &M::recompute, recompute_table(),
                  "activation recomputation: none; mlp (MLP intermediate recomputed in "
                  "backward, implied by mst_chunks > 1); layer (only layer inputs kept, "
                  "each layer recomputed before its backward)"));
  // [train]
  k.push_back(key("train.max_steps", &C::train, &T::max_steps,
                  "optimizer steps of the run (also where the LR reaches end_lr)"));
  k.push_back(key("train.global_batch_size", &C::train, &T::global_batch_size,
                  "samples per optimizer step, all ranks and micro-steps together"));
  k.push_back(key("train.gradient_accumulation_steps", &C::train, &T::gradient_accumulation_steps,
                  "micro-steps per optimizer step (>= 1)"));
  k.push_back(key("train.seed", &C::train, &T::seed,
                  "seed of parameter init, data order and dropout (>= 0)"));
  k.push_back(key("train.layout", &C::train, &T::layout, layout_table(),
                  "batch layout: unpadded (cu_seqlens), packed (several sequences per row) or "
                  "padded"));
  k.push_back(key("train.max_seq_len", &C::train, &T::max_seq_len,
                  "longest sample; row length of the packed and padded layouts"));
  k.push_back(key("train.max_seqs_per_pack", &C::train, &T::max_seqs_per_pack,
                  "sequences per pack (packed layout, planning); 0 = no limit"));
  k.push_back(key("train.max_predictions_per_seq", &C::train, &T::max_predictions_per_seq,
                  "masked positions a sample may hold (MLPerf: 20 at seq 128, 76 at 512)"));
  k.push_back(key("train.last_step", &C::train, &T::last_step, last_step_table(),
                  "epoch remainder: partial (a smaller last step) or drop (every step full, as "
                  "MLPerf)"));
  k.push_back(key("train.batch_warmup_start", &C::train, &T::batch_warmup_start,
                  "batch-size warmup: the global batch of the first step, growing linearly to "
                  "global_batch_size over batch_warmup_steps or batch_warmup_tokens, rounded "
                  "down to multiples of batch_warmup_multiple; 0 = off; "
                  "docs/training.md#batch-size-warmup"));
  k.push_back(key("train.batch_warmup_steps", &C::train, &T::batch_warmup_steps,
                  "batch warmup: its length in optimizer steps (or batch_warmup_tokens)"));
  k.push_back(key("train.batch_warmup_tokens", &C::train, &T::batch_warmup_tokens,
                  "batch warmup: its length in real tokens trained (or batch_warmup_steps)"));
  k.push_back(key("train.batch_warmup_multiple", &C::train, &T::batch_warmup_multiple,
                  "batch warmup: every size is a multiple of this, itself a multiple of the "
                  "world size x gradient_accumulation_steps; 0 = that product (then the sizes "
                  "depend on the rank count: set it to compare rank counts)"));
  k.push_back(key("train.dropout", &C::train, &T::dropout,
                  "apply dropout (false: deterministic training, for checks)"));
  k.push_back(key("train.max_nonfinite_steps", &C::train, &T::max_nonfinite_steps,
                  "a step with a non-finite loss or gradient is skipped (no update) and "
                  "counted; more than this many in a row is an error naming the step (0: the "
                  "first one)"));
  k.push_back(key("train.device", &C::train, &T::device, device_table(),
                  "where the step runs: cpu, or cuda (one GPU per rank: local rank r takes GPU r "
                  "of those it sees; launch scripts show each rank only its own)"));
  k.push_back(key("train.precision", &C::train, &T::precision, precision_table(),
                  "storage of activations and of the GEMMs' weight copy: fp32; bf16 or "
                  "fp16 with fp32 master weights, LayerNorm statistics, losses and "
                  "gradient sums (fp16 adds dynamic loss scaling; on the CPU backend the "
                  "low precision is emulated, for testing); fp8: bf16, with the encoder's "
                  "linear layers' GEMMs in FP8 (E4M3 forward, E5M2 gradients, delayed "
                  "scaling: docs/fp8.md; on CUDA a GPU of compute capability 8.9 or newer)"));
  k.push_back(key("train.fp8_history", &C::train, &T::fp8_history,
                  "precision = fp8: steps of amax history an activation's or gradient's scale "
                  "is taken from (1 to 65536; Transformer Engine's default, docs/fp8.md)"));
  k.push_back(key("train.fp8_margin", &C::train, &T::fp8_margin,
                  "precision = fp8: each scale is 2^margin below the largest that does not "
                  "saturate at the history's amax (0 to 64)"));
  k.push_back(key("train.cuda_graphs", &C::train, &T::cuda_graphs, cuda_graphs_table(),
                  "device = cuda: off (every kernel launched by the host), segmented (each "
                  "encoder layer's forward and backward, and the heads, recorded as CUDA "
                  "graphs at their batch shape's second use, then replayed: fewer launches; "
                  "batches padded to a shared row and sequence capacity, at most 1/16 more "
                  "rows, and masked tokens to the most a micro-batch has had so far plus at "
                  "most 1/16; the embeddings and optimizer stay op by op) or full (a "
                  "micro-step's whole forward, heads included, and its whole backward as two "
                  "graphs, and the optimizer's step as one: norm and update (sharded, with "
                  "its sums over ranks and the weights' gathers inside, unless gpu_allreduce "
                  "= host); with NCCL the gradient round's "
                  "collectives inside the last backward's graph, overlapping it; with "
                  "gpu_allreduce = host the round starts after the backward)"));
  k.push_back(key("train.gpu_allreduce", &C::train, &T::gpu_allreduce, gpu_allreduce_table(),
                  "device = cuda, several ranks: nccl (gradient buckets all-reduced on a "
                  "communication stream during the backward) or host (each bucket staged "
                  "through host memory and summed by MPI: slower, a fallback)"));
  k.push_back(key("train.loss_scale_init", &C::train, &T::loss_scale_init,
                  "precision = fp16: the first loss scale, a power of two in [1, 2^24]"));
  k.push_back(key("train.loss_scale_growth_interval", &C::train, &T::loss_scale_growth_interval,
                  "precision = fp16: finite steps in a row before the loss scale doubles "
                  "(an overflow skips the step and halves it)"));
  k.push_back(key("train.collective_timeout_s", &C::train, &T::collective_timeout_s,
                  "seconds a rank may wait in a collective (gradient all-reduce, NCCL's "
                  "included, loader exchange, checkpoint barrier, evaluation) before the job "
                  "aborts with "
                  "an error naming it and the step; 0 = off; the default outlasts a "
                  "checkpoint write the others wait for (DESIGN.md, Distribution)"));
  // [optim]
  k.push_back(key("optim.name", &C::optim, &O::name, optimizer_table(),
                  "optimizer: lamb (MLPerf BERT, apex FusedLAMB), adamw (torch.optim.AdamW) or "
                  "stable_adamw (optimi StableAdamW: AdamW with per-tensor update clipping); "
                  "docs/training.md#optimizers"));
  k.push_back(key("optim.decouple_lr", &C::optim, &O::decouple_lr,
                  "adamw / stable_adamw: fully decoupled weight decay, w (1 - lr wd / optim.lr) "
                  "(optimi's decouple_lr) instead of w (1 - lr wd)"));
  k.push_back(key("optim.lr", &C::optim, &O::lr, "peak learning rate"));
  k.push_back(key("optim.end_lr", &C::optim, &O::end_lr, "learning rate at train.max_steps"));
  k.push_back(key("optim.warmup_steps", &C::optim, &O::warmup_steps,
                  "linear warmup steps; 0 = use warmup_proportion"));
  k.push_back(key("optim.warmup_proportion", &C::optim, &O::warmup_proportion,
                  "warmup as a fraction of max_steps (when warmup_steps is 0), in [0, 1]"));
  k.push_back(key("optim.start_warmup_step", &C::optim, &O::start_warmup_step,
                  "MLPerf start_warmup_step: warmup offset (may be negative; needs "
                  "warmup_steps)"));
  k.push_back(key("optim.poly_power", &C::optim, &O::poly_power,
                  "power of the polynomial decay after warmup (schedule = poly)"));
  k.push_back(key("optim.schedule", &C::optim, &O::schedule, schedule_table(),
                  "learning-rate schedule after the warmup: poly (MLPerf: (1 - step / max_steps)"
                  "^poly_power), linear or cosine (from the warmup's end to end_lr at max_steps), "
                  "wsd (constant, then the last decay_steps decay to end_lr); "
                  "docs/training.md#learning-rate-schedules"));
  k.push_back(key("optim.decay_steps", &C::optim, &O::decay_steps,
                  "schedule = wsd: steps of the final decay; 0 = use decay_fraction"));
  k.push_back(key("optim.decay_fraction", &C::optim, &O::decay_fraction,
                  "schedule = wsd: the final decay as a fraction of max_steps (when decay_steps "
                  "is 0), in [0, 1]"));
  k.push_back(key("optim.decay_shape", &C::optim, &O::decay_shape, decay_shape_table(),
                  "schedule = wsd: the final decay's shape, 1 - t, 1 - sqrt(t) or "
                  "(1 + cos(pi t)) / 2 over its steps t in [0, 1]"));
  k.push_back(key("optim.schedule_unit", &C::optim, &O::schedule_unit, schedule_unit_table(),
                  "what the schedule counts: optimizer steps, or real tokens trained (then its "
                  "lengths are schedule_tokens, warmup_tokens and decay_tokens, and the "
                  "step-counted ones stay 0)"));
  k.push_back(key("optim.schedule_tokens", &C::optim, &O::schedule_tokens,
                  "schedule_unit = tokens: tokens trained where the rate reaches end_lr"));
  k.push_back(key("optim.warmup_tokens", &C::optim, &O::warmup_tokens,
                  "schedule_unit = tokens: linear warmup tokens; 0 = use warmup_proportion"));
  k.push_back(key("optim.decay_tokens", &C::optim, &O::decay_tokens,
                  "schedule_unit = tokens, schedule = wsd: tokens of the final decay; 0 = use "
                  "decay_fraction"));
  k.push_back(key("optim.beta1", &C::optim, &O::beta1, "first-moment decay"));
  k.push_back(key("optim.beta2", &C::optim, &O::beta2, "second-moment decay"));
  k.push_back(key("optim.epsilon", &C::optim, &O::epsilon,
                  "added to sqrt(v^) (StableAdamW: eps^2 also floors v^ in its RMS)"));
  k.push_back(key("optim.weight_decay", &C::optim, &O::weight_decay,
                  "decoupled weight decay (not on biases and LayerNorm)"));
  k.push_back(key("optim.max_grad_norm", &C::optim, &O::max_grad_norm,
                  "clip the global gradient norm to this; 0 = no clipping"));
  k.push_back(key("optim.sharded", &C::optim, &O::sharded,
                  "sharded optimizer: each rank keeps the moments of, and updates, its 1/N of "
                  "the parameters (cut anywhere); gradients reduce-scattered, the weights the "
                  "model reads all-gathered layer by layer (one rank: no-op)"));
  // [data]
  k.push_back(key("data.train_dir", &C::data, &D::train_dir,
                  "training shards: a directory of .h5 files or one file"));
  k.push_back(key("data.eval_dir", &C::data, &D::eval_dir,
                  "evaluation shards: a directory of .h5 files or one file"));
  k.push_back(key("data.vocab", &C::data, &D::vocab,
                  "the shards' tokenizer: a WordPiece vocab.txt or a Hugging Face tokenizer.json; "
                  "shards that record another are refused (docs/own_corpus.md)"));
  k.push_back(key("data.prefetch_steps", &C::data, &D::prefetch_steps,
                  "steps the loader prepares ahead (>= 1)"));
  k.push_back(key("data.shuffle_block_rows", &C::data, &D::shuffle_block_rows,
                  "contiguous rows read at once (the shards' HDF5 chunk: 4096)"));
  k.push_back(key("data.shuffle_window_blocks", &C::data, &D::shuffle_window_blocks,
                  "blocks shuffled together"));
  k.push_back(key("data.read_ahead_windows", &C::data, &D::read_ahead_windows,
                  "shuffle windows read ahead of need (>= 0)"));
  k.push_back(key("data.masking", &C::data, &D::masking, masking_table(),
                  "masked-LM masks: static (the shards') or dynamic (drawn again each time a "
                  "sample is served, from train.seed, the epoch and the sample; needs "
                  "data.vocab; evaluation keeps the shards' masks); docs/training.md#masking"));
  k.push_back(key("data.mlm_probability", &C::data, &D::mlm_probability,
                  "masking = dynamic: the share of tokens masked, in (0, 1]"));
  k.push_back(key("data.mask_count", &C::data, &D::mask_count, mask_count_table(),
                  "masking = dynamic: fixed (min(train.max_predictions_per_seq, max(1, "
                  "round(p * length))) per sample, as prepare) or bernoulli (each token or "
                  "whole word with p, at most train.max_predictions_per_seq)"));
  k.push_back(key("data.whole_word_masking", &C::data, &D::whole_word_masking,
                  "masking = dynamic: a \"##\" piece is masked with the piece before it"));
  k.push_back(key("data.mask_token_share", &C::data, &D::mask_token_share,
                  "masking = dynamic: the share of masked positions that read [MASK]"));
  k.push_back(key("data.random_token_share", &C::data, &D::random_token_share,
                  "masking = dynamic: the share that read a random token (never a special "
                  "one); the rest keep theirs"));
  // [checkpoint]
  k.push_back(
      key("checkpoint.dir", &C::checkpoint, &K::dir, "where checkpoints are written; \"\" = none"));
  k.push_back(key("checkpoint.every_steps", &C::checkpoint, &K::every_steps,
                  "checkpoint interval; 0 = only at the end and on SIGTERM"));
  k.push_back(
      key("checkpoint.keep", &C::checkpoint, &K::keep, "newest complete checkpoints kept (>= 1)"));
  k.push_back(key("checkpoint.resume", &C::checkpoint, &K::resume,
                  "\"\" = fresh run, \"auto\" = newest valid under dir (damaged ones moved "
                  "aside), or a checkpoint path"));
  k.push_back(key("checkpoint.init_checkpoint", &C::checkpoint, &K::init_checkpoint,
                  "initial model weights only (fresh optimizer and data order); \"\" = random "
                  "init"));
  k.push_back(key("checkpoint.overwrite", &C::checkpoint, &K::overwrite,
                  "a run that starts fresh deletes the checkpoints under dir first (without it, "
                  "it refuses a dir that holds any)"));
  // [eval]
  k.push_back(key("eval.every_samples", &C::eval, &E::every_samples,
                  "evaluate every this many training samples; 0 = only at the end"));
  k.push_back(key("eval.max_samples", &C::eval, &E::max_samples,
                  "eval samples per evaluation; 0 = the whole eval set"));
  k.push_back(
      key("eval.batch_size", &C::eval, &E::batch_size, "eval samples per rank per forward"));
  k.push_back(key("eval.target_accuracy", &C::eval, &E::target_accuracy,
                  "stop when the eval MLM accuracy reaches this; 0 = no target"));
  k.push_back(key("eval.at_end", &C::eval, &E::at_end, "evaluate after the last step"));
  // [log]
  k.push_back(
      key("log.every_steps", &C::log, &L::every_steps,
          "progress line and metrics record interval, steps (the GPU's losses and optimizer "
          "scalars are read on these steps only)"));
  k.push_back(key("log.metrics_file", &C::log, &L::metrics_file,
                  "JSONL metrics (scripts/plot_metrics.py); \"\" = none"));
  k.push_back(key("log.tensorboard_dir", &C::log, &L::tensorboard_dir,
                  "TensorBoard logdir: rank 0 writes every metrics record and the config there "
                  "as the run goes (docs/tensorboard.md); \"\" = none"));
  k.push_back(key("log.peak_tflops", &C::log, &L::peak_tflops,
                  "train.device = cuda: one GPU's dense peak (TFLOP/s) for the precision in use, "
                  "the denominator of the mfu figure; 0 = from the table of known GPUs "
                  "(docs/performance.md#model-flops)"));
  k.push_back(
      key("log.mllog_file", &C::log, &L::mllog_file, "MLPerf log (:::MLLOG lines); \"\" = none"));
  k.push_back(key("log.end_file", &C::log, &L::end_file,
                  "JSON rank 0 writes when the run ends without an error, after its last "
                  "checkpoint: reason (finished, target_reached, signal), step, checkpoint; "
                  "removed at the start (scripts/run_job.sh reads it); \"\" = none"));
  k.push_back(key("log.submission_org", &C::log, &L::submission_org, "MLPerf submission_org"));
  k.push_back(key("log.submission_platform", &C::log, &L::submission_platform,
                  "MLPerf submission_platform; \"\" = \"<ranks>xCPU\""));
  k.push_back(key("log.submission_division", &C::log, &L::submission_division, division_table(),
                  "MLPerf submission_division"));
  k.push_back(key("log.submission_status", &C::log, &L::submission_status, status_table(),
                  "MLPerf submission_status"));

  return k;
}

}  // namespace

const config::Schema<TrainConfig>& train_config_schema() {
  static const config::Schema<TrainConfig> schema("packbert train / eval", make_keys());
  return schema;
}

bool TrainConfig::operator==(const TrainConfig& o) const {
  return train_config_schema().equal(*this, o);
}

std::string train_config_to_toml(const TrainConfig& c) { return train_config_schema().to_toml(c); }

const std::vector<config::KeyDoc>& train_config_keys() {
  static const std::vector<config::KeyDoc> docs = train_config_schema().docs();
  return docs;
}

const char* config_name(Recompute v) { return config::enum_name(recompute_table(), v); }
const char* config_name(Gelu v) { return config::enum_name(gelu_table(), v); }
const char* config_name(NormPlacement v) { return config::enum_name(norm_table(), v); }
const char* config_name(Positions v) { return config::enum_name(position_table(), v); }
const char* config_name(MlpKind v) { return config::enum_name(mlp_table(), v); }
const char* config_name(Device v) { return config::enum_name(device_table(), v); }
const char* config_name(Precision v) { return config::enum_name(precision_table(), v); }
const char* config_name(CudaGraphs v) { return config::enum_name(cuda_graphs_table(), v); }
const char* config_name(MaskingMode v) { return config::enum_name(masking_table(), v); }
const char* config_name(GpuAllreduce v) { return config::enum_name(gpu_allreduce_table(), v); }
const char* config_name(SubmissionDivision v) { return config::enum_name(division_table(), v); }
const char* config_name(SubmissionStatus v) { return config::enum_name(status_table(), v); }

}  // namespace packbert
