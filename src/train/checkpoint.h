// Checkpoints: one directory per saved step, readable by Hugging Face transformers as is.
//
//   <root>/step_00001000/                    (step_%08d; wider when the step needs more digits)
//     model.safetensors      every ParamTable tensor (src/model/params.h) under its Hugging
//                            Face name and PyTorch shape, F32: the fp32 master weights.
//                            Metadata {"format": "pt", "config_json_checksum": "<16 hex>"}
//                            (transformers refuses safetensors files without "format"). The
//                            tied decoder weight cls.predictions.decoder.weight is not written:
//                            transformers ties it to the word embeddings on load (as
//                            cls.predictions.decoder.bias to cls.predictions.bias).
//     config.json            Hugging Face BertConfig of BertForPreTraining (architectures,
//                            model_type "bert", vocab_size = the padded vocabulary, ...) plus
//                            "packbert_real_vocab_size" (the unpadded one).
//     optimizer.safetensors  LAMB's moments, F32: "exp_avg.<hf name>" (m) and
//                            "exp_avg_sq.<hf name>" (v) per tensor. Metadata {"format": "pt",
//                            "steps_done": "<LAMB steps taken>", "step": "<trainer step>",
//                            "trainer_state_json_checksum": "<16 hex>"}.
//     trainer_state.json     the caller's text, verbatim (packbert train writes a TrainerState,
//                            below: step, samples, loader position, loss scale, seeds).
//
// Integrity: both safetensors files carry a checksum of every tensor and of their header
// (src/train/safetensors.h: XXH3-64); config.json's and trainer_state.json's are in the metadata
// above, each in the file that is always read with it. Every read verifies all it reads (a
// DamagedFileError names the file and the tensor); a checkpoint whose files have no checksums
// (written before they existed) loads with one warning. verify_checkpoint() checks a whole
// directory without loading it (packbert inspect).
//
// `BertForPreTraining.from_pretrained(dir)` loads model.safetensors + config.json directly
// (missing keys: only the tied decoder ones). scripts/convert_hf_checkpoint.py turns a Hugging
// Face checkpoint (pytorch_model.bin or model.safetensors) into model.safetensors + config.json
// of this layout (the vocabulary padded to a multiple of 8) for --init-checkpoint.
//
// Writing is atomic: the directory is built as <root>/.step_NNNNNNNN.tmp-<pid>, every file and
// then the directory fsynced, renamed to its final name, and <root> fsynced. A crash leaves at
// most a .tmp directory, which latest_checkpoint() ignores; the previous checkpoints are never
// touched before the new one is complete.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/loader/loader.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/loss_scaler.h"

