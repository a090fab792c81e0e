// The activation arena: one allocation on the backend's device that holds every activation and
// backward buffer of a step (DESIGN.md, Memory). It is carved anew for each micro-batch and
// grows only when a batch needs more than any before it, so a warm step loop never allocates;
// its high-water mark is the activation memory a configuration needs (what MST is judged by).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/backend.h"
#include "kernels/base/tensor.h"

namespace packbert {

// What an arena buffer holds, for the activation-memory report (Bert::activation_report). The
// accounting is the carve itself, so it is the same on every device.
enum class ActivationKind : int {
  hidden,        // hidden states: each layer's input/output, the attention block output h1
  attention,     // QKV, attention context, softmax log-sum-exp
  layernorm,     // LayerNorm saves: residual-LN inputs, means, rstds
  mlp,           // MLP intermediate [rows or chunk, 4H]: pre-GELU, GELU, and its gradient
  mlm_logits,    // the MLM decoder's logits workspace [chunk, vocab]
  heads,         // MLM transform and NSP buffers (forward and gradient), loss scalars
  grad_scratch,  // backward scratch: hidden-state gradients, d(attention out), d(QKV)
  count
};
constexpr int kActivationKinds = static_cast<int>(ActivationKind::count);
// "hidden", "attention", "layernorm", "mlp", "mlm_logits", "heads", "grad_scratch".
const char* activation_kind_name(ActivationKind kind);
using ActivationBytes = std::array<size_t, kActivationKinds>;

class Arena {
 public:
  // Memory of the backend's device, through Backend::alloc.
  explicit Arena(Backend& backend) : backend_(backend) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Room for `bytes`; reallocates (contents are lost: they are per step) only when short.
  void reserve(size_t bytes);
  // Room for `bytes` rounded up to kAlign, without the headroom (a reserve for a known bound).
  void reserve_exact(size_t bytes);
  // Records that a step used `bytes` (<= capacity), split by kind (summing to bytes), for the
  // high-water mark and the report.
  void note_use(size_t bytes, const ActivationBytes& by_kind = {});

  void* data() const { return buffer_.data(); }
  Device device() const { return backend_.device(); }
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }
  size_t last_use() const { return last_use_; }
  const ActivationBytes& last_use_by_kind() const { return last_by_kind_; }
  const ActivationBytes& high_water_by_kind() const { return high_water_by_kind_; }
  int64_t allocations() const { return allocations_; }  // how often reserve() had to allocate

 private:
  Backend& backend_;
  BackendBuffer buffer_;
  size_t capacity_ = 0;
  size_t high_water_ = 0;
  size_t last_use_ = 0;
  ActivationBytes last_by_kind_{};
  ActivationBytes high_water_by_kind_{};  // of the step that set the high-water mark
  int64_t allocations_ = 0;
};

// Lays typed views out one after another from `base`, each aligned to kAlign bytes. With
// base == nullptr it only measures (the views are then "none"), so one function both sizes
// the arena and carves it -- the two can never disagree.
class Carver {
 public:
  static constexpr size_t kAlign = 256;  // cache lines on the CPU, 128-byte loads on the GPU

  Carver(void* base, Device device) : base_(static_cast<char*>(base)), device_(device) {}
  // The next buffer, charged to `kind` (its bytes rounded up to kAlign).
  Tensor take(ActivationKind kind, DType dtype, std::initializer_list<int64_t> dims);
  // The next buffer, charged to no kind: a carve outside the arena (the model's batch buffers).
  Tensor take(DType dtype, std::initializer_list<int64_t> dims);
  size_t used() const { return used_; }
  const ActivationBytes& used_by_kind() const { return by_kind_; }

 private:
  char* base_;
  Device device_;
  size_t used_ = 0;
  ActivationBytes by_kind_{};
};

}  // namespace packbert
