// CudaBackend's token-wise layer ops (embedding, bias + dropout + residual + LayerNorm) and
// attention: the CPU backend's checks, then the kernels of layernorm_kernels.cu and
// attention_kernels.cu.
#include "common/op_args.h"
#include "common/op_checks.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/fmha_plan.h"

namespace packbert {

namespace {
void require_grid(const char* op, int64_t blocks) {
  PB_REQUIRE(blocks <= 0x7fffffff, "{}: {} blocks exceed the CUDA grid", op, blocks);
}
}  // namespace

void CudaBackend::embedding_forward(const SeqLayout& layout, const Tensor& input_ids,
                                    const Tensor& segment_ids, const EmbeddingParams& p,
                                    const Dropout& dropout, const Tensor& out,
                                    const Tensor& ln_mean, const Tensor& ln_rstd) {
  // No native low-precision kernel yet: the adapter (widen, fp32 kernel, round back).
  if (lowp::any({&p.word, &p.position, &p.token_type, &p.ln_gamma, &p.ln_beta, &out, &ln_mean,
                 &ln_rstd}))
    return lowp::embedding_forward(*this, lowp_, layout, input_ids, segment_ids, p, dropout, out,
                                   ln_mean, ln_rstd);
  const char* op = "embedding_forward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [rows, vocab, h] = checks::embedding_forward_args(args, layout, input_ids, segment_ids,
                                                               p, out, ln_mean, ln_rstd);
  require_grid(op, rows);
  begin(op);
  const cuda::DeviceLayout dl = device_layout(op, layout, rows);
  const DropoutStream ds = checks::checked_dropout_stream(op, dropout, h, 1, layout.max_len);
  if (options_.validate_indices && rows > 0) {
    const auto ids = to_host<int32_t>(op, input_ids);
    const auto segs = to_host<int32_t>(op, segment_ids);
    const auto pos = to_host<int32_t>(op, layout.token_pos);
    for (int64_t r = 0; r < rows; ++r)
      PB_REQUIRE(ids[r] >= 0 && ids[r] < vocab && segs[r] >= 0 && segs[r] < p.token_type.dim(0) &&
                     pos[r] < p.position.dim(0),
                 "{}: row {} has token id {} (vocab {}), segment {} (types {}), position {} "
                 "(positions {})",
                 op, r, ids[r], vocab, segs[r], p.token_type.dim(0), pos[r], p.position.dim(0));
  }
  if (rows == 0 || h == 0) return end(op);
  const cuda::EmbeddingPtrs ep{p.word.ptr<float>(),     p.position.ptr<float>(),
                               p.token_type.ptr<float>(), p.ln_gamma.ptr<float>(),
                               p.ln_beta.ptr<float>(),  input_ids.ptr<int32_t>(),
                               segment_ids.ptr<int32_t>()};
  launched(op, "embedding_forward",
           cuda::embedding_forward(dl, ep, h, ds, out.ptr<float>(), ln_mean.ptr<float>(),
                                   ln_rstd.ptr<float>(), stream_));
  end(op);
}

void CudaBackend::embedding_backward(const SeqLayout& layout, const Tensor& input_ids,
                                     const Tensor& segment_ids, const EmbeddingParams& p,
                                     const Dropout& dropout, const Tensor& ln_mean,
                                     const Tensor& ln_rstd, const Tensor& dout,
                                     const EmbeddingParams& grads) {
  // No native low-precision kernel yet: the adapter (widen, fp32 kernel, round back).
  if (lowp::any({&p.word, &p.position, &p.token_type, &p.ln_gamma, &p.ln_beta, &ln_mean,
                 &ln_rstd, &dout, &grads.word, &grads.position, &grads.token_type,
                 &grads.ln_gamma, &grads.ln_beta}))
    return lowp::embedding_backward(*this, lowp_, layout, input_ids, segment_ids, p, dropout,
                                    ln_mean, ln_rstd, dout, grads);
  const char* op = "embedding_backward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [rows, h] = checks::embedding_backward_args(args, layout, input_ids, segment_ids, p,
                                                        ln_mean, ln_rstd, dout, grads);
  require_grid(op, rows);
  PB_REQUIRE((rows + cuda::kColumnChunk - 1) / cuda::kColumnChunk <= 65535,
             "{}: {} rows exceed the column-sum grid", op, rows);
  begin(op);
  const cuda::DeviceLayout dl = device_layout(op, layout, rows);
  const DropoutStream ds = checks::checked_dropout_stream(op, dropout, h, 1, layout.max_len);
  // Ids were validated by the forward; backward trusts them (same buffers, same step).
  if (rows == 0 || h == 0) return end(op);
  const cuda::EmbeddingPtrs ep{p.word.ptr<float>(),       p.position.ptr<float>(),
                               p.token_type.ptr<float>(), p.ln_gamma.ptr<float>(),
                               nullptr,                   input_ids.ptr<int32_t>(),
                               segment_ids.ptr<int32_t>()};
  auto ptr = [](const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; };
  double* partial = scratch_doubles(op, 2 * static_cast<size_t>(cuda::column_sum_partials(rows, h)));
  launched(op, "embedding_backward",
           cuda::embedding_backward(dl, ep, h, ds, ln_mean.ptr<float>(), ln_rstd.ptr<float>(),
                                    dout.ptr<float>(), ptr(grads.word), ptr(grads.position),
                                    ptr(grads.token_type), ptr(grads.ln_gamma),
                                    ptr(grads.ln_beta), partial, stream_));
  end(op);
}

