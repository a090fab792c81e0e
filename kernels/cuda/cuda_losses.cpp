// CudaBackend's losses and what feeds them: the gathers of the masked rows and their backward,
// softmax cross-entropy (gather_scatter_kernels.cu, loss_kernels.cu), and the two heads that are
// GEMMs plus a loss, the MLM decoder (mlm_loss) and the pooler + NSP classifier (nsp_loss), with
// fp32 operands and with bf16 / f16 ones, through the GEMMs of cuda_gemm.cpp and the linear
// layers of cuda_linear.cpp.
#include <algorithm>
#include <cmath>

#include "kernels/common/mlm_loss_by_ops.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/ops/losses.h"

namespace packbert {

// ---- masked positions ------------------------------------------------------------------------
// The gather and its backward move rows of one float format: bf16 / f16 natively (the forward
// is a bit copy, the backward adds in fp32 and rounds after each add -- for distinct indices,
// the usual case, exactly the CPU emulation's single rounding of 0 + dout). Mixed formats go
// through the adapter.
namespace {
// x and out (or dout and dx) of one float format: the format; else none (the adapter's case).
bool same_float_format(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype &&
         (a.dtype == DType::f32 || a.dtype == DType::bf16 || a.dtype == DType::f16);
}
// The same view read as f32, for the shape checks shared with the CPU.
Tensor as_f32(Tensor t) {
  if (t.defined()) t.dtype = DType::f32;
  return t;
}
}  // namespace

void CudaBackend::gather_rows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const trace::Range range("gather_rows");
  if (lowp::any({&x, &out}) && !same_float_format(x, out))
    return lowp::gather_rows(*this, lowp_, x, index, out);
  const char* op = "gather_rows";
  const auto [rows, h, m] = checks::gather_rows_args(
      checks::OpArgs(op, Device::cuda, pointer_check()), "x", as_f32(x), index, "out", as_f32(out));
  begin(op);
  check_indices(op, "index", index, rows, true);
  if (m * h > 0)
    launched(op, "gather_rows",
             cuda::gather_rows(x.data, index.ptr<int32_t>(), out.data, float_format(op, "x", x), m,
                               h, stream_));
  end(op);
}

void CudaBackend::gather_rows_backward(const Tensor& dout, const Tensor& index, const Tensor& dx) {
  const trace::Range range("gather_rows_backward");
  if (lowp::any({&dout, &dx}) && !same_float_format(dout, dx))
    return lowp::gather_rows_backward(*this, lowp_, dout, index, dx);
  const char* op = "gather_rows_backward";
  const auto [rows, h, m] =
      checks::gather_rows_args(checks::OpArgs(op, Device::cuda, pointer_check()), "dx", as_f32(dx),
                               index, "dout", as_f32(dout));
  begin(op);
  check_indices(op, "index", index, rows, true);
  if (dx.bytes()) PB_CUDA_OP(op, cuda::memset_async(dx.data, 0, dx.bytes(), stream_));
  if (m * h > 0) {
    auto* scratch =
        static_cast<uint32_t*>(scratch_bytes(op, static_cast<size_t>(rows + 1) * sizeof(uint32_t)));
    launched(
        op, "scatter_add_rows_ordered",
        cuda::scatter_add_rows_ordered(dout.data, index.ptr<int32_t>(), dx.data,
                                       float_format(op, "dx", dx), m, h, rows, scratch, stream_));
  }
  end(op);
}

// ---- losses ----------------------------------------------------------------------------------
void CudaBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                                        const GradScale& grad_scale, const Tensor& loss_sum,
                                        const Tensor& num_correct, const Tensor& dlogits) {
  const trace::Range range("softmax_cross_entropy");
  if (lowp::any({&logits, &loss_sum, &dlogits}))
    return lowp::softmax_cross_entropy(*this, lowp_, logits, labels, grad_scale, loss_sum,
                                       num_correct, dlogits);
  const char* op = "softmax_cross_entropy";
  const auto [m, v] =
      checks::softmax_cross_entropy_args(checks::OpArgs(op, Device::cuda, pointer_check()), logits,
                                         labels, grad_scale, loss_sum, num_correct, dlogits);
  PB_REQUIRE(m <= 0x7fffffff, "{}: {} rows exceed the grid", op, m);
  begin(op);
  check_indices(op, "labels", labels, v, true);
  if (m > 0) {
    double* rows = scratch_doubles(op, 2 * static_cast<size_t>(m));
    launched(op, "softmax_cross_entropy",
             cuda::softmax_cross_entropy(
                 logits.ptr<float>(), labels.ptr<int32_t>(), m, v, grad_scale.value,
                 grad_scale.device.defined() ? grad_scale.device.ptr<float>() : nullptr,
                 dlogits.defined() ? dlogits.ptr<float>() : nullptr, rows, rows + m,
                 loss_sum.ptr<float>(), num_correct.ptr<int32_t>(), stream_));
  }
  end(op);
}

