// The Hugging Face names of a model's tensors, and which tensors the architecture options leave
// out (an empty name): BertForPreTraining's names for post-norm models, ModernBertForMaskedLM's
// for pre-norm ones. ParamTable lays the tensors out in this order; docs/architectures.md lists
// the names.
//
// A pre-norm layer's norms are named by where Hugging Face puts them and used where the fused
// residual LayerNorm op computes them: the norm after layer l's attention sum is layer l's
// mlp_norm, the one after its MLP sum is layer l + 1's attn_norm (the final norm after the last
// layer), so each layer's group of tensors holds every gradient its backward produces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace packbert {

struct NormNames {
  std::string weight, bias;  // bias empty without norm_bias
};

struct LayerNames {
  // Query, key, value: BERT's three [H, H] (and [H]) tensors, laid end to end; ModernBERT's one
  // fused Wqkv. qkv_b empty without biases.
  std::vector<std::string> qkv_w, qkv_b;
  std::string attn_out_w, attn_out_b;
  NormNames attn_ln;  // after the attention's residual sum
  std::string ffn_in_w, ffn_in_b, ffn_out_w, ffn_out_b;
  NormNames ffn_ln;  // after the MLP's residual sum
};

struct ModelNames {
  std::string word, position, token_type;  // position / token_type empty when left out
  NormNames embedding_ln;
  std::vector<LayerNames> layers;
  std::string mlm_dense_w, mlm_dense_b;
  NormNames mlm_ln;
  std::string mlm_bias;  // the decoder's bias (its weight is the word embeddings)
  std::string pooler_w, pooler_b, nsp_w, nsp_b;  // empty without the NSP head
};

ModelNames model_names(const BertConfig& config);

}  // namespace packbert