namespace packbert {

// Hugging Face config.json of BertForPreTraining for `config` (fsynced).
void write_hf_config(const std::string& path, const BertConfig& config);
// Reads a Hugging Face BERT config.json (ours, or one saved by transformers / Google's
// bert_config.json). real_vocab_size: "packbert_real_vocab_size", else min(vocab_size, 30522).
// Missing dropout rates / layer_norm_eps take BERT's defaults (0.1, 1e-12). Error naming the
// path and the field when a required field is missing or wrong (hidden_act other than "gelu"
// (erf), "gelu_new" or "gelu_pytorch_tanh" (the tanh approximation; written as "gelu_new"),
// position_embedding_type other than "absolute", a config validate() refuses).
BertConfig read_hf_config(const std::string& path);

// Precision fp8's scaling state (model/fp8.h, Fp8State::Saved): in optimizer.safetensors as
// "fp8.amax_history" F32 [operands, history] and "fp8.scales" F32 [operands, 2], with metadata
// "fp8_updates". A checkpoint of another precision has none.
struct Fp8Checkpoint {
  int64_t operands = 0, history = 0, updates = 0;
  std::vector<float> amax_history;  // [operands, history]
  std::vector<float> scales;        // [operands, 2]
};

// Everything a checkpoint holds. params, m, v: host buffers of table->total() floats.
struct CheckpointWrite {
  const ParamTable* table = nullptr;
  const float* params = nullptr;  // fp32 master weights
  const float* m = nullptr;       // LAMB first moments
  const float* v = nullptr;       // LAMB second moments
  int64_t step = 0;               // the directory's name: step_%08d
  int64_t lamb_steps_done = 0;    // LAMB's bias-correction counter
  std::string trainer_state_json;
  bool checksums = true;  // false: files as written before checksums (tests, benchmark)
  const Fp8Checkpoint* fp8 = nullptr;  // precision fp8's scaling state
};

// Writes root/step_%08d atomically: into root/.step_%08d.tmp-<pid> first (every file fsynced,
// then the dir), renamed to the final name, root fsynced; then removes the oldest complete
// checkpoints beyond keep_last (keep_last >= 1; the one just written is always kept, even when
// older-numbered than the others). root is created when missing. If the final name exists
// already it is replaced (the old one is renamed away first, removed after). On any failure the
// temporary directory is removed, existing checkpoints are untouched, and an Error names the
// path and the OS reason. A failure to prune an old checkpoint is only logged (the new one is
// complete). Returns the final directory.
std::string write_checkpoint(const std::string& root, const CheckpointWrite& w, int keep_last);

// Newest (highest step) complete checkpoint under root: a directory named step_NNNNNNNN (8 or
// more digits) holding all four files. .tmp directories and incomplete ones are ignored;
// nullopt when there is none or root does not exist.
std::optional<std::string> latest_checkpoint(const std::string& root);

// The newest first: every directory under root named step_NNNNNNNN, complete or not (a
// missing file is damage once written atomically), for --resume auto to try in turn.
std::vector<std::string> checkpoint_dirs_newest_first(const std::string& root);

// Moves a damaged checkpoint directory aside, to <dir>.corrupt (or .corrupt-2, ...: never over
// an earlier one), where latest_checkpoint(), pruning and --resume auto no longer see it; the
// parent is fsynced. Returns the new path; Error naming both paths when the rename fails.
std::string set_checkpoint_aside(const std::string& dir);
// Names of the directories under root that set_checkpoint_aside() made, sorted.
std::vector<std::string> set_aside_checkpoints(const std::string& root);

// trainer_state.json: where training stands beside the weights and moments. A resume reads
// step, samples, tokens, skipped_steps and loader, and loss_scale in fp16; rng, world_size and
// config record the run that wrote it (a resume takes its own from its config).
struct TrainerState {
  int64_t step = 0;           // optimizer steps done
  int64_t samples = 0;        // samples trained since the run started (all ranks)
  int64_t tokens = 0;         // real tokens trained
  int64_t skipped_steps = 0;  // updates skipped for a non-finite gradient or loss
  LoaderPosition loader;
  std::optional<LossScalerState> loss_scale;  // fp16 runs only
  // Every random stream is counter-based: these seeds (with the step and the sample ids) are
  // the whole RNG state.
  struct Rng {
    uint64_t train_seed = 0, init_seed = 0, dropout_seed = 0, data_seed = 0;
  } rng;
  int world_size = 0;
  std::string config;  // the run's effective config, TOML
};

// The file's text: a JSON object, indented by two spaces, keys sorted.
std::string trainer_state_to_json(const TrainerState& s);
// Parses trainer_state.json's text; path names the file in errors. Error naming the path and
// the field when a field a resume reads is missing, or when any field (rng, world_size and
// config may be absent) is not of its type; not JSON or not an object is an Error too.
TrainerState trainer_state_from_json(const std::string& text, const std::string& path);

struct CheckpointRead {
  int64_t step = 0;  // from optimizer.safetensors ("step"), else the dir's name
  int64_t lamb_steps_done = 0;
  std::string trainer_state_json;
  BertConfig config;                 // the checkpoint's config.json
  std::optional<Fp8Checkpoint> fp8;  // when the checkpoint has one
};

// Reads a checkpoint directory into caller buffers of table.total() floats (m, v may be null to
// skip them; their checksums are then not verified). Damage (a missing file, a file cut short or
// not in the format, a checksum that does not match) is a DamagedFileError naming the file and
// the tensor; a checkpoint that does not fit the model is an Error: config.json must match
// table.config() in every field, dropout rates included (naming the differing field and both
// values); every tensor must be present with the right dtype and shape, and no other tensor may
// be (naming the file and the tensor). Elements of the flat buffers between tensors (alignment
// gaps, if any) are set to 0.
CheckpointRead read_checkpoint(const std::string& dir, const ParamTable& table, float* params,
                               float* m, float* v);

// For --init-checkpoint: model.safetensors (and config.json) only, into params (table.total()
// floats). config.json must match table.config() in the model's shape (vocab_size,
// real_vocab_size, hidden_size, layers, heads, intermediate_size, positions, type vocabulary);
// dropout rates may differ. Tensors, damage and checksums as read_checkpoint.
void load_model_weights(const std::string& dir, const ParamTable& table, float* params);

// What verify_checkpoint() found in one directory.
struct CheckpointFileInfo {
  std::string name;  // "model.safetensors", ...
  bool present = false;
  uint64_t bytes = 0;   // the file's size
  int64_t tensors = 0;  // safetensors files
  bool checksummed = false;
};
struct CheckpointCheck {
  std::string dir;
  int64_t step = -1, samples = -1, tokens = -1;  // -1: unknown (trainer_state.json unreadable)
  std::string config;                            // describe() of config.json; "" if unreadable
  std::vector<CheckpointFileInfo> files;         // the four files, in the order above
  std::vector<std::string> damage;               // each failure, naming file and tensor
  bool damaged() const { return !damage.empty(); }
  // Files without a checksum (written before checksums existed): loadable, not verified.
  std::vector<std::string> unverified;
};
// Reads every byte of a checkpoint directory and checks every checksum it has; collects every
// failure (never throws for damage). No model is needed: the check is of the files alone.
CheckpointCheck verify_checkpoint(const std::string& dir);

// `packbert inspect` on checkpoints. True when path is a checkpoint directory (it holds one of
// the four files, or is named step_NNNNNNNN) or a root of them (it holds such directories, or
// ones set aside).
bool is_checkpoint_path(const std::string& path);
// Verifies the checkpoint at path, or every checkpoint under a root (oldest first), and prints
// for each its step, samples, config, files (tensors, bytes) and checksum verdict, then a
// summary naming the ones set aside. Returns how many are damaged.
int inspect_checkpoints(const std::string& path, std::ostream& os);

}  // namespace packbert
