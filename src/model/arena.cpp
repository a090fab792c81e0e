#include "model/arena.h"

#include "kernels/base/error.h"

namespace packbert {

void Arena::reserve(size_t bytes) {
  // A little headroom so that batches a few tokens longer than the largest so far do not
  // reallocate every time.
  if (bytes > capacity_) reserve_exact(bytes + bytes / 16);
}

void Arena::reserve_exact(size_t bytes) {
  if (bytes <= capacity_) return;
  buffer_.reset();
  capacity_ = 0;
  // A multiple of the alignment (aligned_alloc's rule).
  const size_t want = (bytes + Carver::kAlign - 1) / Carver::kAlign * Carver::kAlign;
  try {
    buffer_ = backend_.alloc(want, "activation arena");
  } catch (const Error& e) {
    PB_THROW("arena: cannot allocate {:.1f} MiB of {} memory for activations: {}",
             static_cast<double>(want) / (1 << 20), device_name(device()), e.what());
  }
  capacity_ = want;
  ++allocations_;
}

const char* activation_kind_name(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::hidden: return "hidden";
    case ActivationKind::attention: return "attention";
    case ActivationKind::layernorm: return "layernorm";
    case ActivationKind::mlp: return "mlp";
    case ActivationKind::mlm_logits: return "mlm_logits";
    case ActivationKind::heads: return "heads";
    case ActivationKind::grad_scratch: return "grad_scratch";
    case ActivationKind::count: break;
  }
  return "?";
}

void Arena::note_use(size_t bytes, const ActivationBytes& by_kind) {
  PB_CHECK(bytes <= capacity_, "arena used {} bytes of {}", bytes, capacity_);
  last_use_ = bytes;
  last_by_kind_ = by_kind;
  if (bytes > high_water_) {
    high_water_ = bytes;
    high_water_by_kind_ = by_kind;
  }
}

Tensor Carver::take(ActivationKind kind, DType dtype, std::initializer_list<int64_t> dims) {
  const size_t before = used_;
  Tensor t = take(dtype, dims);
  by_kind_[static_cast<int>(kind)] += used_ - before;
  return t;
}

Tensor Carver::take(DType dtype, std::initializer_list<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  Tensor t(base_ ? base_ + used_ : nullptr, dtype, dims, device_);
  used_ += (bytes + kAlign - 1) / kAlign * kAlign;
  return t;
}

}  // namespace packbert
