// What one micro-batch keeps: the uploaded batch (in one of the model's two batch buffers), and
// in the arena each part's saved tensors and the backward's scratch. Internal to the model: the
// parts (model/parts.h) read and write it, Bert carves it per micro-batch (model/bert_memory.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/arena.h"
#include "model/batch.h"
#include "model/config.h"

namespace packbert {

// How a micro-batch's activations are laid out (bert_memory.h activation_plan decides it from
// BertOptions).
struct ActivationPlan {
  bool gradients = true;
  int64_t mlm_chunk_rows = 0;  // masked rows per decoder call; 0: all at once
  // Rows per MLP chunk (mini-sequence). 0: each layer saves its MLP intermediate (pre, act
  // [rows, I]) for backward. > 0: nothing of it is saved; the forward runs the MLP chunk by
  // chunk through MlpScratch's [chunk, I] buffers, the backward recomputes each chunk there and
  // takes its gradient in MlpScratch::dpre.
  int64_t mlp_chunk_rows = 0;
  // Only the layer inputs (hidden) are kept; every layer's saved tensors share one set of
  // buffers (layers[l] are views of the same memory), refilled by recomputing layer l's
  // forward before its backward.
  bool layer_recompute = false;
  // Storage type of the token-wise activations and their gradients (BertOptions::precision);
  // LayerNorm statistics, lse, logits, NSP workspace and loss scalars are always f32.
  DType act = DType::f32;
};

// The embeddings' saved LayerNorm statistics, [rows] each (their output is hidden[0]).
struct EmbeddingSaved {
  Tensor ln_mean, ln_rstd;
};

// What an attention block's backward reads (rows = the batch's token rows).
struct AttentionSaved {
  Tensor qkv;      // [rows, 3H]
  Tensor ctx;      // [rows, H] attention output, heads concatenated
  Tensor lse;      // [rows, heads] softmax log-sum-exp per query row
  Tensor ln_in;    // [rows, H] ctx Wo^T, overwritten in place by dropout(. + bo) + x (pre-norm:
                   // + the residual stream; ln_in is then the stream after the attention)
  Tensor ln_mean;  // [rows]
  Tensor ln_rstd;  // [rows]
  Tensor h1;       // [rows, H] the block's output
};

// What an MLP block's backward reads.
struct MlpSaved {
  Tensor pre;      // [rows, I'] h1 W1^T + b1, I' = I or 2I (gated) (none when chunked)
  Tensor act;      // [rows, I] gelu(pre), or the gated act(first half) * second half (none
                   // when chunked)
  Tensor ln_in;    // [rows, H] act W2^T, then dropout(. + b2) + the residual (h1 or, pre-norm,
                   // the residual stream: attention.ln_in)
  Tensor ln_mean;  // [rows]
  Tensor ln_rstd;  // [rows]
};

struct LayerActivations {
  AttentionSaved attention;
  MlpSaved mlp;
};

// One MLP chunk's buffers (ActivationPlan::mlp_chunk_rows > 0), shared by every layer.
struct MlpScratch {
  Tensor pre, act;  // [chunk, I'] and [chunk, I]
  Tensor dpre;      // [chunk, I'] d(pre) of one chunk (with gradients)
  Tensor dact;      // [chunk, I] d(act) of one chunk (gated MLPs, with gradients)
};

// The encoder's backward scratch, shared by the layers (with gradients only).
struct EncoderScratch {
  Tensor dhidden[2];  // [rows, H] gradient wrt a layer's output / input, in turn
  Tensor dtmp;        // [rows, H] d(FFN out), then d(attention out)
  Tensor dctx;        // [rows, H]
  Tensor dwide;       // [rows, max(I' (+ I gated), 3H)] d(FFN pre) (I' = Wi's width; a gated
                      // MLP's d(act) after it), then d(qkv); [rows, 3H] when the MLP is chunked
  Tensor dstream;     // [rows, H] pre-norm only: the residual stream's gradient, from the last
                      // layer down to the embeddings
};

// The heads' buffers: the MLM transform over the masked rows, the decoder's logits chunk, the
// NSP workspace, and (with gradients) the transform's gradients.
struct HeadsActivations {
  Tensor mlm_x;                       // [masked, H] final hidden states of masked rows
  Tensor mlm_pre;                     // [masked, H] transform dense, before GELU
  Tensor mlm_act;                     // [masked, H] its GELU (the LayerNorm's saved input)
  Tensor mlm_ln_mean, mlm_ln_rstd;    // [masked]
  Tensor mlm_out;                     // [masked, H] transform output, the decoder's input
  Tensor logits;                      // [chunk, V] decoder workspace
  Tensor nsp_ws;                      // nsp_workspace_elems(seqs, H)
  Tensor mlm_dout, mlm_dact, mlm_dx;  // [masked, H] (with gradients)
};

// The dropout keys of the micro-batch in flight (Dropout, kernels/backend.h).
struct DropoutKeys {
  bool on = false;  // the config's rates; off for evaluation
  uint64_t seed = 0;
  uint32_t step = 0;
};

struct StepActivations {
  BatchShape shape;
  bool gradients = false;
  ActivationPlan plan;
  DropoutKeys keys;