// ---- MLM ---------------------------------------------------------------------------------------
void CudaBackend::mlm_loss(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& labels,
                           const GradScale& grad_scale, const Tensor& logits_ws,
                           const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                           const Tensor& dw, const Tensor& db) {
  const trace::Range range("mlm_loss");
  if (lowp::any({&x, &w, &b, &logits_ws, &loss_sum, &dx, &dw, &db})) {
    if (mlm_loss_lowp(x, w, b, labels, grad_scale, logits_ws, loss_sum, num_correct, dx, dw, db))
      return;
    return lowp::mlm_loss(*this, lowp_, x, w, b, labels, grad_scale, logits_ws, loss_sum,
                          num_correct, dx, dw, db);
  }
  checks::mlm_loss_by_ops(*this, checks::OpArgs("mlm_loss", Device::cuda, pointer_check()), x, w, b,
                          labels, grad_scale, logits_ws, loss_sum, num_correct, dx, dw, db);
}

// The MLM decoder in bf16 / f16: logits (fp32) = x w^T + b from the low-precision x and word
// embeddings (fp32 accumulation, the BIAS epilogue with the fp32 bias), the fp32 softmax
// cross-entropy turning them into their gradient in place, then the two backward GEMMs on that
// gradient rounded to the operands' type -- cuBLASLt takes A and B of one type -- in blocks of
// vocabulary columns whose rounded copy fits kMlmBackwardBlockBytes of scratch. Column blocks,
// not row blocks: block j's GEMM dw[j] += g[:, j]^T x writes its own rows of the word-embedding
// gradient ([V, H] fp32, 125 MB at BERT-Large), so the whole of dw is read and written once per
// call however many blocks there are (row blocks each read and wrote all of it); db[j] comes
// through BGRADB, else from column sums of the fp32 gradient. dx = sum_j g[:, j] w[j] ([m, H],
// small) accumulates in fp32 scratch across the blocks and is rounded once at the end. The CPU
// emulation keeps the gradient in fp32: the two differ by that one rounding (2^-9 relative in
// bf16, per element).
// In f16 the gradient (softmax - onehot) * grad_scale lies far below f16's normal range (about
// 1.4e-8 per element at vocab 30528 and 1 / 2300 masked tokens: under the smallest subnormal,
// so it flushed to zero and db lost 7%): it is rounded times 2^e, a power of two putting its
// largest possible magnitude, |grad_scale|, just under 2^10, and the GEMMs take alpha = 2^-e
// (both exact); db is then summed from the fp32 gradient.
namespace {
constexpr int64_t kMlmBackwardBlockBytes = int64_t{64} << 20;
}  // namespace

int64_t mlm_backward_block_columns(int64_t m, int64_t v, int64_t elem_bytes) {
  const int64_t fit = kMlmBackwardBlockBytes / std::max<int64_t>(1, m * elem_bytes);
  if (fit >= v) return v;
  // A multiple of 8 columns keeps the blocks' GEMM operands 16-byte aligned (tensor cores).
  return std::max<int64_t>(std::min<int64_t>(8, v), fit / 8 * 8);
}

