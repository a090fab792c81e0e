// The optimizer's ops: norms of flat buffers and the two passes of a LAMB step. Each op's
// contract is the comment above its entry in PACKBERT_LAMB_OPS (the list's form:
// kernels/ops/op_list.h), its argument check is in packbert::checks below. Backend::lamb_step
// (kernels/backend.h) runs the two passes back to back.
#pragma once

#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/common/update_rule.h"
#include "kernels/ops/op_args.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// One tensor of the flat parameter buffer as LAMB sees it (a row of an i64 [T, 3] tensor).
struct LambTensor {
  int64_t offset;  // first element in the flat buffers
  int64_t size;    // elements
  int64_t decay;   // 1: weight decay and trust ratio apply; 0: excluded (LayerNorm, biases)
};

struct LambConfig {
  UpdateRule rule = UpdateRule::lamb;
  float lr = 0.f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-6f;
  float weight_decay = 0.01f;
  float max_grad_norm = 1.0f;
  int64_t step = 1;  // 1-based, for bias correction
  // The gradients (and global_grad_norm) are those of a loss multiplied by this (fp16 loss
  // scaling): the op divides it out before clipping and the moments. 1: the plain step, bit for
  // bit; a power of two keeps the division exact.
  float grad_scale = 1.0f;
  // Optional: f32 [4] in the backend's memory holding lamb_step_scalars(*this) when the op is
  // issued, read when the op runs instead of lr, step and grad_scale, so that a CUDA graph of the
  // step recorded at one step replays with the rate, the bias corrections and the loss scale its
  // memory holds then (the optimizer writes them each step: Backend::write_floats).
  Tensor step_scalars;
};

// What lamb_update and lamb_apply take from the LambConfig fields that change from step to step:
// the rate, the bias corrections (1 - beta^step in double, rounded, on every backend) and the loss
// scale. LambConfig::step_scalars holds these four floats in this order.
struct LambStepScalars {
  float lr = 0.f;
  float bias_correction1 = 0.f;
  float bias_correction2 = 0.f;
  float grad_scale = 1.f;
};
LambStepScalars lamb_step_scalars(const LambConfig& c);

// The i64 [n, 3] view of a LAMB table (host memory, see lamb_step).
inline Tensor lamb_table(const LambTensor* rows, int64_t n) {
  return Tensor(const_cast<LambTensor*>(rows), DType::i64, {n, 3}, Device::cpu);
}

// ---- optimizer -------------------------------------------------------------------------------
#define PACKBERT_LAMB_OPS(OP)                                                                      \
  /* out f32 [1] = sqrt(sum x^2) of a flat f32 buffer, in a fixed reduction order (the same        \
     result for any thread count). */                                                              \
  OP(l2_norm, (const Tensor& x, const Tensor& out), (x, out))                                      \
  /* out f64 [1] = sum x^2 of a flat f32 buffer, the double l2_norm takes the root of, in the      \
     same fixed order: a rank's share of a global norm summed over ranks (the sharded              \
     optimizer), which then rounds as l2_norm's over the whole buffer does. */                     \
  OP(sum_squares, (const Tensor& x, const Tensor& out), (x, out))                                  \
  /* out f32 [1] = sqrt(sum[0]) rounded to f32, for sum f64 [1] on the device: the norm l2_norm    \
     gives from the sum sum_squares gives (bit for bit). The sharded optimizer's global norm from  \
     its ranks' sums, added on the device: no host round trip. */                                  \
  OP(norm_from_sum_squares, (const Tensor& sum, const Tensor& out), (sum, out))                    \
  /* One LAMB step (apex FusedLAMB: adam_w_mode, grad averaging, bias correction) over the flat    \
     f32 buffers params (fp32 master weights), grads, m, v, all [n], in two passes, so that a      \
     tensor cut between ranks (the sharded optimizer, optim/distributed_lamb.h) has the sums of    \
     its norms added over the ranks in between. table i64 [T, 3] of LambTensor rows, in HOST       \
     memory on every backend (it shapes the launch, as host_seq_len does attention's): a device    \
     backend derives its work list from it once and keeps that on the device while the rows and    \
     the weight decay stay the same, so a step reads nothing back and waits for nothing. Rows      \
     ascend by offset without overlap; elements outside every row are left alone.                  \
     global_grad_norm f32 [1] (the all-reduced gradient norm): gradients are divided by            \
     max(1, norm / max_grad_norm). Per tensor: u = m^/(sqrt(v^)+eps) + wd*w (wd only for decay     \
     tensors), w -= lr * (decay tensor and wd != 0 and both norms > 0 ? ||w||/||u|| : 1).          \
     A non-finite global_grad_norm / grad_scale skips the step on the device, with no read-back:   \
     params, m, v and params_lowp stay as they were (grads, sums and norms_ws are then             \
     unspecified).                                                                                 \
     config.rule picks the update (the moments, clipping, skipping and sums are LAMB's):           \
     adamw (torch.optim.AdamW, decoupled decay): u = m^/(sqrt(v^)+eps), then                       \
       w = w (1 - lr wd) - lr u;                                                                   \
     stable_adamw (optimi StableAdamW: Wortsman et al. 2023, "Stable and low-precision training    \
     for large-scale vision-language models", AdamW with Adafactor's update clipping): u as        \
       adamw, and per tensor lr_t = lr / max(1, RMS), RMS = sqrt(mean(g^2 / max(v^, eps^2))) over  \
       the clipped gradient g and v^ after this step, then w = w (1 - lr_t wd) - lr_t u.           \
     (wd: config.weight_decay on decay tensors, 0 on the others; optimi's decouple_lr is a         \
     weight_decay of wd / max_lr given by the caller.)                                             \
     lamb_update: m and v updated in place, grads overwritten with u (as apex does, saving a       \
     buffer), and sums f64 [T, 2] = (sum of w^2 before the step, sum of u^2) per row, each added   \
     in a fixed order within the row (l2_norm's blocks from the row's first element); for          \
     stable_adamw (sum of g^2 / max(v^, eps^2) in element order, the row's element count), so      \
     that a tensor cut between ranks sums its pieces' to the RMS of the whole. record              \
     (optional) i32 [3] keeps count (common/math.h, lamb_record_step): [0] skipped steps, [1]      \
     the current run of them (0 after a step that updated), [2] the longest run. */                \
  OP(lamb_update,                                                                                  \
     (const Tensor& table, const LambConfig& config, const Tensor& global_grad_norm,               \
      const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,                 \
      const Tensor& sums, const Tensor& record = Tensor()),                                        \
     (table, config, global_grad_norm, params, grads, m, v, sums, record))                         \
  /* lamb_apply: the norms of each row from its sums (the square root rounded to f32, as           \
     l2_norm), the trust ratio, and w -= step * u with u read from grads (the other rules: their   \
     step above, RMS = sqrt(sum / count) in double, rounded to f32). params_lowp (optional)        \
     bf16 / f16 [n]: the low-precision copy of the weights that mixed precision's GEMMs read,      \
     written in the same pass: round-to-nearest-even of each updated master weight (elements       \
     outside every row are left alone). Without it the op is the fp32 step, bit for bit.           \
     norms_ws (optional) f32 [2T] receives the square roots of every row's two sums: ||w||         \
     (before the step), then ||u|| (stable_adamw: sqrt of its term sum, then of its count). */     \
  OP(lamb_apply,                                                                                   \
     (const Tensor& table, const LambConfig& config, const Tensor& global_grad_norm,               \
      const Tensor& sums, const Tensor& params, const Tensor& grads,                               \
      const Tensor& params_lowp = Tensor(), const Tensor& norms_ws = Tensor()),                    \
     (table, config, global_grad_norm, sums, params, grads, params_lowp, norms_ws))

}  // namespace packbert

