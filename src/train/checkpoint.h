// Checkpoints: one directory per saved step, readable by Hugging Face transformers as is.
//
//   <root>/step_00001000/                    (step_%08d; wider when the step needs more digits)
//     model.safetensors      every ParamTable tensor (src/model/params.h) under its Hugging
//                            Face name and PyTorch shape, F32: the fp32 master weights.
//                            Metadata {"format": "pt"} (transformers refuses safetensors files
//                            without it). The tied decoder weight cls.predictions.decoder.weight
//                            is not written: transformers ties it to the word embeddings on
//                            load (as cls.predictions.decoder.bias to cls.predictions.bias).
//     config.json            Hugging Face BertConfig of BertForPreTraining (architectures,
//                            model_type "bert", vocab_size = the padded vocabulary, ...) plus
//                            "packbert_real_vocab_size" (the unpadded one).
//     optimizer.safetensors  LAMB's moments, F32: "exp_avg.<hf name>" (m) and
//                            "exp_avg_sq.<hf name>" (v) per tensor. Metadata {"format": "pt",
//                            "steps_done": "<LAMB steps taken>", "step": "<trainer step>"}.
//     trainer_state.json     the caller's JSON (trainer/loader position, metrics), verbatim.
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
#include <string>

#include "model/config.h"
#include "model/params.h"

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

// Everything a checkpoint holds. params, m, v: host buffers of table->total() floats.
struct CheckpointWrite {
  const ParamTable* table = nullptr;
  const float* params = nullptr;  // fp32 master weights
  const float* m = nullptr;       // LAMB first moments
  const float* v = nullptr;       // LAMB second moments
  int64_t step = 0;               // the directory's name: step_%08d
  int64_t lamb_steps_done = 0;    // LAMB's bias-correction counter
  std::string trainer_state_json;
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

struct CheckpointRead {
  int64_t step = 0;             // from optimizer.safetensors ("step"), else the dir's name
  int64_t lamb_steps_done = 0;
  std::string trainer_state_json;
  BertConfig config;            // the checkpoint's config.json
};

// Reads a checkpoint directory into caller buffers of table.total() floats (m, v may be null to
// skip them). The checkpoint's config.json must match table.config() in every field, dropout
// rates included (Error naming the differing field and both values); every tensor must be
// present with the right dtype and shape, and no other tensor may be (Error naming the file and
// the tensor). Elements of the flat buffers between tensors (alignment gaps, if any) are set to 0.
CheckpointRead read_checkpoint(const std::string& dir, const ParamTable& table, float* params,
                               float* m, float* v);

// For --init-checkpoint: model.safetensors (and config.json) only, into params (table.total()
// floats). config.json must match table.config() in the model's shape (vocab_size,
// real_vocab_size, hidden_size, layers, heads, intermediate_size, positions, type vocabulary);
// dropout rates may differ. Tensors as read_checkpoint.
void load_model_weights(const std::string& dir, const ParamTable& table, float* params);

}  // namespace packbert
