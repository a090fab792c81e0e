// The heads' loss sums and correct counts of each forward, on the device: kWords 4-byte words a
// slot (f32 MLM and NSP loss sums, i32 MLM and NSP correct counts), slot 0 for a forward read at
// once, slots 1.. for deferred ones (ForwardOptions::defer_metrics), read together later with
// one wait. Model-owned memory outside the arena (the sums outlive their micro-batch).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace packbert {

struct ForwardResult {
  double loss = 0;          // this micro-batch's share of the step loss (model/bert.h)
  double mlm_loss_sum = 0;  // sum of the MLM token losses, unnormalised
  double nsp_loss_sum = 0;  // sum of the NSP losses, unnormalised
  int64_t mlm_correct = 0;  // masked tokens whose argmax is the label
  int64_t nsp_correct = 0;
  int64_t masked_tokens = 0;
  int64_t sequences = 0;
};

class MetricSlots {
 public:
  static constexpr int64_t kWords = 4;

  explicit MetricSlots(Backend& backend) : backend_(backend) {}

  // The slot the next forward writes: 0, or the next deferred one. May move the slots
  // (keeping their contents): take it before any other.
  Tensor next(bool deferred);
  Tensor slot(int64_t i);
  // Room for the slots of `deferred` deferred forwards (and slot 0) now, so that no forward
  // grows them; bytes_for: the bytes that holds (what Backend::alloc is asked).
  void reserve(int64_t deferred);
  static size_t bytes_for(int64_t deferred);
  size_t bytes() const { return slots_.bytes(); }
  // Word i of a slot as a one-element tensor of dtype.
  static Tensor word(const Tensor& slot, int64_t i, DType dtype);

  // r with the sums of `slot` read back now (one wait), and its loss from the global counts.
  ForwardResult read(const Tensor& slot, ForwardResult r, int64_t global_masked,
                     int64_t global_samples);
  // A deferred forward's host-side result; on_device: it wrote its slot (an empty batch has
  // none).
  void defer(const ForwardResult& r, int64_t global_masked, int64_t global_samples, bool on_device);
  // The device bytes of every deferred slot written (undefined when none), and the deferred
  // results from a host copy of them (null when none); the list is then empty again.
  Tensor deferred_sums() const;
  std::vector<ForwardResult> take_deferred(const void* sums);

 private:
  static constexpr int64_t kSlotBytes = 4 * kWords;
  Backend& backend_;
  BackendBuffer slots_;
  struct Deferred {
    ForwardResult result;
    int64_t global_masked = 0, global_samples = 0;
    bool on_device = false;
  };
  std::vector<Deferred> deferred_;
};

}  // namespace packbert
