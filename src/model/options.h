// How Bert computes a step (BertOptions): recomputation, MST chunking, precision and CUDA
// graphs. What the model is, is BertConfig (model/config.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/backend.h"
#include "model/bert_graphs.h"
#include "model/fp8.h"
#include "model/option_enums.h"

namespace packbert {

// Mixed precision (BertOptions::precision): the storage type of the token-wise activations
// and of the weight copy the GEMMs read. fp32 is the reference; bf16 and fp16 keep fp32 master
// weights (the flat parameter buffer), fp32 LayerNorm statistics, lse, logits and losses, and
// accumulate every parameter gradient in fp32 (kernels/backend.h, Precision). fp16's narrow
// range needs loss scaling (optim/loss_scaler.h; ForwardOptions::loss_scale).
// CUDA graphs (BertOptions::cuda_graphs, model/bert_graphs.h): segmented records each encoder
// layer and the heads, full a micro-step's whole forward and whole backward; a backend without
// graphs (the CPU) runs the ops. docs/performance.md (CUDA graphs) says what each records.
// fp8: bf16, and the encoder's linear layers' GEMMs in FP8 with delayed scaling (model/fp8.h,
// docs/fp8.md).
// Precision and its names: model/option_enums.h.
DType precision_dtype(Precision p);  // f32, bf16, f16, bf16 (fp8's storage)

struct BertOptions {
  // Masked tokens per decoder call (0: all at once, or ceil(masked / M) under MST). The logits
  // workspace is chunk x vocab floats (2432 masked tokens x 30528 = 297 MB in one piece);
  // chunking bounds it. The result does not depend on the chunking beyond float rounding.
  // An explicit value wins over the one MST derives.
  int64_t mlm_chunk_rows = 0;
  // Mini-sequence Transformer (MST, Luo et al. 2024): M >= 1 chunks of token rows for the MLP
  // and of masked tokens for the MLM decoder. M > 1 means the MLP intermediate is never kept:
  // the forward runs dense-GELU-dense per chunk of ceil(rows / M) rows, the backward recomputes
  // each chunk's intermediate before taking its gradient, so at most one chunk's [chunk, 4H]
  // intermediate exists at any time. 0 = auto: the smallest M in 1, 2, 4, .., 64 whose arena
  // fits activation_budget_bytes for the batch at hand (64 if none does).
  int64_t mst_chunks = 1;
  size_t activation_budget_bytes = 0;  // for mst_chunks = 0
  // How recompute combines with M: mlp with M = 1 recomputes the MLP intermediate in one
  // chunk of all rows (M > 1 implies mlp); layer keeps only the layer inputs and recomputes
  // each layer, whose MLP then runs in M chunks (M = 1: the layer's intermediate lives, once,
  // in the one set of layer buffers).
  Recompute recompute = Recompute::none;
  // How a step computes, not what the model is: the weights, the checkpoint and the loss are
  // those of the fp32 model whatever the precision (a checkpoint written in one precision
  // resumes in another), which is why this is an option of the run and not of BertConfig.
  // bf16 / fp16: activations (hidden states, QKV, attention context, MLP, the heads' token
  // buffers and every activation gradient) are stored in that type, the GEMMs read a copy of
  // the weight matrices and embedding tables in that type (ModelWeights::lowp(), refreshed by LAMB
  // in its update pass), biases and LayerNorm parameters are read in fp32. The arena shrinks
  // accordingly.
  Precision precision = Precision::fp32;
  Fp8Recipe fp8;  // precision fp8's recipe
  CudaGraphs cuda_graphs = CudaGraphs::off;
};

}  // namespace packbert
