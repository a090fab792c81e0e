// CudaBackend's attention: the CPU backend's checks, then the grouped launch of the fp32 kernels
// (attention_kernels.cu) or the tensor-core ones (fmha_mma_forward.cu, fmha_mma_backward.cu).
#include "kernels/common/op_checks.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/fmha_host.h"
#include "kernels/ops/attention.h"

namespace packbert {

// ---- attention -------------------------------------------------------------------------------
namespace {
struct AttnShape {
  int64_t rows, hidden, heads, head_dim;
};

AttnShape attention_shape(const char* op, const SeqLayout& layout, const Tensor& qkv,
                          int num_heads) {
  check_tensor(op, "qkv", qkv, DType::f32, {layout.rows, kAnyDim});
  const int64_t ld = qkv.dim(1), hidden = checks::qkv_hidden(op, ld, num_heads);
  const int64_t d = hidden / num_heads;
  PB_REQUIRE(d >= 1 && d <= cuda::kAttentionMaxHeadDim,
             "{}: head dim {} is not supported by the CUDA fp32 attention yet (1..{})", op, d,
             cuda::kAttentionMaxHeadDim);
  PB_REQUIRE(num_heads <= 65535, "{}: {} heads exceed the grid", op, num_heads);
  const int64_t blocks = int64_t{layout.num_seqs} * ((layout.max_len + 15) / 16);
  PB_REQUIRE(blocks <= 0x7fffffff, "{}: {} blocks exceed the grid", op, blocks);
  return AttnShape{layout.rows, hidden, num_heads, d};
}

// rows, hidden and heads of qkv for the kernel family that runs it (fp32 or tensor-core).
AttnShape attention_dims(const char* op, const SeqLayout& layout, const Tensor& qkv, int num_heads,
                         bool fp32) {
  if (fp32) return attention_shape(op, layout, qkv, num_heads);
  const cuda::FmhaShape a = cuda::fmha_attention_shape(op, layout, qkv, num_heads);
  return AttnShape{a.rows, a.hidden, a.heads, a.hidden / a.heads};
}
}  // namespace

DropoutStream CudaBackend::dropout_stream(const char* op, const Dropout& d, int64_t elements,
                                          int64_t heads, int64_t max_position) {
  if (d.p > 0.f) expect_optional(op, "dropout.device_step", d.device_step, DType::i32, {1});
  return checks::checked_dropout_stream(op, d, elements, heads, max_position);
}

FmhaPlan CudaBackend::attention_plan(const SeqLayout& layout, const AttnLaunch& launch) {
  return layout.fixed_launch ? plan_fmha_fixed(layout.num_seqs, layout.max_len)
                             : plan_fmha(launch.lens.data(), layout.num_seqs);
}

CudaBackend::AttnLaunch CudaBackend::attention_launch(const char* op, const SeqLayout& layout,
                                                      int64_t rows, int64_t heads,
                                                      const Dropout& dropout) {
  begin(op);
  AttnLaunch a;
  {
    // The layout's arrays come to the host once, in fmha_host_lengths: the grouped launch
    // needs the lengths, and validation reads the same copy.
    const cuda::ScopedClear once(options_.validate_indices);
    a.dl = device_layout(op, layout, rows);
  }
  // A fixed launch needs no lengths; validation still reads and checks them.
  if (!layout.fixed_launch || options_.validate_indices)
    a.lens = cuda::fmha_host_lengths(op, layout, options_.validate_indices, stream_);
  a.ds = dropout_stream(op, dropout, layout.max_len, heads, layout.max_len);
  return a;
}

// Dispatch (the contract's "lowp: qkv, out[, dout, dqkv]"; lse is always f32):
// - every float tensor f32: the fp32 kernels (attention_kernels.cu);
// - qkv, out (and dout, dqkv) all in one 16-bit dtype, 16-byte aligned, with head dim 64: the
//   tensor-core kernels (fmha_mma_forward.cu, fmha_mma_backward.cu), same lse layout;
// - any other combination the contract allows (each tensor on its own, another head dim, an
//   unaligned view): widened through the low-precision adapter onto the fp32 kernels.
// Both kernel families run through the grouped launch: the sequences sorted into length
// buckets (common/fmha_work_list.h), one grid per bucket on fmha_'s streams, joined before return.
// The window reaches the kernels as its half-width (checks::attention_half_window), with which
// each block walks only the tiles its rows' windows touch; the grid stays the same.
void CudaBackend::attention_forward(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                                    int64_t window, const Dropout& dropout, const Tensor& out,
                                    const Tensor& lse) {
  const trace::Range range("attention_forward");
  const char* op = "attention_forward";
  const int half = checks::attention_half_window(op, window, layout.max_len);
  const bool fp32 = !lowp::any({&qkv, &out, &lse});
  const bool native = !fp32 && cuda::fmha_native(qkv, num_heads, {&out});
  if (!fp32 && !native)
    return lowp::attention_forward(*this, lowp_, layout, qkv, num_heads, window, dropout, out, lse);
  const AttnShape shape = attention_dims(op, layout, qkv, num_heads, fp32);
  const int64_t rows = shape.rows, hidden = shape.hidden, heads = shape.heads;
  expect(op, "qkv", qkv, qkv.dtype, {rows, 3 * hidden});
  expect(op, "out", out, qkv.dtype, {rows, hidden});
  expect(op, "lse", lse, DType::f32, {rows, heads});
  const AttnLaunch launch = attention_launch(op, layout, rows, heads, dropout);
  const cuda::DeviceLayout& dl = launch.dl;
  const DropoutStream& ds = launch.ds;
  if (rows == 0) return end(op);
  launched(op, "fmha_zero_padding_rows",
           cuda::fmha_zero_padding_rows(dl, out.data, hidden, native ? 2 : 4, stream_));
  launched(op, "fmha_zero_padding_rows",
           cuda::fmha_zero_padding_rows(dl, lse.data, heads, 4, stream_));
  const FmhaPlan plan = attention_plan(layout, launch);
  cuda::fmha_check_grid(op, plan, native ? cuda::kFmhaTile : cuda::kAttentionF32Tile);
  if (!plan.buckets.empty()) {
    const cuda::FmhaType type = cuda::fmha_type(qkv.dtype);
    fmha_->run(op, plan, stream_, [&](const cuda::AttnWork& w, cudaStream_t s) {
      return native ? cuda::fmha_forward_work(type, dl, w, qkv.data, hidden, num_heads, half, ds,
                                              out.data, lse.ptr<float>(), s)
                    : cuda::attention_forward_work(dl, w, qkv.ptr<float>(), hidden, num_heads, half,
                                                   ds, out.ptr<float>(), lse.ptr<float>(), s);
    });
  }
  end(op);
}

void CudaBackend::attention_backward(const SeqLayout& layout, const Tensor& qkv, const Tensor& out,
                                     const Tensor& lse, const Tensor& dout, int num_heads,
                                     int64_t window, const Dropout& dropout, const Tensor& dqkv) {
  const trace::Range range("attention_backward");
  const char* op = "attention_backward";
  const int half = checks::attention_half_window(op, window, layout.max_len);
  const bool fp32 = !lowp::any({&qkv, &out, &lse, &dout, &dqkv});
  const bool native = !fp32 && cuda::fmha_native(qkv, num_heads, {&out, &dout, &dqkv});
  if (!fp32 && !native)
    return lowp::attention_backward(*this, lowp_, layout, qkv, out, lse, dout, num_heads, window,
                                    dropout, dqkv);
  const AttnShape shape = attention_dims(op, layout, qkv, num_heads, fp32);
  const int64_t rows = shape.rows, hidden = shape.hidden, heads = shape.heads;
  expect(op, "qkv", qkv, qkv.dtype, {rows, 3 * hidden});
  expect(op, "out", out, qkv.dtype, {rows, hidden});
  expect(op, "lse", lse, DType::f32, {rows, heads});
  expect(op, "dout", dout, qkv.dtype, {rows, hidden});
  expect(op, "dqkv", dqkv, qkv.dtype, {rows, 3 * hidden});
  const AttnLaunch launch = attention_launch(op, layout, rows, heads, dropout);
  const cuda::DeviceLayout& dl = launch.dl;
  const DropoutStream& ds = launch.ds;
  if (rows == 0) return end(op);
  launched(op, "fmha_zero_padding_rows",
           cuda::fmha_zero_padding_rows(dl, dqkv.data, 3 * hidden, native ? 2 : 4, stream_));
  const FmhaPlan plan = attention_plan(layout, launch);
  cuda::fmha_check_grid(op, plan, native ? cuda::kFmhaTile : cuda::kAttentionF32Tile);
  if (!plan.buckets.empty()) {
    const cuda::FmhaType type = cuda::fmha_type(qkv.dtype);
    float* delta =
        native ? fmha_->workspace(op, static_cast<size_t>(rows * heads), stream_) : nullptr;
    fmha_->run(op, plan, stream_, [&](const cuda::AttnWork& w, cudaStream_t s) {
      return native ? cuda::fmha_backward_work(type, dl, w, qkv.data, out.data, lse.ptr<float>(),
                                               dout.data, hidden, num_heads, half, ds, delta,
                                               dqkv.data, s)
                    : cuda::attention_backward_work(dl, w, qkv.ptr<float>(), out.ptr<float>(),
                                                    lse.ptr<float>(), dout.ptr<float>(), hidden,
                                                    num_heads, half, ds, dqkv.ptr<float>(), s);
    });
  }
  end(op);
}

}  // namespace packbert
