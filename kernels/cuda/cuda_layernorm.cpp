// CudaBackend's token-wise layer ops, embedding and bias + dropout + residual + LayerNorm: the
// CPU backend's checks, then the kernels of embedding_kernels.cu (and embedding_scatter.cu) and
// layernorm_kernels.cu.
#include "kernels/common/op_checks.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/layernorm.h"

namespace packbert {

namespace {
// A table's or bias's device pointer, null when the model has none.
const float* ptr_or_null(const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; }
const void* data_or_null(const Tensor& t) { return t.defined() ? t.data : nullptr; }
// segment_ids are read only with a token_type table.
const int32_t* segment_ids_or_null(const Tensor& segment_ids, const EmbeddingParams& p) {
  return p.token_type.defined() ? segment_ids.ptr<int32_t>() : nullptr;
}
// position and token_type are none or of the word table's dtype.
bool tables_of(DType tab, const EmbeddingParams& p) {
  return (!p.position.defined() || p.position.dtype == tab) &&
         (!p.token_type.defined() || p.token_type.dtype == tab);
}

void require_grid(const char* op, int64_t blocks) {
  PB_REQUIRE(blocks <= 0x7fffffff, "{}: {} blocks exceed the CUDA grid", op, blocks);
}

// The dtype of the native low-precision kernels for a call: every defined tensor of `low` in
// the same one of bf16 / f16, every defined tensor of `f32` in f32 (the combinations the model
// passes, kernels/backend.h's Precision). DType::f32 for any other call: the adapter takes
// those (and names an argument given in low precision that must stay f32).
DType native_lowp_dtype(std::initializer_list<const Tensor*> low,
                        std::initializer_list<const Tensor*> f32) {
  DType d = DType::f32;
  for (const Tensor* t : low) {
    if (!t->defined()) continue;
    if (!lowp::is_lowp(t->dtype) || (d != DType::f32 && t->dtype != d)) return DType::f32;
    d = t->dtype;
  }
  return lowp::any(f32) ? DType::f32 : d;
}
}  // namespace

void CudaBackend::embedding_forward(const SeqLayout& layout, const Tensor& input_ids,
                                    const Tensor& segment_ids, const EmbeddingParams& p,
                                    const Dropout& dropout, const Tensor& out,
                                    const Tensor& ln_mean, const Tensor& ln_rstd) {
  const trace::Range range("embedding_forward");
  const char* op = "embedding_forward";
  // Native low precision: out in bf16 / f16 with the tables f32 (the model) or in out's dtype.
  // Any other combination: the adapter (widen, fp32 kernel, round back).
  const bool fp32 = !lowp::any(
      {&p.word, &p.position, &p.token_type, &p.ln_gamma, &p.ln_beta, &out, &ln_mean, &ln_rstd});
  const DType lp =
      fp32 ? DType::f32 : native_lowp_dtype({&out}, {&p.ln_gamma, &p.ln_beta, &ln_mean, &ln_rstd});
  const DType tab = p.word.dtype;
  const bool native = lp != DType::f32 && (tab == DType::f32 || tab == lp) && tables_of(tab, p);
  if (!fp32 && !native)
    return lowp::embedding_forward(*this, lowp_, layout, input_ids, segment_ids, p, dropout, out,
                                   ln_mean, ln_rstd);
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  int64_t rows = layout.rows, vocab = 0, h = 0;
  if (fp32) {
    const checks::EmbeddingDims d = checks::embedding_forward_args(
        args, layout, input_ids, segment_ids, p, out, ln_mean, ln_rstd);
    vocab = d.vocab, h = d.h;
  } else {
    args("word", p.word, tab, {kAnyDim, kAnyDim});
    vocab = p.word.dim(0), h = p.word.dim(1);
    args.optional("position", p.position, tab, {kAnyDim, h});
    args.optional("token_type", p.token_type, tab, {kAnyDim, h});
    args("ln_gamma", p.ln_gamma, DType::f32, {h});
    args.optional("ln_beta", p.ln_beta, DType::f32, {h});
    checks::layernorm_eps(op, p.ln_eps);
    args("input_ids", input_ids, DType::i32, {rows});
    if (p.token_type.defined()) args("segment_ids", segment_ids, DType::i32, {rows});
    args("out", out, lp, {rows, h});
    args("ln_mean", ln_mean, DType::f32, {rows});
    args("ln_rstd", ln_rstd, DType::f32, {rows});
  }
  require_grid(op, rows);
  begin(op);
  const cuda::DeviceLayout dl = device_layout(op, layout, rows);
  const DropoutStream ds = dropout_stream(op, dropout, h, 1, layout.max_len);
  if (options_.validate_indices && rows > 0) {
    const int64_t types = p.token_type.defined() ? p.token_type.dim(0) : 0;
    const int64_t positions = p.position.defined() ? p.position.dim(0) : 0;
    const auto ids = to_host<int32_t>(op, input_ids);
    const auto segs = types > 0 ? to_host<int32_t>(op, segment_ids) : std::vector<int32_t>(rows);
    const auto pos = to_host<int32_t>(op, layout.token_pos);
    for (int64_t r = 0; r < rows; ++r)
      PB_REQUIRE(ids[r] >= 0 && ids[r] < vocab &&
                     (types == 0 || (segs[r] >= 0 && segs[r] < types)) &&
                     (positions == 0 || pos[r] < positions),
                 "{}: row {} has token id {} (vocab {}), segment {} (types {}), position {} "
                 "(positions {})",
                 op, r, ids[r], vocab, segs[r], types, pos[r], positions);
  }
  if (rows == 0 || h == 0) return end(op);
  if (native) {
    const cuda::EmbeddingLowpPtrs ep{p.word.data,
                                     data_or_null(p.position),
                                     data_or_null(p.token_type),
                                     float_format(op, "word", p.word),
                                     p.ln_gamma.ptr<float>(),
                                     ptr_or_null(p.ln_beta),
                                     input_ids.ptr<int32_t>(),
                                     segment_ids_or_null(segment_ids, p),
                                     p.ln_eps};
    launched(op, "embedding_forward_lowp",
             cuda::embedding_forward_lowp(dl, ep, h, ds, out.data, float_format(op, "out", out),
                                          ln_mean.ptr<float>(), ln_rstd.ptr<float>(), stream_));
    return end(op);
  }
  const cuda::EmbeddingPtrs ep{p.word.ptr<float>(),
                               ptr_or_null(p.position),
                               ptr_or_null(p.token_type),
                               p.ln_gamma.ptr<float>(),
                               ptr_or_null(p.ln_beta),
                               input_ids.ptr<int32_t>(),
                               segment_ids_or_null(segment_ids, p),
                               p.ln_eps};
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
  const trace::Range range("embedding_backward");
  const char* op = "embedding_backward";
  // Native low precision: dout in bf16 / f16 with the tables f32 (the model) or in dout's dtype
  // and every gradient f32; any other combination: the adapter.
  const bool fp32 = !lowp::any({&p.word, &p.position, &p.token_type, &p.ln_gamma, &p.ln_beta,
                                &ln_mean, &ln_rstd, &dout, &grads.word, &grads.position,
                                &grads.token_type, &grads.ln_gamma, &grads.ln_beta});
  const DType lp =
      fp32 ? DType::f32
           : native_lowp_dtype(
                 {&dout}, {&p.ln_gamma, &p.ln_beta, &ln_mean, &ln_rstd, &grads.word,
                           &grads.position, &grads.token_type, &grads.ln_gamma, &grads.ln_beta});
  const DType tab = p.word.dtype;
  const bool native = lp != DType::f32 && (tab == DType::f32 || tab == lp) && tables_of(tab, p);
  if (!fp32 && !native)
    return lowp::embedding_backward(*this, lowp_, layout, input_ids, segment_ids, p, dropout,
                                    ln_mean, ln_rstd, dout, grads);
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  int64_t rows = layout.rows, h = 0;
  if (fp32) {
    h = checks::embedding_backward_args(args, layout, input_ids, segment_ids, p, ln_mean, ln_rstd,
                                        dout, grads)
            .h;
  } else {
    args("word", p.word, tab, {kAnyDim, kAnyDim});
    h = p.word.dim(1);
    args.optional("position", p.position, tab, {kAnyDim, h});
    args.optional("token_type", p.token_type, tab, {kAnyDim, h});
    args("ln_gamma", p.ln_gamma, DType::f32, {h});
    args("input_ids", input_ids, DType::i32, {rows});
    if (p.token_type.defined()) args("segment_ids", segment_ids, DType::i32, {rows});
    args("ln_mean", ln_mean, DType::f32, {rows});
    args("ln_rstd", ln_rstd, DType::f32, {rows});
    args("dout", dout, lp, {rows, h});
    args.optional("grads.word", grads.word, DType::f32, {p.word.dim(0), h});
    PB_REQUIRE((p.position.defined() || !grads.position.defined()) &&
                   (p.token_type.defined() || !grads.token_type.defined()),
               "{}: a gradient is given for a table the model does not have", op);
    if (grads.position.defined())
      args("grads.position", grads.position, DType::f32, {p.position.dim(0), h});
    if (grads.token_type.defined())
      args("grads.token_type", grads.token_type, DType::f32, {p.token_type.dim(0), h});
    args.optional("grads.ln_gamma", grads.ln_gamma, DType::f32, {h});
    args.optional("grads.ln_beta", grads.ln_beta, DType::f32, {h});
  }
  require_grid(op, rows);
  PB_REQUIRE((rows + cuda::kColumnChunk - 1) / cuda::kColumnChunk <= 65535,
             "{}: {} rows exceed the column-sum grid", op, rows);
  begin(op);
  const cuda::DeviceLayout dl = device_layout(op, layout, rows);
  const DropoutStream ds = dropout_stream(op, dropout, h, 1, layout.max_len);
  // Ids were validated by the forward; backward trusts them (same buffers, same step).
  if (rows == 0 || h == 0) return end(op);
  auto ptr = [](const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; };
  double* partial =
      scratch_doubles(op, 2 * static_cast<size_t>(cuda::column_sum_partials(rows, h)));
  // Then the tables' gradients from d, the gradient wrt the embedding sum (cuda_kernels.h).
  auto scatter = [&](const float* d) {
    if (!grads.word.defined() && !grads.position.defined() && !grads.token_type.defined()) return;
    const int64_t vocab = p.word.dim(0);
    const int64_t positions = p.position.defined() ? p.position.dim(0) : 0;
    const int64_t types = p.token_type.defined() ? p.token_type.dim(0) : 0;
    const size_t bytes = cuda::embedding_scatter_scratch_bytes(rows, h, vocab + positions + types);
    PB_REQUIRE(bytes > 0, "{}: sizing the table scatter of {} rows failed", op, rows);
    launched(op, "embedding_scatter",
             cuda::embedding_scatter(dl, input_ids.ptr<int32_t>(),
                                     segment_ids_or_null(segment_ids, p), h, d, ptr(grads.word),
                                     vocab, ptr(grads.position), positions, ptr(grads.token_type),
                                     types, scratch_bytes(op, bytes), bytes, stream_));
  };
  if (native) {
    // The gradient wrt the embedding sum is formed in fp32 scratch (the emulation's too): a
    // low-precision dout cannot hold it unrounded, and the op may leave dout alone.
    float* d = scratch_floats(op, static_cast<size_t>(rows * h));
    const cuda::EmbeddingLowpPtrs ep{p.word.data,
                                     data_or_null(p.position),
                                     data_or_null(p.token_type),
                                     float_format(op, "word", p.word),
                                     p.ln_gamma.ptr<float>(),
                                     nullptr,
                                     input_ids.ptr<int32_t>(),
                                     segment_ids_or_null(segment_ids, p),
                                     p.ln_eps};
    launched(
        op, "embedding_backward_lowp",
        cuda::embedding_backward_lowp(dl, ep, h, ds, ln_mean.ptr<float>(), ln_rstd.ptr<float>(),
                                      dout.data, float_format(op, "dout", dout), d,
                                      ptr(grads.ln_gamma), ptr(grads.ln_beta), partial, stream_));
    scatter(d);
    return end(op);
  }
  const cuda::EmbeddingPtrs ep{p.word.ptr<float>(),
                               ptr_or_null(p.position),
                               ptr_or_null(p.token_type),
                               p.ln_gamma.ptr<float>(),
                               nullptr,
                               input_ids.ptr<int32_t>(),
                               segment_ids_or_null(segment_ids, p),
                               p.ln_eps};
  launched(op, "embedding_backward",
           cuda::embedding_backward(dl, ep, h, ds, ln_mean.ptr<float>(), ln_rstd.ptr<float>(),
                                    dout.ptr<float>(), ptr(grads.ln_gamma), ptr(grads.ln_beta),
                                    partial, stream_));
  scatter(dout.ptr<float>());
  end(op);
}

void CudaBackend::residual_layernorm_forward(const SeqLayout& layout, const Tensor& x,
                                             const Tensor& bias, const Tensor& residual,
                                             const LayerNormParams& ln, const Dropout& dropout,
                                             const Tensor& out, const Tensor& ln_in,
                                             const Tensor& ln_mean, const Tensor& ln_rstd) {
  const trace::Range range("residual_layernorm_forward");
  const char* op = "residual_layernorm_forward";
  // Native low precision: x, residual (if given), out and ln_in in one of bf16 / f16, the rest
  // f32, hidden size within the kernel's shared memory; anything else: the adapter.
  const bool fp32 =
      !lowp::any({&x, &bias, &residual, &ln.gamma, &ln.beta, &out, &ln_in, &ln_mean, &ln_rstd});
  const DType lp = fp32 ? DType::f32
                        : native_lowp_dtype({&x, &residual, &out, &ln_in},
                                            {&bias, &ln.gamma, &ln.beta, &ln_mean, &ln_rstd});
  const bool native = lp != DType::f32 && x.ndim == 2 && x.dim(1) <= cuda::kLowpLayerNormMaxHidden;
  if (!fp32 && !native)
    return lowp::residual_layernorm_forward(*this, lowp_, layout, x, bias, residual, ln, dropout,
                                            out, ln_in, ln_mean, ln_rstd);
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  int64_t rows = 0, h = 0;
  if (fp32) {
    const checks::RowDims d = checks::residual_layernorm_forward_args(args, x, bias, residual, ln,
                                                                      out, ln_in, ln_mean, ln_rstd);
    rows = d.rows, h = d.h;
  } else {
    args("x", x, lp, {kAnyDim, kAnyDim});
    rows = x.dim(0), h = x.dim(1);
    args.optional("bias", bias, DType::f32, {h});
    args.optional("residual", residual, lp, {rows, h});
    args("ln.gamma", ln.gamma, DType::f32, {h});
    args.optional("ln.beta", ln.beta, DType::f32, {h});
    checks::layernorm_eps(op, ln.eps);
    args("out", out, lp, {rows, h});
    args("ln_in", ln_in, lp, {rows, h});
    args("ln_mean", ln_mean, DType::f32, {rows});
    args("ln_rstd", ln_rstd, DType::f32, {rows});
    PB_REQUIRE(out.data != ln_in.data && out.data != x.data, "{}: out may not alias x or ln_in",
               op);
  }
  require_grid(op, rows);
  begin(op);
  const DropoutStream ds = dropout_stream(op, dropout, h, 1, layout.max_len);
  cuda::DeviceLayout dl;
  dl.rows = rows;
  if (dropout_enabled(ds)) dl = device_layout(op, layout, rows);
  if (rows == 0 || h == 0) return end(op);
  if (native) {
    launched(op, "residual_layernorm_forward_lowp",
             cuda::residual_layernorm_forward_lowp(
                 dl, float_format(op, "x", x), x.data, bias.defined() ? bias.ptr<float>() : nullptr,
                 residual.defined() ? residual.data : nullptr, ln.gamma.ptr<float>(),
                 ptr_or_null(ln.beta), ln.eps, ds, rows, h, out.data, ln_in.data,
                 ln_mean.ptr<float>(), ln_rstd.ptr<float>(), stream_));
    return end(op);
  }
  launched(op, "residual_layernorm_forward",
           cuda::residual_layernorm_forward(
               dl, x.ptr<float>(), bias.defined() ? bias.ptr<float>() : nullptr,
               residual.defined() ? residual.ptr<float>() : nullptr, ln.gamma.ptr<float>(),
               ptr_or_null(ln.beta), ln.eps, ds, rows, h, out.ptr<float>(), ln_in.ptr<float>(),
               ln_mean.ptr<float>(), ln_rstd.ptr<float>(), stream_));
  end(op);
}

void CudaBackend::residual_layernorm_backward(const SeqLayout& layout, const Tensor& dout,
                                              const Tensor& ln_in, const Tensor& ln_mean,
                                              const Tensor& ln_rstd, const LayerNormParams& ln,
                                              const Dropout& dropout, const Tensor& dx,
                                              const Tensor& dresidual, bool dresidual_in,
                                              const Tensor& dbias, const LayerNormParams& dln) {
  const trace::Range range("residual_layernorm_backward");
  const char* op = "residual_layernorm_backward";
  // Native low precision: dout, ln_in, dx and dresidual (if given) in one of bf16 / f16, the rest
  // f32; anything else: the adapter.
  const bool fp32 = !lowp::any({&dout, &ln_in, &ln_mean, &ln_rstd, &ln.gamma, &ln.beta, &dx,
                                &dresidual, &dbias, &dln.gamma, &dln.beta});
  const DType lp = fp32 ? DType::f32
                        : native_lowp_dtype({&dout, &ln_in, &dx, &dresidual},
                                            {&ln_mean, &ln_rstd, &ln.gamma, &ln.beta, &dbias,
                                             &dln.gamma, &dln.beta});
  const bool native = lp != DType::f32;
  if (!fp32 && !native)
    return lowp::residual_layernorm_backward(*this, lowp_, layout, dout, ln_in, ln_mean, ln_rstd,
                                             ln, dropout, dx, dresidual, dresidual_in, dbias, dln);
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  int64_t rows = 0, h = 0;
  if (fp32) {
    const checks::RowDims d = checks::residual_layernorm_backward_args(
        args, dout, ln_in, ln_mean, ln_rstd, ln, dx, dresidual, dresidual_in, dbias, dln);
    rows = d.rows, h = d.h;
  } else {
    args("dout", dout, lp, {kAnyDim, kAnyDim});
    rows = dout.dim(0), h = dout.dim(1);
    args("ln_in", ln_in, lp, {rows, h});
    args("ln_mean", ln_mean, DType::f32, {rows});
    args("ln_rstd", ln_rstd, DType::f32, {rows});
    args("ln.gamma", ln.gamma, DType::f32, {h});
    args("dx", dx, lp, {rows, h});
    args.optional("dresidual", dresidual, lp, {rows, h});
    args.optional("dbias", dbias, DType::f32, {h});
    args.optional("dln.gamma", dln.gamma, DType::f32, {h});
    args.optional("dln.beta", dln.beta, DType::f32, {h});
    PB_REQUIRE(dx.data != dout.data, "{}: dx may not alias dout (dresidual may)", op);
    PB_REQUIRE(!dresidual_in || (dresidual.defined() && dresidual.data != dout.data),
               "{}: dresidual_in needs a dresidual that does not alias dout", op);
  }
  require_grid(op, rows);
  PB_REQUIRE((rows + cuda::kColumnChunk - 1) / cuda::kColumnChunk <= 65535,
             "{}: {} rows exceed the column-sum grid", op, rows);
  begin(op);
  const DropoutStream ds = dropout_stream(op, dropout, h, 1, layout.max_len);
  cuda::DeviceLayout dl;
  dl.rows = rows;
  if (dropout_enabled(ds)) dl = device_layout(op, layout, rows);
  if (rows == 0 || h == 0) return end(op);
  auto ptr = [](const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; };
  double* partial =
      scratch_doubles(op, 2 * static_cast<size_t>(cuda::column_sum_partials(rows, h)));
  if (native) {
    // dbias sums the unrounded dx (as the emulation does), kept in fp32 scratch for it.
    float* dx32 = dbias.defined() ? scratch_floats(op, static_cast<size_t>(rows * h)) : nullptr;
    launched(op, "residual_layernorm_backward_lowp",
             cuda::residual_layernorm_backward_lowp(
                 dl, float_format(op, "dout", dout), dout.data, ln_in.data, ln_mean.ptr<float>(),
                 ln_rstd.ptr<float>(), ln.gamma.ptr<float>(), ds, rows, h, dx.data,
                 dresidual.defined() ? dresidual.data : nullptr, dresidual_in, dx32, ptr(dbias),
                 ptr(dln.gamma), ptr(dln.beta), partial, stream_));
    return end(op);
  }
  launched(op, "residual_layernorm_backward",
           cuda::residual_layernorm_backward(dl, dout.ptr<float>(), ln_in.ptr<float>(),
                                             ln_mean.ptr<float>(), ln_rstd.ptr<float>(),
                                             ln.gamma.ptr<float>(), ds, rows, h, dx.ptr<float>(),
                                             ptr(dresidual), dresidual_in, ptr(dbias),
                                             ptr(dln.gamma), ptr(dln.beta), partial, stream_));
  end(op);
}

}  // namespace packbert
