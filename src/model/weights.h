// The weights a model's ops read and the gradients they add to, as views of the flat buffers
// (model/params.h): the fp32 master weights, the 16-bit copy the GEMMs read under bf16 / fp16 /
// fp8 (owned here, the backend's memory), and the groups of the table that the optimizer and
// the gradient reducer work by.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/options.h"
#include "model/params.h"

namespace packbert {

using FlatRanges = std::vector<std::pair<int64_t, int64_t>>;

class ModelWeights {
 public:
  // params, grads: f32 [table.total()] on the backend's device, owned by the caller (grads may
  // be none: a model without gradients). fp32_weights (optional, bf16 / fp16 only): the fp32
  // values the ops read in a compact buffer of their own (params.h bind_fp32_weights), params
  // then none: a rank of a sharded optimizer that keeps only its shard of the masters.
  ModelWeights(const ParamTable& table, Backend& backend, Precision precision, const Tensor& params,
               const Tensor& grads, const Tensor& fp32_weights);

  const BertWeights& masters() const { return masters_; }  // fp32
  // What the ops read: masters() with every weight matrix and embedding table a view of lowp()
  // under bf16 / fp16 / fp8 (biases and LayerNorm parameters stay fp32).
  const BertWeights& read() const { return read_; }
  BertWeights& grads() { return grads_; }
  bool has_grads() const { return has_grads_; }

  // The 16-bit copy the GEMMs read (bf16 / f16 [table.total()]; none for fp32). Lamb::step
  // rewrites it from the masters in its update pass; whoever changes the masters any other way
  // refreshes it (Bert::refresh_lowp_params).
  const Tensor& lowp() const { return lowp_; }
  void refresh_lowp();
  // From `whole`, f32 [table.total()] laid out as the masters (a model without them).
  void refresh_lowp_from(const Tensor& whole);

  // The parts [begin, end) of the flat master weights that the ops read in fp32, ascending and
  // merged where adjacent: the whole buffer under fp32; under bf16 / fp16 the biases and
  // LayerNorm parameters. A sharded optimizer keeps these current on every rank, and the
  // 16-bit copy of everything (optim/distributed_lamb.h).
  const FlatRanges& fp32_ranges() const { return fp32_ranges_; }
  // The parameters by the part of a forward that first reads them, in forward order: [0] the
  // embeddings, [1 + l] encoder layer l, [L + 1] the pooler and heads; each the range [begin,
  // end) of the flat buffer its tensors span (the table is laid out in this order: params.h).
  const FlatRanges& forward_groups() const { return forward_groups_; }
  // Tensor index ranges [first, last) in the order a backward finishes them: heads, layer
  // L-1 .. layer 0, embeddings (params.h backward_groups).
  const std::vector<std::pair<int, int>>& backward_groups() const { return backward_groups_; }

 private:
  Backend& backend_;
  BertWeights masters_, read_, grads_;
  bool has_grads_ = false;
  Tensor params_;  // the masters, for refresh_lowp()
  Tensor lowp_;
  BackendBuffer lowp_memory_;
  FlatRanges fp32_ranges_, forward_groups_;
  std::vector<std::pair<int, int>> backward_groups_;
};

}  // namespace packbert
