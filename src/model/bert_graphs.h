// How Bert's ops reach the device under BertOptions::cuda_graphs: the capacities batches are
// laid into, and the recorded graphs (GraphCache) of the layers, the heads, the whole
// micro-step and the backward that holds a gradient round. Bert asks once per forward which
// parts run as graphs (Graphed) and hands each part's ops to layer() / heads() / whole();
// everything a recorded graph depends on is in its key. docs/performance.md (CUDA graphs) says
// what each mode records and why.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/graph_cache.h"
#include "model/batch.h"
#include "model/option_enums.h"

namespace packbert {

// CudaGraphs (off, segmented, full) and its names: model/option_enums.h.

// Everything the host arguments of a part's recorded ops depend on.
struct GraphKey {
  static constexpr int64_t kWhole = -1;  // part: a whole micro-step (CudaGraphs::full)
  static constexpr int64_t kHeads = -2;  // part: the heads alone (segmented)
  bool backward = false;
  int64_t part = 0;             // an encoder layer, kWhole or kHeads
  const void* batch = nullptr;  // the batch buffer and the arena
  const void* arena = nullptr;
  // The laid batch: rows, slots and the attention bound (a layer reads no masked token, so
  // its keys leave the masked count, the heads' plan, slot and scaling out).
  int64_t rows = 0, seqs = 0, masked = 0, max_len = 0;
  int64_t mlp_chunk_rows = 0, mlm_chunk_rows = 0;  // the plan's (ActivationPlan)
  const void* sums = nullptr;                      // the metric slot the heads write
  int mlm_scale_exponent = 0;  // f16: the decoder's range scaling (cuda_losses.cpp)
  bool layer_recompute = false, gradients = false, dropout = false;
  uint64_t seed = 0;
  // Precision fp8: the FP8 operands' workspace, and whether the linear layers run in FP8 yet
  // (before the first scale update they run in bf16: other ops).
  const void* fp8_workspace = nullptr;
  bool fp8_warm = false;

  auto fields() const {
    return std::tie(backward, part, batch, arena, rows, seqs, masked, max_len, mlp_chunk_rows,
                    mlm_chunk_rows, sums, mlm_scale_exponent, layer_recompute, gradients, dropout,
                    seed, fp8_workspace, fp8_warm);
  }
  bool operator==(const GraphKey& o) const { return key_equal(*this, o); }
};

// Which parts of a forward (and its backward) run as graphs.
enum class Graphed {
  none,              // graphs off, or a backend that records none: every op runs
  layers,            // each encoder layer; the heads run op by op (their logits go to the host)
  layers_and_heads,  // each encoder layer, and the heads (both, with their gradients)
  whole,             // the whole forward in one graph, the whole backward in another
};

class BertGraphs {
 public:
  BertGraphs(Backend& backend, CudaGraphs mode, int64_t layers);

  // Whether batches are laid into capacities and layers recorded: the option, on a backend
  // that records graphs.
  bool on() const { return on_; }
  bool full() const { return full_; }  // CudaGraphs::full on such a backend
  // The parts a forward runs as graphs (segmented: layers and heads; full: whole); with a hook
  // reading the logits, the heads run op by op and the layers as segmented's.
  Graphed plan(bool logits_to_host) const;

  // The capacities batches are laid into so far (forwards with and without gradients keep a
  // bound each), for laid_shape (model/bert_memory.h); null when graphs are off.
  const GraphCapacity* bound(bool gradients) const {
    return on_ ? &capacity_[gradients ? 1 : 0] : nullptr;
  }
  // Raises the bound to hold shape; row_quantum > 0 sets GraphCapacity::row_quantum (the
  // batch's layout: 8 unpadded, its slot length padded or packed).
  void cover(const BatchShape& shape, bool gradients, int64_t row_quantum = 0);

  // The forward in flight: its parts' keys are `step` with backward / part set (begin), and
  // whether its backward is whole.
  void begin(const GraphKey& step, Graphed graphed);
  Graphed graphed() const { return graphed_; }
  // Each part's ops: run, recorded or replayed by its key; run as they are where that part is
  // not a graph of its own (graphs off, or inside a whole step's graph).
  void layer(bool backward, int64_t l, const std::function<void()>& ops);
  void heads(const std::function<void()>& ops);
  void whole(bool backward, const std::function<void()>& ops);
  // The whole backward holding a gradient round (collectives): one graph per combination of
  // every rank's keys (all_ranks), the same table on every rank. Returns false when some rank
  // cannot record (it runs no whole step: an empty micro-batch): the caller then runs the ops.
  // launched() follows each launch of such a graph.
  bool whole_round(
      int64_t tag, bool mine,
      const std::function<std::vector<int64_t>(const std::vector<int64_t>&)>& all_ranks,
      const std::function<void()>& ops, const std::function<void()>& launched);

 private:
  GraphKey key(bool backward, int64_t part) const;

  Backend& backend_;
  bool on_ = false, full_ = false;
  size_t layers_ = 1;
  GraphCapacity capacity_[2];  // without / with gradients
  GraphKey step_;
  Graphed graphed_ = Graphed::none;
  GraphCache<GraphKey> parts_;
  GraphCache<std::vector<int64_t>> rounds_;
};

}  // namespace packbert
