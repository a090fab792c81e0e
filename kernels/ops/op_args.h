// The argument checks of the op contracts (kernels/ops/<family>.h, each op's *_args function in
// packbert::checks beside its contract), shared by every backend: dtypes, extents, which
// optional tensors go together, aliasing. A backend passes an OpArgs that knows its device (and
// any check of its own, such as the CUDA backend's pointer check), so both backends reject the
// same calls with the same messages. Contents (indices, layouts) are checked by
// kernels/common/op_checks.h.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"

namespace packbert::checks {

class OpArgs {
 public:
  using Extra = std::function<void(const char* op, const char* name, const Tensor& t)>;
  OpArgs(const char* op, Device device, Extra extra = {})
      : op(op), device_(device), extra_(std::move(extra)) {}

  // A required tensor with this dtype and dims (kAnyDim = any) on the backend's device.
  void operator()(const char* name, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> dims) const {
    check_tensor(op, name, t, dtype, dims);
    check_device(op, name, t, device_);
    if (extra_) extra_(op, name, t);
  }
  // The same when t is defined; a "none" view passes.
  void optional(const char* name, const Tensor& t, DType dtype,
                std::initializer_list<int64_t> dims) const {
    if (t.defined()) (*this)(name, t, dtype, dims);
  }

  const char* op;

 private:
  Device device_;
  Extra extra_;
};

// The extents of a token-wise op: rows and hidden size.
struct RowDims {
  int64_t rows = 0, h = 0;
};

}  // namespace packbert::checks