  // The batch on the device (carve_batch, in one of the model's two batch buffers).
  Tensor input_ids, segment_ids;      // i32 [rows]
  Tensor token_seq, token_pos;        // i32 [rows]
  Tensor seq_start, seq_len;          // i32 [seqs]
  Tensor sample_id;                   // i64 [seqs]
  Tensor nsp_labels;                  // i32 [seqs]
  Tensor masked_rows, masked_labels;  // i32 [masked]
  Tensor step;                        // i32 [1]: the step (the dropouts' device_step)
  Tensor grad_scales;                 // f32 [2]: the MLM and NSP losses' gradient factors
                                      // (loss scale / global count; GradScale::device)
  SeqLayout layout;                   // over the tensors above
  SeqLayout nsp_layout;               // layout over the batch's own sequences: without the
                                      // empty slots a graphed batch's layout ends in
  std::vector<int32_t> host_seq_len;  // the batch's seq_len on the host (layout.host_seq_len)

  // The arena.
  EmbeddingSaved embedding;
  std::vector<Tensor> hidden;            // L + 1 of [rows, H]: embeddings, then each layer
  std::vector<LayerActivations> layers;  // L (all views of one set with layer_recompute)
  MlpScratch mlp;
  EncoderScratch scratch;
  HeadsActivations heads;
};

// The dropout of one site of layer `layer` in the micro-batch in flight.
Dropout dropout_of(const StepActivations& act, const BertConfig& config, DropoutSite site,
                   uint32_t layer);

// Lays the batch's device tensors (ids, layout arrays, labels) and act.layout over them out from
// the carver, charged to no kind: a model batch buffer, outside the arena. batch_bytes is the
// size of that carve.
void carve_batch(Carver& carver, const BatchShape& shape, StepActivations& act);
size_t batch_bytes(const BatchShape& shape);

// Lays the activations of a batch of `shape` out from the carver (measure with a null base):
// each part's carve (parts.h) in a fixed order. Every buffer is charged to its ActivationKind
// (carver.used_by_kind()).
void carve_activations(Carver& carver, const BertConfig& config, const BatchShape& shape,
                       const ActivationPlan& plan, StepActivations& act);

// Copies the host batch, the step and the two gradient factors into act's device tensors:
// ahead, by Backend::prefetch (their buffer must be one no op issued since the previous
// prefetch reads: the model's two buffers used in turn), else by Backend::upload, in op order.
void upload_batch(Backend& backend, const Batch& batch, uint32_t step,
                  const std::vector<float>& grad_scales, StepActivations& act, bool ahead);

}  // namespace packbert