namespace packbert::checks {

// The LambConfig ranges lamb_update and lamb_apply take.
inline void check_lamb_config(const char* op, const LambConfig& cfg) {
  PB_REQUIRE(cfg.grad_scale > 0.f && cfg.grad_scale <= 3.0e38f,
             "{}: grad_scale {} must be positive and finite", op, cfg.grad_scale);
  PB_REQUIRE(cfg.rule == UpdateRule::lamb || cfg.rule == UpdateRule::adamw ||
                 cfg.rule == UpdateRule::stable_adamw,
             "{}: update rule {} is none of lamb (0), adamw (1), stable_adamw (2)", op,
             static_cast<int>(cfg.rule));
  PB_REQUIRE(cfg.step >= 1 && cfg.beta1 >= 0.f && cfg.beta1 < 1.f && cfg.beta2 >= 0.f &&
                 cfg.beta2 < 1.f && cfg.max_grad_norm > 0.f,
             "{}: step {} (from 1), beta1 {} and beta2 {} in [0, 1), max_grad_norm {} > 0", op,
             cfg.step, cfg.beta1, cfg.beta2, cfg.max_grad_norm);
}

// lamb_update / lamb_apply: table i64 [T, 3], the flat buffers [n], the sums f64 [T, 2]; the
// config's ranges (the table's contents are check_lamb_table's, where the table is on the host).
struct LambDims {
  int64_t num_tensors = 0, n = 0;
};

inline LambDims lamb_update_args(const OpArgs& a, const Tensor& table, const LambConfig& cfg,
                                 const Tensor& global_grad_norm, const Tensor& params,
                                 const Tensor& grads, const Tensor& m, const Tensor& v,
                                 const Tensor& sums, const Tensor& record = Tensor()) {
  // The table is host memory on every backend (lamb_update's contract).
  OpArgs(a.op, Device::cpu)("table", table, DType::i64, {kAnyDim, 3});
  const int64_t num_tensors = table.dim(0);
  a("params", params, DType::f32, {kAnyDim});
  const int64_t n = params.dim(0);
  a("grads", grads, DType::f32, {n});
  a("m", m, DType::f32, {n});
  a("v", v, DType::f32, {n});
  a("global_grad_norm", global_grad_norm, DType::f32, {1});
  a("sums", sums, DType::f64, {num_tensors, 2});
  a.optional("record", record, DType::i32, {3});
  check_lamb_config(a.op, cfg);
  a.optional("config.step_scalars", cfg.step_scalars, DType::f32, {4});
  return {num_tensors, n};
}

inline LambDims lamb_apply_args(const OpArgs& a, const Tensor& table, const LambConfig& cfg,
                                const Tensor& global_grad_norm, const Tensor& sums,
                                const Tensor& params, const Tensor& grads, const Tensor& norms_ws) {
  OpArgs(a.op, Device::cpu)("table", table, DType::i64, {kAnyDim, 3});
  const int64_t num_tensors = table.dim(0);
  a("params", params, DType::f32, {kAnyDim});
  const int64_t n = params.dim(0);
  a("grads", grads, DType::f32, {n});
  a("global_grad_norm", global_grad_norm, DType::f32, {1});
  a("sums", sums, DType::f64, {num_tensors, 2});
  a.optional("norms_ws", norms_ws, DType::f32, {2 * num_tensors});
  check_lamb_config(a.op, cfg);
  a.optional("config.step_scalars", cfg.step_scalars, DType::f32, {4});
  return {num_tensors, n};
}

}  // namespace packbert::checks
