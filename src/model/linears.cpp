#include "model/linears.h"

#include <algorithm>
#include <string>

#include "kernels/base/error.h"
#include "model/parts.h"

namespace packbert {

EncoderLinears::EncoderLinears(Backend& backend, const BertConfig& config, bool fp8,
                               const Fp8Recipe& recipe, const StepActivations& act)
    : backend_(backend), config_(config), recipe_(recipe), act_(act) {
  if (!fp8) return;
  const std::string unsupported = backend.fp8_unsupported();
  PB_REQUIRE(unsupported.empty(), "model: precision fp8: {}", unsupported);
  fp8_ = std::make_unique<Fp8State>(backend, config, recipe, 1, 0);
  stale_.assign(static_cast<size_t>(config.layers), 1);
}

void EncoderLinears::set_data_parallel(int ranks, int rank) {
  if (fp8_) fp8_ = std::make_unique<Fp8State>(backend_, config_, recipe_, ranks, rank);
  weights_changed();
}

void EncoderLinears::weights_changed() { std::fill(stale_.begin(), stale_.end(), 1); }

void EncoderLinears::end_step(const std::function<void(const Tensor&)>& sum_over_ranks) {
  if (!fp8_) return;
  fp8_->update(sum_over_ranks);
  weights_changed();
}

void EncoderLinears::cast_weights(int64_t l, const LayerWeights& weights) {
  if (!fp8_ || !fp8_->warm() || !stale_[static_cast<size_t>(l)]) return;
  fp8_->cast_weights(l, weights);
  stale_[static_cast<size_t>(l)] = 0;
}

// Forward: x cast to E4M3 (its amax recorded, padding rows zero and left out) and the FP8 GEMM
// with the weight's E4M3 copy. Backward: dout cast to E5M2 and its transpose; dx from dout and
// the weight's transposed copy; dW from dout^T and x^T, x cast again with the forward's scale
// (the same bytes: the scale changes only between steps), so no FP8 activation is kept; db
// from dout in bf16 (as the bf16 path). Before the first scale update (cold) the bf16 ops run
// and only the amaxes are recorded.
void EncoderLinears::forward(int64_t l, Fp8State::Linear j, int64_t first, const Tensor& x,
                             const Tensor& w, const Tensor& bias, Epilogue epilogue,
                             const Tensor& out, const Tensor& pre) {
  if (!fp8_) return backend_.linear_forward(x, w, bias, epilogue, out, pre);
  const Fp8State::Operand in = fp8_->input(l, j);
  const int64_t n = x.dim(0), k = x.dim(1);
  const Tensor mask = rows_of(act_.token_seq, first, n);
  if (!fp8_->warm()) {
    backend_.fp8_cast(x, mask, Tensor(), in.amax, Tensor(), Tensor());
    return backend_.linear_forward(x, w, bias, epilogue, out, pre);
  }
  const Tensor x8(fp8_->workspace(0).data, DType::e4m3, {n, k}, x.device);
  backend_.fp8_cast(x, mask, in.scale, in.amax, x8, Tensor());
  Fp8GemmOptions o;
  o.epilogue = epilogue;
  o.bias = bias;
  o.pre = pre;
  o.fast_accum = true;  // the forward only, as Transformer Engine (docs/fp8.md)
  backend_.fp8_gemm(x8, in.scale, fp8_->w8(l, j), fp8_->weight(l, j).scale, out, o);
}

void EncoderLinears::backward(int64_t l, Fp8State::Linear j, int64_t first, const Tensor& x,
                              const Tensor& w, const Tensor& dout, const Tensor& dx,
                              const Tensor& dw, const Tensor& db,
                              const LinearBackwardOptions& options) {
  if (!fp8_) return backend_.linear_backward(x, w, dout, dx, dw, db, options);
  const Fp8State::Operand g = fp8_->grad(l, j), in = fp8_->input(l, j);
  const int64_t n = dout.dim(0), m = dout.dim(1), k = w.dim(1);
  const Tensor mask = rows_of(act_.token_seq, first, n);
  if (!fp8_->warm()) {
    backend_.fp8_cast(dout, mask, Tensor(), g.amax, Tensor(), Tensor());
    return backend_.linear_backward(x, w, dout, dx, dw, db, options);
  }
  // The workspace: dout [n, m] | dout^T [m, n] | x^T [k, n], each 256-byte aligned.
  auto* base = static_cast<char*>(fp8_->workspace(0).data);
  const int64_t aligned = (n * m + 255) / 256 * 256;
  const Tensor dy8(base, DType::e5m2, {n, m}, dout.device);
  const Tensor dy8t(base + aligned, DType::e5m2, {m, n}, dout.device);
  const Tensor x8t(base + 2 * aligned, DType::e4m3, {k, n}, dout.device);
  backend_.fp8_cast(dout, mask, g.scale, g.amax, dy8, dy8t);
  if (db.defined())  // the bias gradient alone, from the bf16 dout
    backend_.linear_backward(Tensor(), w, dout, Tensor(), Tensor(), db, {});
  if (dx.defined()) {
    Fp8GemmOptions o;
    o.accumulate = options.dx_accumulate;
    o.dgelu_pre = options.x_gelu_pre;
    o.gelu = options.gelu;
    backend_.fp8_gemm(dy8, g.scale, fp8_->w8t(l, j), fp8_->weight(l, j).scale, dx, o);
  }
  if (dw.defined()) {
    backend_.fp8_cast(x, mask, in.scale, Tensor(), Tensor(), x8t);
    Fp8GemmOptions o;
    o.accumulate = true;
    backend_.fp8_gemm(dy8t, g.scale, x8t, in.scale, dw, o);
  }
}

}  // namespace packbert
