// What the token-wise op families share (kernels/ops/embedding.h, layernorm.h, attention.h,
// losses.h): where a micro-batch's tokens sit in the token-wise buffers (SeqLayout) and the
// dropout of one site (Dropout). The conventions every op keeps are in kernels/backend.h.
#pragma once

#include <cstdint>

#include "kernels/base/tensor.h"

namespace packbert {

// BERT's LayerNorm epsilon: the default of every LayerNorm's (LayerNormParams::eps,
// EmbeddingParams::ln_eps); ModernBERT's norms use 1e-5.
constexpr float kLayerNormEps = 1e-12f;

// Where the tokens of one micro-batch sit in the token-wise buffers. Every tensor lives on the
// backend's device. A row that belongs to no sequence is padding: token_seq = -1.
struct SeqLayout {
  int64_t rows = 0;  // rows of every token-wise buffer
  int32_t num_seqs = 0;
  int32_t max_len = 0;  // the longest sequence (sizes the CPU attention scratch)
  Tensor seq_start;     // i32 [num_seqs]: row of each sequence's first token ([CLS])
  Tensor seq_len;       // i32 [num_seqs]: tokens of each sequence, >= 1; or 0, an empty slot
                        // (no row names it: a fixed-capacity batch's unused sequence, which
                        // the token-wise ops skip and nsp_loss leaves out)
  Tensor sample_id;     // i64 [num_seqs]: global sample id (the dropout key), < 2^44
  Tensor token_seq;     // i32 [rows]: sequence of each row, -1 for padding
  Tensor token_pos;     // i32 [rows]: position inside its sequence (0 for padding); this is
                        // also the position-embedding index, so positions restart per sequence
  // Optional: a host copy of seq_len (num_seqs values, equal to it), when the caller has one
  // (the model keeps its batch's). A device backend then plans its attention launches without
  // reading seq_len back, which would wait for the stream; with index validation on it checks
  // the copy against seq_len.
  const int32_t* host_seq_len = nullptr;
  // Attention's launches from num_seqs and max_len alone, never from the lengths: one grid of
  // num_seqs x max_len (a block past a shorter sequence's end exits at once), sequences in
  // layout order, no lengths read on the host and no work list uploaded. So the launches are the
  // same for every batch of this num_seqs and max_len, as a CUDA graph replayed over new batches
  // needs; max_len is then a bound every sequence keeps to. The same results, bit for bit, as
  // the length-bucketed launches (more blocks that exit at once). The CPU backend ignores it.
  bool fixed_launch = false;
};

enum class DropoutSite : uint32_t {
  embedding = 0,         // after the embedding LayerNorm
  attention_probs = 1,   // on the softmax probabilities
  attention_output = 2,  // on the attention output projection, before the residual add
  ffn_output = 3,        // on the FFN output projection, before the residual add
};

// One dropout site of one step. The mask of an element is Philox(seed; step, sample id, layer,
// site, head, position inside the sample, element) (kernels/common/philox.h). p = 0 disables
// dropout (evaluation); padding rows are never dropped.
struct Dropout {
  float p = 0.f;
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t layer = 0;  // encoder layer; the embedding uses 0 (the site tells them apart)
  DropoutSite site = DropoutSite::embedding;
  // Optional: i32 [1] in the backend's memory holding the step (equal to `step` when the op is
  // issued), read when the op runs instead of `step`, so that a CUDA graph captured at one step
  // replays with the masks of the step its memory holds then (the model uploads it with each
  // batch). Its value must keep to the step's range (< 2^24), which is checked on `step`.
  Tensor device_step;
};

}  // namespace packbert
