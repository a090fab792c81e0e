#include "model/bert_graphs.h"

#include <algorithm>
#include <string>

#include "kernels/base/error.h"

namespace packbert {

namespace {
// The graphs kept: this many batch shapes' worth of both directions of every layer (a whole
// step's graph counts as every layer), more than the capacities a run's batches fall into.
constexpr size_t kGraphShapes = 32;
}  // namespace

const char* cuda_graphs_name(CudaGraphs g) {
  switch (g) {
    case CudaGraphs::off: return "off";
    case CudaGraphs::segmented: return "segmented";
    case CudaGraphs::full: return "full";
  }
  return "?";
}

CudaGraphs parse_cuda_graphs(const std::string& s) {
  for (CudaGraphs g : {CudaGraphs::off, CudaGraphs::segmented, CudaGraphs::full})
    if (s == cuda_graphs_name(g)) return g;
  PB_THROW("model: cuda_graphs '{}' is not one of off, segmented, full", s);
}

BertGraphs::BertGraphs(Backend& backend, CudaGraphs mode, int64_t layers)
    : backend_(backend),
      on_(mode != CudaGraphs::off && backend.supports_graphs()),
      full_(mode == CudaGraphs::full && backend.supports_graphs()),
      layers_(static_cast<size_t>(std::max<int64_t>(1, layers))),
      parts_(backend, kGraphShapes * 2 * layers_),
      rounds_(backend, kGraphShapes) {}

Graphed BertGraphs::plan(bool logits_to_host) const {
  if (!on_) return Graphed::none;
  if (logits_to_host) return Graphed::layers;
  return full_ ? Graphed::whole : Graphed::layers_and_heads;
}

void BertGraphs::cover(const BatchShape& shape, bool gradients, int64_t row_quantum) {
  if (!on_) return;
  GraphCapacity& c = capacity_[gradients ? 1 : 0];
  c.cover(shape);
  if (row_quantum > 0) c.row_quantum = row_quantum;
}

void BertGraphs::begin(const GraphKey& step, Graphed graphed) {
  step_ = step;
  graphed_ = graphed;
}

GraphKey BertGraphs::key(bool backward, int64_t part) const {
  GraphKey k = step_;
  k.backward = backward;
  k.part = part;
  if (part >= 0) {  // a layer reads nothing of the heads
    k.masked = 0;
    k.mlm_chunk_rows = 0;
    k.sums = nullptr;
    k.mlm_scale_exponent = 0;
  }
  return k;
}

void BertGraphs::layer(bool backward, int64_t l, const std::function<void()>& ops) {
  if (graphed_ == Graphed::none || graphed_ == Graphed::whole) return ops();
  parts_.run(key(backward, l), ops);
}

void BertGraphs::heads(const std::function<void()>& ops) {
  if (graphed_ != Graphed::layers_and_heads) return ops();
  parts_.run(key(false, GraphKey::kHeads), ops);
}

void BertGraphs::whole(bool backward, const std::function<void()>& ops) {
  if (graphed_ != Graphed::whole) return ops();
  parts_.run(key(backward, GraphKey::kWhole), ops, layers_);
}

bool BertGraphs::whole_round(
    int64_t tag, bool mine,
    const std::function<std::vector<int64_t>(const std::vector<int64_t>&)>& all_ranks,
    const std::function<void()>& ops, const std::function<void()>& launched) {
  // This rank's words: whether it can graph the backward, the round's tag and the graph's key;
  // every rank's, in rank order.
  std::vector<int64_t> local = {mine ? 1 : 0, tag};
  const std::vector<int64_t> words = key_words(key(true, GraphKey::kWhole));
  if (mine) {
    local.insert(local.end(), words.begin(), words.end());
  } else {
    local.resize(local.size() + words.size(), 0);
  }
  const std::vector<int64_t> all = all_ranks(local);
  for (size_t at = 0; at < all.size(); at += local.size())
    if (all[at] != 1) return false;
  // Every rank holds the same table, so the same entries go.
  if (rounds_.run(all, ops) != GraphCache<std::vector<int64_t>>::Use::ran) launched();
  return true;
}

}  // namespace packbert
