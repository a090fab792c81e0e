// Model FLOPs of a training step and the device peaks they are measured against (MFU): what
// docs/performance.md#model-flops derives. Counted from the step's real sequence lengths, never
// from padding; a forward's multiply-adds count 2 FLOPs, the backward twice the forward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/option_enums.h"

namespace packbert {

struct StepShape {
  std::vector<int64_t> seq_lens;  // every sequence of the global batch, its real tokens
  int64_t masked_tokens = 0;      // of the global batch
};

struct StepFlops {
  double linears = 0, attention = 0, heads = 0;
  double total() const { return linears + attention + heads; }
};

// Forward and backward (3x the forward) of the encoder's linear layers, attention over the
// (query, key) pairs each layer computes (windows included), the MLM head over the masked
// tokens, the pooler and NSP head over the sequences when the model has them.
StepFlops step_flops(const BertConfig& config, const StepShape& step);

// A device's dense tensor-core peak, FLOP/s, for the precision in use, from a table of known
// GPUs by name (NVIDIA's datasheets; docs/performance.md lists them); 0 when the name is
// unknown or the device has no such peak (FP8 before Hopper).
double device_peak_flops(const std::string& device_name, Precision precision);

}  // namespace packbert