bool CudaBackend::mlm_loss_lowp(const Tensor& x, const Tensor& w, const Tensor& b,
                                const Tensor& labels, const GradScale& grad_scale,
                                const Tensor& logits_ws, const Tensor& loss_sum,
                                const Tensor& num_correct, const Tensor& dx, const Tensor& dw,
                                const Tensor& db) {
  const char* op = "mlm_loss";
  const DType t = x.dtype;
  auto is_f32 = [](const Tensor& v) { return !v.defined() || v.dtype == DType::f32; };
  if (!lowp::is_lowp(t) || w.dtype != t || (dx.defined() && dx.dtype != t) || !is_f32(b) ||
      !is_f32(logits_ws) || !is_f32(loss_sum) || !is_f32(dw) || !is_f32(db))
    return false;
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [m, h, v] =
      checks::mlm_loss_args(args, shape_of(x), shape_of(w), logits_ws, dx, dw, db);
  if (h == 0 || v == 0) return false;  // degenerate shapes: the adapter's general path
  args("b", b, DType::f32, {v});
  args.optional("dx", shape_of(dx), DType::f32, {m, h});
  args.optional("dw", dw, DType::f32, {v, h});
  args.optional("db", db, DType::f32, {v});
  begin(op);
  float* logits = logits_ws.ptr<float>();
  const cudaDataType_t type = cuda_type(t);
  if (m > 0) {
    GemmCall g = forward_gemm_call(x.data, w.data, logits, m, h, v, type);
    g.c_type = CUDA_R_32F;
    g.epilogue = CUBLASLT_EPILOGUE_BIAS;
    g.bias = const_cast<float*>(b.ptr<float>());
    if (!gemm(op, g)) {
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      gemm(op, g);
      launched(op, "add_bias_rows", cuda::add_bias_rows(logits, b.ptr<float>(), m, v, stream_));
    }
  }
  softmax_cross_entropy(logits_ws, labels, grad_scale, loss_sum, num_correct,
                        dx.defined() ? logits_ws : Tensor());
  if (!dx.defined() || m == 0) {
    end(op);
    return true;
  }
  const cuda::FloatFormat f = float_format(op, "x", x);
  const auto es = static_cast<int64_t>(dtype_size(t));
  const int64_t block = mlm_backward_block_columns(m, v, es);
  // Scratch: dx in fp32 [m, h] when there are several blocks (one block writes dx directly),
  // then the rounded gradient of one column block [m, block].
  const bool one_block = block >= v;
  const int64_t dx_bytes = one_block ? 0 : (m * h * 4 + 255) / 256 * 256;
  char* scratch =
      static_cast<char*>(scratch_bytes(op, static_cast<size_t>(dx_bytes + m * block * es)));
  float* dx32 = reinterpret_cast<float*>(scratch);
  void* g16 = scratch + dx_bytes;
  const char* wb = static_cast<const char*>(w.data);
  float up = 1.f;
  // With a device factor (GradScale::device), from the value it had when issued: a graph
  // replays this power of two (the model keys its graphs by it in f16).
  const float gs = grad_scale.value;
  if (t == DType::f16 && gs != 0.f && std::isfinite(gs))
    up = std::ldexp(1.f, 9 - std::ilogb(gs));  // |g| <= |grad_scale| < 2^(ilogb + 1)
  const float down = 1.f / up;                 // exact: a power of two
  for (int64_t c0 = 0; c0 < v; c0 += block) {
    const int64_t n = std::min(block, v - c0);
    const float* gf = logits + c0;  // columns c0 .. c0 + n of the fp32 gradient [m, v]
    launched(op, "convert_rows",
             cuda::convert_rows(gf, cuda::FloatFormat::f32, v, g16, f, n, m, n, stream_, up));
    bool db_done = !db.defined();
    if (dw.defined())
      db_done = weight_grad_gemm(op, x.data, g16, dw.ptr<float>() + c0 * h,
                                 db_done ? nullptr : db.ptr<float>() + c0, m, h, n, type, down) ||
                db_done;
    if (!db_done) {
      double* partial = scratch_doubles(op, static_cast<size_t>(cuda::column_sum_partials(m, n)));
      launched(op, "add_column_sums",
               cuda::add_column_sums(gf, m, n, v, partial, db.ptr<float>() + c0, stream_));
    }
    if (one_block)
      input_grad_gemm(op, w.data, g16, dx.data, m, h, n, false, type, type, nullptr, down);
    else
      input_grad_gemm(op, wb + c0 * h * es, g16, dx32, m, h, n, c0 > 0, type, CUDA_R_32F, nullptr,
                      down);
  }
  if (!one_block)
    launched(op, "convert",
             cuda::convert(dx32, cuda::FloatFormat::f32, dx.data, f, m * h, stream_));
  end(op);
  return true;
}

