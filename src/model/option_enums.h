// The enums of what the model is and how it computes a step, with their names: what a train
// config's keys hold (config/train_config.h) without the model itself. Each enum's meaning is
// with the code that reads it: the architecture's in model/config.h (BertConfig), Recompute and
// Precision in model/options.h (BertOptions), CudaGraphs in model/bert_graphs.h, BatchLayout in
// model/batch.h; the functions are defined beside them.
#pragma once

#include <string>

namespace packbert {

// Where a layer's norms sit: after each residual sum (BERT) or before each block, with a final
// norm after the last layer (ModernBERT; layer 0 has no attention norm, the embeddings end in
// one).
enum class NormPlacement { post, pre };
const char* norm_placement_name(NormPlacement n);  // "post", "pre"
// Position information: a learned table added to the embeddings (BERT), or rotary embeddings on
// each layer's queries and keys (RoPE, rotate-half form; positions restart in every sequence).
enum class Positions { learned, rope };
const char* positions_name(Positions p);  // "learned", "rope"
// The MLP: dense-GELU-dense (BERT), or gated: Wi gives [rows, 2I], act(first half) * second
// half goes into Wo (GeGLU with the GELU of hidden_act, SwiGLU with SiLU).
enum class MlpKind { gelu, geglu, swiglu };
const char* mlp_kind_name(MlpKind m);  // "gelu", "geglu", "swiglu"

// Activation recomputation (BertOptions::recompute).
enum class Recompute {
  none,   // every layer keeps what its backward reads
  mlp,    // the MLP intermediate [rows, 4H] is not kept: recomputed per chunk in backward
  layer,  // only each layer's input is kept; the layer's forward reruns before its backward
};
const char* recompute_name(Recompute r);  // "none", "mlp", "layer"

// Mixed precision (BertOptions::precision; model/options.h says what each one stores).
enum class Precision { fp32, bf16, fp16, fp8 };
const char* precision_name(Precision p);          // "fp32", "bf16", "fp16", "fp8"
Precision parse_precision(const std::string& s);  // the names above; Error otherwise

// CUDA graphs (BertOptions::cuda_graphs, model/bert_graphs.h).
enum class CudaGraphs { off, segmented, full };
const char* cuda_graphs_name(CudaGraphs g);          // "off", "segmented", "full"
CudaGraphs parse_cuda_graphs(const std::string& s);  // the names above; Error otherwise

// The layout of a batch (model/batch.h).
enum class BatchLayout { unpadded, packed, padded };
const char* batch_layout_name(BatchLayout l);
BatchLayout parse_batch_layout(const std::string& name);  // "unpadded" | "packed" | "padded"

}  // namespace packbert
