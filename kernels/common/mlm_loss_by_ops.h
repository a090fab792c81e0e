// The MLM decoder and loss of one chunk as a composition of a backend's own ops (the contract of
// Backend::mlm_loss): logits = x w^T + b into logits_ws, softmax cross-entropy (its gradient in
// place when dx is given), then the decoder's backward.
// Both backends' mlm_loss on fp32 tensors (the checks are mlm_loss_args, kernels/ops/losses.h).
#pragma once

#include "kernels/backend.h"

namespace packbert::checks {

inline void mlm_loss_by_ops(Backend& be, const OpArgs& a, const Tensor& x, const Tensor& w,
                            const Tensor& b, const Tensor& labels, const GradScale& grad_scale,
                            const Tensor& logits_ws, const Tensor& loss_sum,
                            const Tensor& num_correct, const Tensor& dx, const Tensor& dw,
                            const Tensor& db) {
  mlm_loss_args(a, x, w, logits_ws, dx, dw, db);
  be.linear_forward(x, w, b, Epilogue::bias, logits_ws, Tensor());
  be.softmax_cross_entropy(logits_ws, labels, grad_scale, loss_sum, num_correct,
                           dx.defined() ? logits_ws : Tensor());
  if (dx.defined()) be.linear_backward(x, w, logits_ws, dx, dw, db, {});
}

}  // namespace packbert::checks