void CudaBackend::residual_layernorm_forward(const SeqLayout& layout, const Tensor& x,
                                             const Tensor& bias, const Tensor& residual,
                                             const LayerNormParams& ln, const Dropout& dropout,
                                             const Tensor& out, const Tensor& ln_in,
                                             const Tensor& ln_mean, const Tensor& ln_rstd) {
  // No native low-precision kernel yet: the adapter (widen, fp32 kernel, round back).
  if (lowp::any({&x, &bias, &residual, &ln.gamma, &ln.beta, &out, &ln_in, &ln_mean, &ln_rstd}))
    return lowp::residual_layernorm_forward(*this, lowp_, layout, x, bias, residual, ln, dropout,
                                            out, ln_in, ln_mean, ln_rstd);
  const char* op = "residual_layernorm_forward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [rows, h] = checks::residual_layernorm_forward_args(args, x, bias, residual, ln, out,
                                                                 ln_in, ln_mean, ln_rstd);
  require_grid(op, rows);
  begin(op);
  const DropoutStream ds = checks::checked_dropout_stream(op, dropout, h, 1, layout.max_len);
  cuda::DeviceLayout dl;
  dl.rows = rows;
  if (dropout_enabled(ds)) dl = device_layout(op, layout, rows);
  if (rows == 0 || h == 0) return end(op);
  launched(op, "residual_layernorm_forward",
           cuda::residual_layernorm_forward(
               dl, x.ptr<float>(), bias.defined() ? bias.ptr<float>() : nullptr,
               residual.defined() ? residual.ptr<float>() : nullptr, ln.gamma.ptr<float>(),
               ln.beta.ptr<float>(), ds, rows, h, out.ptr<float>(), ln_in.ptr<float>(),
               ln_mean.ptr<float>(), ln_rstd.ptr<float>(), stream_));
  end(op);
}

void CudaBackend::residual_layernorm_backward(const SeqLayout& layout, const Tensor& dout,
                                              const Tensor& ln_in, const Tensor& ln_mean,
                                              const Tensor& ln_rstd, const LayerNormParams& ln,
                                              const Dropout& dropout, const Tensor& dx,
                                              const Tensor& dresidual, const Tensor& dbias,
                                              const LayerNormParams& dln) {
  // No native low-precision kernel yet: the adapter (widen, fp32 kernel, round back).
  if (lowp::any({&dout, &ln_in, &ln_mean, &ln_rstd, &ln.gamma, &ln.beta, &dx, &dresidual,
                 &dbias, &dln.gamma, &dln.beta}))
    return lowp::residual_layernorm_backward(*this, lowp_, layout, dout, ln_in, ln_mean, ln_rstd,
                                             ln, dropout, dx, dresidual, dbias, dln);
  const char* op = "residual_layernorm_backward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [rows, h] = checks::residual_layernorm_backward_args(
      args, dout, ln_in, ln_mean, ln_rstd, ln, dx, dresidual, dbias, dln);
  require_grid(op, rows);
  PB_REQUIRE((rows + cuda::kColumnChunk - 1) / cuda::kColumnChunk <= 65535,
             "{}: {} rows exceed the column-sum grid", op, rows);
  begin(op);
  const DropoutStream ds = checks::checked_dropout_stream(op, dropout, h, 1, layout.max_len);
  cuda::DeviceLayout dl;
  dl.rows = rows;
  if (dropout_enabled(ds)) dl = device_layout(op, layout, rows);
  if (rows == 0 || h == 0) return end(op);
  auto ptr = [](const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; };
  double* partial = scratch_doubles(op, 2 * static_cast<size_t>(cuda::column_sum_partials(rows, h)));
  launched(op, "residual_layernorm_backward",
           cuda::residual_layernorm_backward(
               dl, dout.ptr<float>(), ln_in.ptr<float>(), ln_mean.ptr<float>(),
               ln_rstd.ptr<float>(), ln.gamma.ptr<float>(), ds, rows, h, dx.ptr<float>(),
               ptr(dresidual), ptr(dbias), ptr(dln.gamma), ptr(dln.beta), partial, stream_));
  end(op);
}

