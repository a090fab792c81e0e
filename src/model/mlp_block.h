// The MLP block of an encoder layer, post-LN (BERT's):
//   y = LN(h1 + dropout(gelu(h1 W1^T + b1) W2^T + b2))
// with h1 the attention block's output and y = hidden[l + 1]; pre-LN (ModernBERT's), with s'
// the stream after the attention: s'' = s' + dropout(mlp(h1)), y = LN_next(s''), LN_next the
// next layer's attention norm or the final norm. Under mini-sequences
// (ActivationPlan::mlp_chunk_rows > 0, docs/mst_memory.md) the dense-GELU-dense runs over
// chunks of rows through one chunk's buffers (MlpScratch), keeping nothing of the [rows, I]
// intermediate; the backward recomputes each chunk (the same ops on the same rows, so the same
// values) before taking its gradient.
#pragma once

#include <cstdint>

#include "model/activations.h"
#include "model/parts.h"

namespace packbert {

class MlpBlock {
 public:
  explicit MlpBlock(const ModelRefs& m) : m_(m) {}

  // layers[l].attention.h1 -> hidden[l + 1].
  void forward(int64_t l);
  // dy = dL/d(hidden[l + 1]) -> dL/dh1, in place in dy (the residual share, then the MLP's
  // added); the block's parameter gradients +=. Uses the encoder scratch's dtmp and dwide.
  void backward(int64_t l, const Tensor& dy);

  // What a layer's backward reads (saved per layer) and the chunk buffers every layer shares.
  static void carve(Carver& carver, const BertConfig& config, const BatchShape& shape,
                    const ActivationPlan& plan, MlpSaved& saved);
  static void carve_scratch(Carver& carver, const BertConfig& config, const BatchShape& shape,
                            const ActivationPlan& plan, MlpScratch& scratch);
  // Rows per chunk (0: not chunked).
  static int64_t chunk_rows(const BatchShape& shape, const ActivationPlan& plan);

 private:
  // gelu(h1 W1^T + b1) W2^T (or the gated act(.) W2^T) into saved.ln_in, at once or chunk by
  // chunk.
  void dense_forward(int64_t l);
  // act [n, I] and pre [n, I'] of the rows x [n, H] starting at row `first` (FP8's scaling
  // state keys its rows by it).
  void inner_forward(int64_t l, int64_t first, const Tensor& x, const Tensor& pre,
                     const Tensor& act);
  // dout [n, H] -> dpre [n, I'] through W2 and the activation; dW2 +=. dact [n, I]: the gated
  // MLP's scratch for d(act) (none otherwise: the GELU's derivative is fused into W2's dx).
  void outer_backward(int64_t l, int64_t first, const Tensor& act, const Tensor& pre,
                      const Tensor& dout, const Tensor& dact, const Tensor& dpre);
  // dout = d(FFN out) -> dh1 += (add) or = ; dW1, db1, dW2 +=.
  void dense_backward(int64_t l, const Tensor& dout, const Tensor& dh1, bool add);
  ModelRefs m_;
};

}  // namespace packbert
