// What one rank of a train config holds in device memory, item by item, known before anything
// is allocated: `packbert plan`, and the check `packbert train` makes before it loads any data.
// The buffers the model and optimizer allocate (Backend::alloc) are exact: once the model is
// reserved, a run's device_allocated_bytes equals their sum to the byte (tests/e2e/
// check_plan.py). The backend's own memory (the cuBLASLt workspace, the ops' scratch, the CUDA
// context, NCCL) is an estimate and says so. The reasoning and the tables: docs/training.md,
// "Will it fit?".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/train_config.h"
#include "model/batch.h"

namespace packbert {

struct MemoryItem {
  std::string key;    // JSON name, e.g. "fp32_master_weights"
  std::string label;  // for people
  size_t bytes = 0;
  // true: a Backend::alloc buffer, exact to the byte; false: the backend's own memory or the
  // device's reserve, an estimate (the note says whence).
  bool exact = true;
  std::string note;
  int depth = 0;  // 1: a part of the item above (the arena's kinds), not added to the sums
};

// A device's memory: a GPU by name (known_gpus) or a byte count.
struct DeviceMemory {
  std::string name;
  size_t bytes = 0;
  std::string source;
};
// a100-40, a100-80, h100-80, h200-141, b200-180: what NVML (nvidia-smi) reports as their total.
const std::vector<DeviceMemory>& known_gpus();
// A name of known_gpus or a byte count ("85899345920", "80GiB", "80GB"); Error naming the
// known names otherwise.
DeviceMemory parse_device_memory(const std::string& text);

// This machine's memory for a run on `device`: cuda:0's total (none without a GPU), or the
// host's available RAM.
DeviceMemory this_machine_memory(Device device);

struct MemoryKnob {
  std::string key;         // the config key, e.g. "model.mst_chunks"
  std::string setting;     // its value in this variant
  size_t total = 0;        // the rank's total with it
  int64_t saves = 0;       // bytes below the config's own total (negative: costs)
  std::vector<bool> fits;  // on each target (MemoryPlan::verdicts)
};

// The plan against one device.
struct MemoryVerdict {
  DeviceMemory target;
  bool fits = false;
  int64_t spare = 0;            // target - total (negative: short)
  int64_t largest_samples = 0;  // samples of max_seq_len per micro-batch that fit
};

struct MemoryPlan {
  int ranks = 1;
  int rank = 0;  // the rank planned: the one that holds most
  Device device = Device::cpu;
  std::vector<MemoryItem> items;
  size_t buffers = 0;    // sum of the exact items: the run's device_allocated_bytes
  size_t estimated = 0;  // sum of the estimates
  size_t total() const { return buffers + estimated; }
  std::vector<MemoryVerdict> verdicts;  // one per target given
  bool fits() const {
    for (const MemoryVerdict& v : verdicts)
      if (!v.fits) return false;
    return true;
  }
  BatchShape micro_batch;    // the reserved micro-batch (largest_micro_batch), as laid out
  bool bound_strict = true;  // false: lpt balance, a batch may exceed it (the arena grows)
  int64_t mst_chunks = 1;
  std::vector<MemoryKnob> knobs;
};

// The plan of rank `rank` of `ranks` (-1: the rank that holds most) against each target, with
// the knobs when asked.
MemoryPlan plan_memory(const TrainConfig& c, int ranks, const std::vector<DeviceMemory>& targets,
                       bool knobs = true, int rank = -1);

// The table, the verdict, the largest micro-batch and the knobs, for people.
std::string format_memory_plan(const MemoryPlan& plan);
nlohmann::json memory_plan_json(const MemoryPlan& plan);

}  // namespace packbert
