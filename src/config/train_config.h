// TrainConfig: everything `packbert train` / `packbert eval` are told, from a TOML file plus
// "section.key=value" overrides, read by the config system of every subcommand
// (config/config.h: toml++, snake_case keys, errors naming FILE:LINE:COLUMN and the key). One
// key table (train_config_keys.cpp) knows every key: its name, type, default, doc and field;
// reading, equality, the TOML writer and the key table of docs/configuration.md all come from
// it, so they cannot disagree. The files, by job (every subcommand's config lives in src/config:
// prepare, inspect and pack in command_config.h):
//   train_config_keys.cpp      the key table, enum names, equality, writer, docs table
//   train_config_read.cpp      file + overrides -> TrainConfig (model preset resolution)
//   train_config_validate.cpp  the rules between keys, and the paths
//   train_config_model.cpp     the model and the learning-rate schedule a config describes
// The options of the code a config drives (model, trainer, loader, LAMB, schedule) are made in
// one place: src/train/train_options.h (the model and the schedule, which the validation checks,
// in config/train_config_model.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/key_doc.h"
#include "config/locations.h"
#include "data/loader/loader.h"          // LastStepPolicy
#include "kernels/backend.h"             // Gelu
#include "kernels/base/tensor.h"         // Device
#include "model/option_enums.h"          // Recompute, Precision, CudaGraphs, BatchLayout
#include "data/masking/masking.h"        // MaskCount
#include "kernels/common/update_rule.h"  // UpdateRule
#include "optim/lr_schedule.h"           // LrScheduleKind, DecayShape, ScheduleUnit

namespace packbert {

// The enums of keys that have no type elsewhere (their names: config_name()).
enum class GpuAllreduce { nccl, host };
enum class MaskingMode {
  static_masks,
  dynamic
};  // "static": the shards' masks  // host: MPI on host memory (GradTransport::mpi)
enum class SubmissionDivision { closed, open };
enum class SubmissionStatus { onprem, cloud, research };

struct TrainConfig {
  struct Model {
    std::string preset = "base";  // tiny | mini | base | large (bert_preset)
    // Resolved values: the preset's unless the key was given (file or override).
    int64_t layers = 12;
    int64_t hidden = 768;
    int64_t heads = 12;
    int64_t intermediate = 3072;
    int64_t max_position_embeddings = 512;
    int64_t vocab_size = 30522;  // the tokenizer's; the embedding pads it (BertConfig)
    double hidden_dropout = 0.1;
    double attention_dropout = 0.1;
    int64_t mlm_chunk_rows = 0;        // MLM head rows per chunk (mini-sequence); 0 = all at once
    int64_t mst_chunks = 1;            // MST chunks M of the MLP and MLM head; 0 = auto (budget)
    int64_t activation_budget_mb = 0;  // MiB of activation arena for mst_chunks = 0
    Recompute recompute = Recompute::none;  // none | mlp | layer (BertOptions::recompute)
    Gelu hidden_act = Gelu::erf;            // gelu (erf) | gelu_tanh (BertConfig::hidden_act)
    // The architecture options (BertConfig): the preset's unless given.
    NormPlacement norm = NormPlacement::post;
    Positions position = Positions::learned;
    double rope_theta = 10000.0;
    double local_rope_theta = 10000.0;
    MlpKind mlp = MlpKind::gelu;
    bool bias = true;
    bool norm_bias = true;
    bool token_types = true;
    int64_t local_window = 0;
    int64_t global_every = 1;
    bool nsp_head = true;
    double layer_norm_eps = 1e-12;
  } model;