// ---- NSP ---------------------------------------------------------------------------------------
void CudaBackend::nsp_loss(const SeqLayout& layout, const Tensor& x, const PoolerParams& params,
                           const Tensor& labels, const GradScale& grad_scale,
                           const Tensor& workspace, const Tensor& loss_sum,
                           const Tensor& num_correct, const Tensor& dx, const PoolerParams& grads) {
  const trace::Range range("nsp_loss");
  if (lowp::any({&x, &params.dense_w, &params.dense_b, &params.cls_w, &params.cls_b, &workspace,
                 &loss_sum, &dx, &grads.dense_w, &grads.dense_b, &grads.cls_w, &grads.cls_b})) {
    if (nsp_loss_lowp(layout, x, params, labels, grad_scale, workspace, loss_sum, num_correct, dx,
                      grads))
      return;
    return lowp::nsp_loss(*this, lowp_, layout, x, params, labels, grad_scale, workspace, loss_sum,
                          num_correct, dx, grads);
  }
  const char* op = "nsp_loss";
  const auto [h, s] = checks::nsp_loss_args(checks::OpArgs(op, Device::cuda, pointer_check()),
                                            layout, x, params, labels, workspace, dx, grads);
  begin(op);
  device_layout(op, layout, layout.rows, checks::EmptySeqs::allowed);
  if (s == 0) return end(op);
  // Scratch: the slots' [CLS] rows and labels (nsp_slots), then the scatter's.
  const int64_t slot_words = may_have_empty_slots(layout) ? (2 * s + 63) / 64 * 64 : 0;
  auto* scratch = static_cast<int32_t*>(
      scratch_bytes(op, static_cast<size_t>(slot_words + layout.rows + 1) * sizeof(int32_t)));
  const auto [cls_row, slot_label] = nsp_slots(op, layout, labels, scratch, slot_words > 0);
  gather_rows(x, cls_row, nsp_workspace(workspace, s, h)[0]);
  nsp_head(workspace, s, h, params, slot_label, grad_scale, loss_sum, num_correct, dx.defined(),
           grads);
  if (!dx.defined()) return end(op);
  // dx[cls_row[i]] += dcls[i]; the rows are distinct (a valid layout), -1 skipped.
  launched(
      op, "scatter_add_rows_ordered",
      cuda::scatter_add_rows_ordered(nsp_workspace(workspace, s, h)[3].data, cls_row.ptr<int32_t>(),
                                     dx.data, cuda::FloatFormat::f32, s, h, layout.rows,
                                     reinterpret_cast<uint32_t*>(scratch + slot_words), stream_));
  end(op);
}

// Whether a layout may hold empty slots (seq_len 0) as far as the host can tell without waiting:
// a fixed launch (a graph's layout: the same ops whatever the lengths) or no host copy of the
// lengths may; otherwise the host copy says.
bool CudaBackend::may_have_empty_slots(const SeqLayout& layout) {
  if (layout.fixed_launch || !layout.host_seq_len) return true;
  return std::any_of(layout.host_seq_len, layout.host_seq_len + layout.num_seqs,
                     [](int32_t n) { return n == 0; });
}

// The NSP head's [CLS] rows and labels, with -1 for both in empty slots (nsp_slots, into
// scratch: 2 s words) when there may be any; else the layout's starts and the labels as given.
std::pair<Tensor, Tensor> CudaBackend::nsp_slots(const char* op, const SeqLayout& layout,
                                                 const Tensor& labels, int32_t* scratch,
                                                 bool derive) {
  if (!derive) return {layout.seq_start, labels};
  const int64_t s = layout.num_seqs;
  launched(op, "nsp_slots",
           cuda::nsp_slots(layout.seq_start.ptr<int32_t>(), layout.seq_len.ptr<int32_t>(),
                           labels.ptr<int32_t>(), s, scratch, scratch + s, stream_));
  return {Tensor(scratch, DType::i32, {s}, Device::cuda),
          Tensor(scratch + s, DType::i32, {s}, Device::cuda)};
}

// The CPU's workspace layout exactly: [cls | pooled | dpooled | dcls] (s x h each), then the
// logits (s x 2) at 4 s h, which become their gradient in place.
std::array<Tensor, 5> CudaBackend::nsp_workspace(const Tensor& workspace, int64_t s, int64_t h) {
  float* ws = workspace.ptr<float>();
  const Device dev = Device::cuda;
  return {Tensor(ws, DType::f32, {s, h}, dev), Tensor(ws + s * h, DType::f32, {s, h}, dev),
          Tensor(ws + 2 * s * h, DType::f32, {s, h}, dev),
          Tensor(ws + 3 * s * h, DType::f32, {s, h}, dev),
          Tensor(ws + 4 * s * h, DType::f32, {s, 2}, dev)};
}

void CudaBackend::nsp_head(const Tensor& workspace, int64_t s, int64_t h,
                           const PoolerParams& params, const Tensor& labels,
                           const GradScale& grad_scale, const Tensor& loss_sum,
                           const Tensor& num_correct, bool backward, const PoolerParams& grads) {
  const char* op = "nsp_loss";
  const auto [cls, pooled, dpooled, dcls, logits] = nsp_workspace(workspace, s, h);
  linear_forward(cls, params.dense_w, params.dense_b, Epilogue::bias, pooled, Tensor());
  launched(op, "tanh_inplace", cuda::tanh_inplace(pooled.ptr<float>(), s * h, stream_));
  linear_forward(pooled, params.cls_w, params.cls_b, Epilogue::bias, logits, Tensor());
  softmax_cross_entropy(logits, labels, grad_scale, loss_sum, num_correct,
                        backward ? logits : Tensor());
  if (!backward) return;
  linear_backward(pooled, params.cls_w, logits, dpooled, grads.cls_w, grads.cls_b, {});
  launched(op, "tanh_backward_inplace",
           cuda::tanh_backward_inplace(dpooled.ptr<float>(), pooled.ptr<float>(), s * h, stream_));
  linear_backward(cls, params.dense_w, dpooled, dcls, grads.dense_w, grads.dense_b, {});
}

