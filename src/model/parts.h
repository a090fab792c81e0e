// What the parts of a model share (model/embeddings.h, model/attention_block.h,
// model/mlp_block.h, model/heads.h): the backend and config, the weights the ops read and the
// gradients they add to, the encoder's linear layers, and the micro-batch in flight. Bert owns each
// of these and gives every part the same references; a part keeps no state of its own between
// calls, and owns its forward, its backward and the carve of its activations (its memory figure: a
// Carver with a null base measures it). docs/architecture.md shows how they compose.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/backend.h"
#include "kernels/base/error.h"
#include "model/activations.h"
#include "model/config.h"
#include "model/params.h"

namespace packbert {

class EncoderLinears;  // model/linears.h

struct ModelRefs {
  Backend& backend;
  const BertConfig& config;
  // What the ops read: the fp32 master weights, and under bf16 / fp16 / fp8 the 16-bit copy's
  // weight matrices and embedding tables instead (params.h mixed_weights).
  const BertWeights& weights;
  BertWeights& grads;  // += by the backward (no views in a model without gradients)
  StepActivations& act;
  EncoderLinears& linears;

  Dropout dropout(DropoutSite site, int64_t layer) const {
    return dropout_of(act, config, site, static_cast<uint32_t>(layer));
  }
  bool pre_norm() const { return config.norm == NormPlacement::pre; }
};

// The epilogue of a linear layer whose bias may be left out (BertConfig::bias).
inline Epilogue bias_epilogue(const Tensor& bias) {
  return bias.defined() ? Epilogue::bias : Epilogue::none;
}

// Rows [first, first + n) of a row-major tensor.
inline Tensor rows_of(const Tensor& t, int64_t first, int64_t n) {
  Tensor r = t;
  r.data = static_cast<char*>(t.data) + first * (t.bytes() / t.dim(0));
  r.shape[0] = n;
  return r;
}

// The elements of t from element `first` on, with a row-major shape (a second tensor in the same
// scratch).
inline Tensor after(const Tensor& t, int64_t first, std::initializer_list<int64_t> dims) {
  Tensor r(static_cast<char*>(t.data) + first * static_cast<int64_t>(dtype_size(t.dtype)), t.dtype,
           dims, t.device);
  PB_CHECK(first + r.numel() <= t.numel(), "view of {} elements from {} of {}", r.numel(), first,
           t.str());
  return r;
}

// The same memory with another row-major shape (the backward's shared scratch).
inline Tensor reshaped(const Tensor& t, std::initializer_list<int64_t> dims) {
  Tensor r(t.data, t.dtype, dims, t.device);
  PB_CHECK(r.numel() <= t.numel(), "reshape of {} to {} elements", t.str(), r.numel());
  return r;
}

}  // namespace packbert