  struct Train {
    int64_t max_steps = 1000;             // optimizer steps of the run
    int64_t global_batch_size = 256;      // samples per optimizer step, all ranks together
    int gradient_accumulation_steps = 1;  // micro-steps per optimizer step (>= 1)
    uint64_t seed = 42;                   // init, data order and dropout
    BatchLayout layout = BatchLayout::unpadded;
    int max_seq_len = 512;
    int max_seqs_per_pack = 3;         // 0 = no limit
    int max_predictions_per_seq = 76;  // masked positions a sample may hold (MLPerf: 76 at 512)
    LastStepPolicy last_step = LastStepPolicy::partial;
    // Batch-size warmup (data/loader/batch_warmup.h): from batch_warmup_start samples to
    // global_batch_size over batch_warmup_steps steps or batch_warmup_tokens tokens, in multiples
    // of batch_warmup_multiple (0: world size x gradient_accumulation_steps). start 0: off.
    int64_t batch_warmup_start = 0;
    int64_t batch_warmup_steps = 0;
    int64_t batch_warmup_tokens = 0;
    int64_t batch_warmup_multiple = 0;
    bool dropout = true;
    int max_nonfinite_steps = 5;  // non-finite steps skipped in a row before it is an error
    Device device = Device::cpu;  // cpu | cuda (one GPU per rank: local rank r takes GPU r)
    Precision precision = Precision::fp32;  // fp32 | bf16 | fp16 | fp8 (BertOptions::precision)
    int fp8_history = 1024;                 // fp8: amax history length (Fp8Recipe::history)
    int fp8_margin = 0;                     // fp8: scale margin, a power of two (Fp8Recipe::margin)
    CudaGraphs cuda_graphs = CudaGraphs::off;  // off | segmented | full (BertOptions::cuda_graphs)
    GpuAllreduce gpu_allreduce = GpuAllreduce::nccl;  // TrainerOptions::gpu_transport
    double loss_scale_init = 65536.0;                 // fp16: first loss scale (a power of two)
    int64_t loss_scale_growth_interval = 2000;        // fp16: clean steps before the scale doubles
    // Seconds a collective may wait before the job aborts (core/watchdog.h); 0 = off. Why 30
    // minutes: DESIGN.md, Distribution.
    double collective_timeout_s = 1800.0;
  } train;

  struct Optim {
    double lr = 3.5e-4;  // peak learning rate (opt_base_learning_rate)
    double end_lr = 0.0;
    int64_t warmup_steps = 0;  // 0: warmup_proportion decides
    double warmup_proportion = 0.0;
    int64_t start_warmup_step = 0;  // MLPerf start_warmup_step (may be negative)
    double poly_power = 1.0;
    LrScheduleKind schedule = LrScheduleKind::poly;
    int64_t decay_steps = 0;  // wsd: the decay's length; 0: decay_fraction decides
    double decay_fraction = 0.0;
    DecayShape decay_shape = DecayShape::linear;
    // Unit tokens: the schedule counts real tokens trained; its lengths are these keys.
    ScheduleUnit schedule_unit = ScheduleUnit::steps;
    int64_t schedule_tokens = 0;         // where the rate reaches end_lr (train.max_steps' part)
    int64_t warmup_tokens = 0;           // 0: warmup_proportion of schedule_tokens decides
    int64_t decay_tokens = 0;            // wsd: the decay's length; 0: decay_fraction decides
    UpdateRule name = UpdateRule::lamb;  // optim.name: lamb, adamw, stable_adamw
    bool decouple_lr = false;            // AdamW family: weight decay scaled by lr / optim.lr
    double beta1 = 0.9;
    double beta2 = 0.999;
    double epsilon = 1e-6;
    double weight_decay = 0.01;
    double max_grad_norm = 1.0;
    bool sharded = false;  // each rank keeps and updates a 1/N range (optim/sharding.h)
  } optim;

  struct Data {
    std::string train_dir;  // shard directory (or file) of the training set
    std::string eval_dir;   // shard directory (or file) of the evaluation set
    std::string vocab;      // vocab.txt (one token per line)
    int prefetch_steps = 2;
    int64_t shuffle_block_rows = 4096;
    int64_t shuffle_window_blocks = 8;
    int read_ahead_windows = 1;
    // Masked-LM masks: the shards' (static) or drawn again each time a sample is served.
    MaskingMode masking = MaskingMode::static_masks;
    double mlm_probability = 0.15;
    MaskCount mask_count = MaskCount::fixed;
    bool whole_word_masking = false;
    double mask_token_share = 0.8;
    double random_token_share = 0.1;
  } data;

  struct Checkpoint {
    std::string dir;              // "" = no checkpoints are written
    int64_t every_steps = 0;      // 0 = only at the end and on SIGTERM
    int keep = 3;                 // newest complete checkpoints kept under dir
    std::string resume;           // "" none | "auto" newest complete under dir | a checkpoint path
    std::string init_checkpoint;  // model weights only (fresh optimizer and data order)
    bool overwrite = false;       // a fresh run deletes the checkpoints under dir first
  } checkpoint;

