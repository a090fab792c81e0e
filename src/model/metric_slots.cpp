#include "model/metric_slots.h"

#include <algorithm>
#include <cstring>

#include "kernels/base/error.h"

namespace packbert {

namespace {

// A slot's words (f32 loss sums, i32 correct counts) into a result, and the loss.
void set_metrics(ForwardResult& r, const uint8_t* words, int64_t global_masked,
                 int64_t global_samples) {
  float mlm_sum = 0.f, nsp_sum = 0.f;
  int32_t mlm_correct = 0, nsp_correct = 0;
  std::memcpy(&mlm_sum, words, 4);
  std::memcpy(&nsp_sum, words + 4, 4);
  std::memcpy(&mlm_correct, words + 8, 4);
  std::memcpy(&nsp_correct, words + 12, 4);
  r.mlm_loss_sum = mlm_sum;
  r.nsp_loss_sum = nsp_sum;
  r.mlm_correct = mlm_correct;
  r.nsp_correct = nsp_correct;
  r.loss =
      (global_masked > 0 ? r.mlm_loss_sum / global_masked : 0.0) + r.nsp_loss_sum / global_samples;
}

}  // namespace

Tensor MetricSlots::next(bool deferred) {
  return slot(deferred ? 1 + static_cast<int64_t>(deferred_.size()) : 0);
}

size_t MetricSlots::bytes_for(int64_t deferred) {
  return static_cast<size_t>(std::max<int64_t>(deferred + 1, 16) * kSlotBytes);
}

void MetricSlots::reserve(int64_t deferred) {
  if (bytes_for(deferred) <= slots_.bytes()) return;
  PB_CHECK(deferred_.empty(), "metric slots reserved with {} deferred forwards pending",
           deferred_.size());
  slots_.reset();
  slots_ = backend_.alloc(bytes_for(deferred), "metric slots");
}

Tensor MetricSlots::slot(int64_t i) {
  const auto have = static_cast<int64_t>(slots_.bytes()) / kSlotBytes;
  if (i >= have) {  // the first forward (or more micro-steps than ever before)
    BackendBuffer grown = backend_.alloc(
        static_cast<size_t>(std::max<int64_t>({i + 1, 2 * have, 16}) * kSlotBytes), "metric slots");
    if (have > 1)  // deferred slots in use
      backend_.copy(Tensor(grown.data(), DType::u8, {have * kSlotBytes}, backend_.device()),
                    slots_.tensor());
    slots_ = std::move(grown);
  }
  return Tensor(static_cast<char*>(slots_.data()) + i * kSlotBytes, DType::f32, {kWords},
                backend_.device());
}

Tensor MetricSlots::word(const Tensor& slot, int64_t i, DType dtype) {
  return Tensor(static_cast<char*>(slot.data) + 4 * i, dtype, {1}, slot.device);
}

ForwardResult MetricSlots::read(const Tensor& slot, ForwardResult r, int64_t global_masked,
                                int64_t global_samples) {
  uint8_t words[kSlotBytes];
  backend_.copy(view(words, {kSlotBytes}), Tensor(slot.data, DType::u8, {kSlotBytes}, slot.device));
  set_metrics(r, words, global_masked, global_samples);
  return r;
}

void MetricSlots::defer(const ForwardResult& r, int64_t global_masked, int64_t global_samples,
                        bool on_device) {
  deferred_.push_back({r, global_masked, global_samples, on_device});
}

Tensor MetricSlots::deferred_sums() const {
  // Slots 1 .. n, n the last deferred call that computed on the device (an empty batch's slot
  // holds nothing and may lie beyond the buffer).
  int64_t n = 0;
  for (size_t i = 0; i < deferred_.size(); ++i)
    if (deferred_[i].on_device) n = static_cast<int64_t>(i) + 1;
  if (n == 0) return Tensor();
  return Tensor(static_cast<char*>(slots_.data()) + kSlotBytes, DType::u8, {n * kSlotBytes},
                backend_.device());
}

std::vector<ForwardResult> MetricSlots::take_deferred(const void* sums) {
  std::vector<ForwardResult> out;
  const auto* host = static_cast<const uint8_t*>(sums);
  for (size_t i = 0; i < deferred_.size(); ++i) {
    const Deferred& d = deferred_[i];
    out.push_back(d.result);
    if (d.on_device) {
      PB_CHECK(host != nullptr, "model: deferred results without their sums");
      set_metrics(out.back(), host + static_cast<int64_t>(i) * kSlotBytes, d.global_masked,
                  d.global_samples);
    }
  }
  deferred_.clear();
  return out;
}

}  // namespace packbert
