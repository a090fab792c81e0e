// The enums of how the model computes a step, with their names: what a train config's keys
// hold (config/train_config.h) without the model itself. Each enum's meaning is with the code
// that reads it: Recompute and Precision in model/options.h (BertOptions), CudaGraphs in
// model/bert_graphs.h, BatchLayout in model/batch.h; the functions are defined beside them.
#pragma once

#include <string>

namespace packbert {

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
