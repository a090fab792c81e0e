#include "model/options.h"

#include "kernels/base/error.h"

namespace packbert {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}

Precision parse_precision(const std::string& s) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16, Precision::fp8})
    if (s == precision_name(p)) return p;
  PB_THROW("model: precision '{}' is not one of fp32, bf16, fp16, fp8", s);
}

DType precision_dtype(Precision p) {
  return p == Precision::bf16 || p == Precision::fp8 ? DType::bf16
         : p == Precision::fp16                      ? DType::f16
                                                     : DType::f32;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::mlp: return "mlp";
    case Recompute::layer: return "layer";
  }
  return "?";
}

}  // namespace packbert
