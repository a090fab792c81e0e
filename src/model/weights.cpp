#include "model/weights.h"

#include "kernels/base/error.h"

namespace packbert {

ModelWeights::ModelWeights(const ParamTable& table, Backend& backend, Precision precision,
                           const Tensor& params, const Tensor& grads, const Tensor& fp32_weights)
    : backend_(backend) {
  if (fp32_weights.defined()) {
    PB_REQUIRE(precision == Precision::bf16 || precision == Precision::fp16,
               "model: precision {} reads every weight in fp32 from the masters: they cannot be "
               "sharded (bf16 / fp16 only)",
               precision_name(precision));
    check_device("Bert", "fp32_weights", fp32_weights, backend.device());
    masters_ = bind_fp32_weights(table, fp32_weights);
  } else {
    check_device("Bert", "params", params, backend.device());
    masters_ = bind_weights(table, params);
    params_ = params;
  }
  read_ = masters_;
  if (precision != Precision::fp32) {
    // The GEMMs' weight copy: the whole table in the low-precision type (one conversion pass
    // and one LAMB pass over a flat buffer; the fp32 views of it are simply never read).
    lowp_memory_ = backend.alloc(precision_dtype(precision), {table.total()}, "16-bit weight copy");
    lowp_ = lowp_memory_.tensor();
    read_ = mixed_weights(table, masters_, lowp_);
    if (!params_.defined()) backend.zero(lowp_);  // until the replica loads it
    refresh_lowp();
  }
  fp32_ranges_ = fp32_read_ranges(table, precision != Precision::fp32);
  if (grads.defined()) {
    check_device("Bert", "grads", grads, backend.device());
    grads_ = bind_weights(table, grads);
    has_grads_ = true;
  }
  backward_groups_ = packbert::backward_groups(table);
  forward_groups_ = forward_ranges(table, backward_groups_);
}

void ModelWeights::refresh_lowp() {
  if (lowp_.defined() && params_.defined()) backend_.convert(lowp_, params_);
}

void ModelWeights::refresh_lowp_from(const Tensor& whole) {
  PB_REQUIRE(lowp_.defined(), "model: no 16-bit copy to refresh (precision fp32)");
  backend_.convert(lowp_, whole);
}

}  // namespace packbert