// ---- attention -------------------------------------------------------------------------------
namespace {
struct AttnShape {
  int64_t rows, hidden, heads, head_dim;
};

AttnShape attention_shape(const char* op, const SeqLayout& layout, const Tensor& qkv,
                          int num_heads) {
  check_tensor(op, "qkv", qkv, DType::f32, {layout.rows, kAnyDim});
  const int64_t ld = qkv.dim(1), hidden = ld / 3;
  PB_REQUIRE(ld % 3 == 0 && num_heads >= 1 && hidden % num_heads == 0,
             "{}: qkv width {} is not 3 x hidden with hidden divisible by {} heads", op, ld,
             num_heads);
  const int64_t d = hidden / num_heads;
  PB_REQUIRE(d >= 1 && d <= cuda::kAttentionMaxHeadDim,
             "{}: head dim {} is not supported by the CUDA fp32 attention yet (1..{})", op, d,
             cuda::kAttentionMaxHeadDim);
  PB_REQUIRE(num_heads <= 65535, "{}: {} heads exceed the grid", op, num_heads);
  const int64_t blocks = int64_t{layout.num_seqs} * ((layout.max_len + 15) / 16);
  PB_REQUIRE(blocks <= 0x7fffffff, "{}: {} blocks exceed the grid", op, blocks);
  return AttnShape{layout.rows, hidden, num_heads, d};
}
}  // namespace

// Dispatch (the contract's "lowp: qkv, out[, dout, dqkv]"; lse is always f32):
// - every float tensor f32: the fp32 kernels (attention_kernels.cu);
// - qkv, out (and dout, dqkv) all in one 16-bit dtype, 16-byte aligned, with head dim 64: the
//   tensor-core kernels (fmha_mma.cu), same lse layout;
// - any other combination the contract allows (each tensor on its own, another head dim, an
//   unaligned view): widened through the low-precision adapter onto the fp32 kernels.
// Both kernel families run through the grouped launch: the sequences sorted into length
// buckets (common/fmha_plan.h), one grid per bucket on fmha_'s streams, joined before return.
void CudaBackend::attention_forward(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                                    const Dropout& dropout, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_forward";
  const bool fp32 = !lowp::any({&qkv, &out, &lse});
  const bool native = !fp32 && cuda::fmha_native(qkv, num_heads, {&out});
  if (!fp32 && !native)
    return lowp::attention_forward(*this, lowp_, layout, qkv, num_heads, dropout, out, lse);
  int64_t rows = 0, hidden = 0, heads = 0;
  if (fp32) {
    const AttnShape a = attention_shape(op, layout, qkv, num_heads);
    rows = a.rows, hidden = a.hidden, heads = a.heads;
  } else {
    const cuda::FmhaShape a = cuda::fmha_attention_shape(op, layout, qkv, num_heads);
    rows = a.rows, hidden = a.hidden, heads = a.heads;
  }
  expect(op, "qkv", qkv, qkv.dtype, {rows, 3 * hidden});
  expect(op, "out", out, qkv.dtype, {rows, hidden});
  expect(op, "lse", lse, DType::f32, {rows, heads});
  begin(op);
  cuda::DeviceLayout dl;
  {
    // The layout's arrays come to the host once, in fmha_host_lengths: the grouped launch
    // needs the lengths, and validation reads the same copy.
    const cuda::ScopedClear once(options_.validate_indices);
    dl = device_layout(op, layout, rows);
  }
  const std::vector<int32_t> lens =
      cuda::fmha_host_lengths(op, layout, options_.validate_indices, stream_);
  const DropoutStream ds =
      checks::checked_dropout_stream(op, dropout, layout.max_len, heads, layout.max_len);
  if (rows == 0) return end(op);
  launched(op, "fmha_zero_padding_rows",
           cuda::fmha_zero_padding_rows(dl, out.data, hidden, native ? 2 : 4, stream_));
  launched(op, "fmha_zero_padding_rows",
           cuda::fmha_zero_padding_rows(dl, lse.data, heads, 4, stream_));
  const FmhaPlan plan = plan_fmha(lens.data(), layout.num_seqs);
  cuda::fmha_check_grid(op, plan, native ? cuda::kFmhaTile : cuda::kAttentionF32Tile);
  if (!plan.buckets.empty()) {
    const cuda::FmhaType type = cuda::fmha_type(qkv.dtype);
    fmha_->run(op, plan, stream_, [&](const cuda::AttnWork& w, cudaStream_t s) {
      return native ? cuda::fmha_forward_work(type, dl, w, qkv.data, hidden, num_heads, ds,
                                              out.data, lse.ptr<float>(), s)
                    : cuda::attention_forward_work(dl, w, qkv.ptr<float>(), hidden, num_heads,
                                                   ds, out.ptr<float>(), lse.ptr<float>(), s);
    });
  }
  end(op);
}