// NSP with x (and dx) and the two weight matrices in bf16 / f16: only the [CLS] rows and the
// weights are widened (s x h and h x h + 2 h elements, against the adapter's [rows, h] staging
// of x and of dx both ways), the fp32 head runs on them in the workspace, and dcls is added to
// dx's [CLS] rows in fp32 and rounded once -- the CPU emulation's arithmetic exactly.
bool CudaBackend::nsp_loss_lowp(const SeqLayout& layout, const Tensor& x,
                                const PoolerParams& params, const Tensor& labels,
                                const GradScale& grad_scale, const Tensor& workspace,
                                const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                                const PoolerParams& grads) {
  const char* op = "nsp_loss";
  const DType t = x.dtype;
  auto is_f32 = [](const Tensor& v) { return !v.defined() || v.dtype == DType::f32; };
  if (!lowp::is_lowp(t) || params.dense_w.dtype != t || params.cls_w.dtype != t ||
      (dx.defined() && dx.dtype != t) || !is_f32(params.dense_b) || !is_f32(params.cls_b) ||
      !is_f32(workspace) || !is_f32(loss_sum) || !is_f32(grads.dense_w) || !is_f32(grads.dense_b) ||
      !is_f32(grads.cls_w) || !is_f32(grads.cls_b))
    return false;
  PoolerParams shapes = params;
  shapes.dense_w = shape_of(params.dense_w);
  shapes.cls_w = shape_of(params.cls_w);
  const auto [h, s] =
      checks::nsp_loss_args(checks::OpArgs(op, Device::cuda, pointer_check()), layout, shape_of(x),
                            shapes, labels, workspace, shape_of(dx), grads);
  begin(op);
  device_layout(op, layout, layout.rows, checks::EmptySeqs::allowed);
  if (s == 0) {
    end(op);
    return true;
  }
  const cuda::FloatFormat f = float_format(op, "x", x);
  const auto es = static_cast<int64_t>(dtype_size(t));
  // Scratch: the widened dense_w [h, h] and cls_w [2, h], the [CLS] rows as gathered [s, h].
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t wp_bytes = aligned(h * h * 4), wc_bytes = aligned(2 * h * 4);
  const int64_t slot_bytes = may_have_empty_slots(layout) ? aligned(2 * s * 4) : 0;
  char* scratch = static_cast<char*>(
      scratch_bytes(op, static_cast<size_t>(wp_bytes + wc_bytes + slot_bytes + s * h * es)));
  PoolerParams wide = params;
  wide.dense_w = Tensor(scratch, DType::f32, {h, h}, Device::cuda);
  wide.cls_w = Tensor(scratch + wp_bytes, DType::f32, {2, h}, Device::cuda);
  const auto [cls_row, slot_label] =
      nsp_slots(op, layout, labels, reinterpret_cast<int32_t*>(scratch + wp_bytes + wc_bytes),
                slot_bytes > 0);
  void* cls16 = scratch + wp_bytes + wc_bytes + slot_bytes;
  const cuda::FloatFormat f32 = cuda::FloatFormat::f32;
  launched(op, "convert",
           cuda::convert(params.dense_w.data, f, wide.dense_w.data, f32, h * h, stream_));
  launched(op, "convert",
           cuda::convert(params.cls_w.data, f, wide.cls_w.data, f32, 2 * h, stream_));
  const Tensor cls = nsp_workspace(workspace, s, h)[0];
  launched(op, "gather_rows",
           cuda::gather_rows(x.data, cls_row.ptr<int32_t>(), cls16, f, s, h, stream_));
  launched(op, "convert", cuda::convert(cls16, f, cls.data, f32, s * h, stream_));
  nsp_head(workspace, s, h, wide, slot_label, grad_scale, loss_sum, num_correct, dx.defined(),
           grads);
  if (dx.defined())  // dx[cls_row[i]] += dcls[i] (distinct rows, -1 skipped), in fp32, rounded once
    launched(op, "add_rows_f32",
             cuda::add_rows_f32(nsp_workspace(workspace, s, h)[3].ptr<float>(),
                                cls_row.ptr<int32_t>(), dx.data, f, s, h, stream_));
  end(op);
  return true;
}

}  // namespace packbert