  struct Eval {
    int64_t every_samples = 0;    // 0 = only at the end (if at_end)
    int64_t max_samples = 10000;  // 0 = the whole eval set
    int batch_size = 64;          // samples per rank per forward
    double target_accuracy = 0;   // MLM accuracy that ends the run; 0 = no target
    bool at_end = true;
  } eval;

  struct Log {
    int64_t every_steps = 10;     // progress line / metrics record interval
    std::string metrics_file;     // JSONL; "" = none
    std::string tensorboard_dir;  // TensorBoard event files (train/tensorboard.h); "" = none
    std::string mllog_file;       // MLPerf log; "" = none
    std::string end_file;         // how the run ended (train/metrics.h RunEnd); "" = none
    double peak_tflops = 0;       // one GPU's dense peak for MFU; 0 = the table of known GPUs
    std::string submission_org;
    std::string submission_platform;
    SubmissionDivision submission_division = SubmissionDivision::closed;
    SubmissionStatus submission_status = SubmissionStatus::onprem;
  } log;

  // True when evaluation runs at all: every_samples > 0, at_end or target_accuracy > 0.
  bool eval_enabled() const;

  // Every key equal (the key table's comparison: no field is left out).
  bool operator==(const TrainConfig&) const;
  bool operator!=(const TrainConfig& o) const { return !(*this == o); }
};

// Reads an optional TOML file ("" = none) and then applies overrides "section.key=value" (a
// leading "--" allowed; the value in TOML syntax, except that a string or enum may also be given
// bare: "data.vocab=data/vocab.txt"). The command line wins over the file. Unknown sections and
// keys, kebab-case keys, malformed values, values of the wrong type or range, duplicate keys and
// syntax errors are Errors naming FILE:LINE:COLUMN (or "override '...'") and the key. The model
// preset is resolved: keys left unset take the preset's values. Paths are NOT checked here.
// `where` (optional) receives where each key was set, for config::check_located.
TrainConfig load_train_config(const std::string& toml_path,
                              const std::vector<std::string>& overrides = {},
                              config::KeyLocations* where = nullptr);

enum class ConfigPurpose { train, eval };

// Rules that need nothing but the config: hidden % heads, positive sizes, dropout in [0, 1),
// global_batch_size >= gradient_accumulation_steps,
// max_seq_len <= max_position_embeddings, eval ranges, finite lr >= 0, the LR schedule's own
// rules (LrSchedule), ... And with world_size: global_batch_size >= world_size *
// gradient_accumulation_steps (every micro-step of every rank can get a sample).
// With check_paths (the checks that depend on this machine): train.device = "cuda" needs a
// build with the CUDA backend; for Purpose::train, data.train_dir and data.vocab must exist;
// data.eval_dir must exist when evaluation is on (eval_enabled(): switch it off with
// eval.at_end=false, eval.every_samples=0, eval.target_accuracy=0); checkpoint.init_checkpoint and
// a resume path other than "auto" must exist; resume "auto" needs checkpoint.dir. For
// Purpose::eval: data.eval_dir must exist (and data.vocab is not needed). Every Error names the
// key, e.g. "model.hidden (100) must be divisible by model.heads (3)".
void validate_train_config(const TrainConfig& c, int world_size, ConfigPurpose purpose,
                           bool check_paths = true);

// Every key with its resolved value, one section after the other, as TOML that
// load_train_config reads back to an equal config (floats printed to round-trip exactly).
std::string train_config_to_toml(const TrainConfig& c);

// The name the config spells for an enum key's value ("gelu_tanh", "host", "closed"), from the
// key table's one table per enum.
const char* config_name(Recompute v);
const char* config_name(Gelu v);
const char* config_name(NormPlacement v);
const char* config_name(Positions v);
const char* config_name(MlpKind v);
const char* config_name(Device v);
const char* config_name(Precision v);
const char* config_name(CudaGraphs v);
const char* config_name(GpuAllreduce v);
const char* config_name(MaskingMode v);
const char* config_name(SubmissionDivision v);
const char* config_name(SubmissionStatus v);

// Every key (name, type, default, doc), in file order: model, train, optim, data, checkpoint,
// eval, log. docs/configuration.md's table of them is config::keys_markdown() of this list
// (tests/unit/test_config.cpp regenerates it).
const std::vector<config::KeyDoc>& train_config_keys();

}  // namespace packbert