void CudaBackend::attention_backward(const SeqLayout& layout, const Tensor& qkv,
                                     const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     int num_heads, const Dropout& dropout, const Tensor& dqkv) {
  const char* op = "attention_backward";
  const bool fp32 = !lowp::any({&qkv, &out, &lse, &dout, &dqkv});
  const bool native = !fp32 && cuda::fmha_native(qkv, num_heads, {&out, &dout, &dqkv});
  if (!fp32 && !native)
    return lowp::attention_backward(*this, lowp_, layout, qkv, out, lse, dout, num_heads,
                                    dropout, dqkv);
  int64_t rows = 0, hidden = 0, heads = 0;
  if (fp32) {
    const AttnShape a = attention_shape(op, layout, qkv, num_heads);
    rows = a.rows, hidden = a.hidden, heads = a.heads;
  } else {
    const cuda::FmhaShape a = cuda::fmha_attention_shape(op, layout, qkv, num_heads);
    rows = a.rows, hidden = a.hidden, heads = a.heads;
  }
  expect(op, "qkv", qkv, qkv.dtype, {rows, 3 * hidden});
  expect(op, "out", out, qkv.dtype, {rows, hidden});
  expect(op, "lse", lse, DType::f32, {rows, heads});
  expect(op, "dout", dout, qkv.dtype, {rows, hidden});
  expect(op, "dqkv", dqkv, qkv.dtype, {rows, 3 * hidden});
  begin(op);
  cuda::DeviceLayout dl;
  {
    const cuda::ScopedClear once(options_.validate_indices);  // see attention_forward
    dl = device_layout(op, layout, rows);
  }
  const std::vector<int32_t> lens =
      cuda::fmha_host_lengths(op, layout, options_.validate_indices, stream_);
  const DropoutStream ds =
      checks::checked_dropout_stream(op, dropout, layout.max_len, heads, layout.max_len);
  if (rows == 0) return end(op);
  launched(op, "fmha_zero_padding_rows",
           cuda::fmha_zero_padding_rows(dl, dqkv.data, 3 * hidden, native ? 2 : 4, stream_));
  const FmhaPlan plan = plan_fmha(lens.data(), layout.num_seqs);
  cuda::fmha_check_grid(op, plan, native ? cuda::kFmhaTile : cuda::kAttentionF32Tile);
  if (!plan.buckets.empty()) {
    const cuda::FmhaType type = cuda::fmha_type(qkv.dtype);
    fmha_->run(op, plan, stream_, [&](const cuda::AttnWork& w, cudaStream_t s) {
      return native ? cuda::fmha_backward_work(type, dl, w, qkv.data, out.data,
                                               lse.ptr<float>(), dout.data, hidden, num_heads,
                                               ds, dqkv.data, s)
                    : cuda::attention_backward_work(dl, w, qkv.ptr<float>(), out.ptr<float>(),
                                                    lse.ptr<float>(), dout.ptr<float>(), hidden,
                                                    num_heads, ds, dqkv.ptr<float>(), s);
    });
  }
  end(op);
}

}  // namespace packbert
