// The CUDA backend's kernels as plain launch functions: raw device pointers in, a cudaError_t
// out (the launch's cudaGetLastError). The host side (cuda_backend*.cpp, plain C++) checks every
// argument before it calls one of these and turns an error into packbert::Error naming the op;
// the .cu files hold only device code and launch configurations.
//
// Determinism: no kernel here uses floating-point atomics. Every reduction runs in a fixed order
// (per-thread sequential loops, then fixed warp/block trees, then fixed-order second passes),
// so a result never depends on scheduling.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/philox.h"

namespace packbert::cuda {

// The device arrays of a SeqLayout.
struct DeviceLayout {
  const int32_t* seq_start = nullptr;
  const int32_t* seq_len = nullptr;
  const int64_t* sample_id = nullptr;
  const int32_t* token_seq = nullptr;
  const int32_t* token_pos = nullptr;
  int64_t rows = 0;
  int32_t num_seqs = 0;
  int32_t max_len = 0;
};

// The storage formats of float buffers (kernels/base/tensor.h's DType is not visible to the .cu
// files; the host side maps it with float_format()).
enum class FloatFormat : int32_t { f32 = 0, bf16 = 1, f16 = 2 };

// ---- float-format conversions (convert_kernels.cu) -----------------------------------------
// dst = src * scale in another format, n elements: widening exact, narrowing to nearest even
// (common/lowp_convert.h, the functions the CPU backend uses); the product is in fp32, exact
// for a power-of-two scale.
cudaError_t convert(const void* src, FloatFormat src_format, void* dst, FloatFormat dst_format,
                    int64_t n, cudaStream_t s, float scale = 1.f);
// The same over rows x cols elements of row-major buffers with leading dimensions src_ld and
// dst_ld (>= cols): a column block of one buffer into a dense one (the MLM decoder's backward).
cudaError_t convert_rows(const void* src, FloatFormat src_format, int64_t src_ld, void* dst,
                         FloatFormat dst_format, int64_t dst_ld, int64_t rows, int64_t cols,
                         cudaStream_t s, float scale = 1.f);

// ---- FP8 (fp8_kernels.cu; Backend::fp8_cast, fp8_gemm) ----------------------------------------
// src [n, c] times scale[0] into out [n_out, c] and / or out_t [c, n_t] (either may be null),
// e4m3 or e5m2 (common/fp8_convert.h); rows past n and rows whose rows[r] < 0 written 0 and left
// out of amax (null: none), which takes the maximum of the |v| bit patterns.
cudaError_t fp8_cast(const void* src, FloatFormat src_format, const int32_t* rows,
                     const float* scale, float* amax, uint8_t* out, uint8_t* out_t, int64_t n,
                     int64_t c, int64_t n_out, int64_t n_t, bool e4m3, cudaStream_t s);
// out [rows, cols] (format f) from an FP8 GEMM's fp32 result acc, rounded once: mode 0 adds
// the bias (null: none); 1 / 2 add it and apply the erf / tanh GELU, writing the argument to pre
// first; 3 / 4 multiply by the erf / tanh GELU's derivative at pre. The CPU's order.
cudaError_t fp8_epilogue(const float* acc, const float* bias, void* out, void* pre, FloatFormat f,
                         int64_t rows, int64_t cols, int mode, cudaStream_t s);
// Backend::fp8_amax_share and fp8_scale_update over n operands (common/fp8_convert.h).
cudaError_t fp8_amax_share(const float* amax, int64_t rank, double* shared, int64_t n,
                           int64_t ranks, cudaStream_t s);
cudaError_t fp8_scale_update(const double* shared, const float* fp8_max, int margin, float* history,
                             float* scales, float* amax, int64_t n, int64_t ranks, int64_t h,
                             cudaStream_t s);

// ---- rotary position embeddings (rotary_kernels.cu) ----------------------------------------
// Backend::rotary_embedding on qkv [l.rows, 3 * hidden] in format f, in place: the pairs
// (i, i + d/2) of every head (d = hidden / heads, even) of q and k rotated by
// token_pos * theta^(-2i/d) (by its negative with inverse); rows with token_seq < 0 untouched.
cudaError_t rotary_embedding(const DeviceLayout& l, void* qkv, FloatFormat f, int64_t hidden,
                             int heads, float theta, bool inverse, cudaStream_t s);

// ---- gated MLP activations (glu_kernels.cu) ------------------------------------------------
// act: GluAct's value (common/glu_math.h's kGlu*; another is cudaErrorInvalidValue). Each
// tensor in its own format. glu_forward: out [n, i] = act(x[:, :i]) * x[:, i:], x [n, 2i].
cudaError_t glu_forward(const void* x, FloatFormat xf, void* out, FloatFormat of, int act,
                        int64_t n, int64_t i, cudaStream_t s);
// glu_backward: dx [n, 2i] from x [n, 2i] and dout [n, i] (kernels/ops/glu.h).
cudaError_t glu_backward(const void* x, FloatFormat xf, const void* dout, FloatFormat df, void* dx,
                         FloatFormat gf, int act, int64_t n, int64_t i, cudaStream_t s);

// ---- elementwise (elementwise_kernels.cu) --------------------------------------------------
// gelu_forward / gelu_backward_inplace on bf16 / f16 buffers (format f for both), fp32 math.
cudaError_t gelu_forward_lowp(const void* pre, void* out, FloatFormat f, int64_t n, bool tanh_form,
                              cudaStream_t s);
cudaError_t gelu_backward_inplace_lowp(void* g, const void* pre, FloatFormat f, int64_t n,
                                       bool tanh_form, cudaStream_t s);
// out = gelu(pre), n elements: the erf GELU of common/math.h, or with tanh_form its tanh
// approximation (gelu_tanh).
cudaError_t gelu_forward(const float* pre, float* out, int64_t n, bool tanh_form, cudaStream_t s);
// g *= gelu'(pre), n elements, of the same form.
cudaError_t gelu_backward_inplace(float* g, const float* pre, int64_t n, bool tanh_form,
                                  cudaStream_t s);
// c[r, :] += bias for rows x cols (the fallback when cuBLASLt's BIAS epilogue is unavailable).
cudaError_t add_bias_rows(float* c, const float* bias, int64_t rows, int64_t cols, cudaStream_t s);
// dst[i] += src[i].
cudaError_t add_inplace(float* dst, const float* src, int64_t n, cudaStream_t s);
// x = tanh(x); dp *= 1 - p^2.
cudaError_t tanh_inplace(float* x, int64_t n, cudaStream_t s);
cudaError_t tanh_backward_inplace(float* dp, const float* p, int64_t n, cudaStream_t s);

// ---- reductions (reduce_kernels.cu) --------------------------------------------------------
// out[c] += sum over rows of x[r * ld + c] (c < cols), in double, rows in fixed chunks of
// kColumnChunk summed in order, then the chunks in order. partial: doubles, at least
// column_sum_partials(rows, cols).
constexpr int64_t kColumnChunk = 256;
inline int64_t column_sum_partials(int64_t rows, int64_t cols) {
  return (rows + kColumnChunk - 1) / kColumnChunk * cols;
}
cudaError_t add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, double* partial,
                            float* out, cudaStream_t s);
// Sum of squares of n floats into partial[block] (blocks of kNormChunk, double, fixed tree),
// then the sum of the partials in order: root[0] = its square root rounded to f32 (l2_norm), or,
// with root null, sum[0] = the double sum (sum_squares). partial: l2_norm_partials(n) doubles.
constexpr int64_t kNormChunk = 8192;
inline int64_t l2_norm_partials(int64_t n) { return (n + kNormChunk - 1) / kNormChunk; }
cudaError_t sum_of_squares(const float* x, int64_t n, double* partial, float* root, double* sum,
                           cudaStream_t s);
// root[0] = the square root, rounded to f32, of the sum of sums[0..k) (sum_of_squares's second
// half: its partials' sum in the same order).
cudaError_t root_of_sums(const double* sums, int64_t k, float* root, cudaStream_t s);

// ---- rows by index (gather_scatter_kernels.cu) ---------------------------------------------
// An index of -1 is an unused slot: the gather writes its row as 0, the scatters skip it.
// out[i, :] = x[index[i], :] (h columns), x and out in format f (bf16 / f16: a bit copy).
cudaError_t gather_rows(const void* x, const int32_t* index, void* out, FloatFormat f, int64_t m,
                        int64_t h, cudaStream_t s);
// dx[index[i], :] += dout[i, :] for i in order, dx [rows, h] and dout in format f (each add in
// fp32, rounded to f). Rows hit once are added in parallel; only when an index repeats does one
// thread per column walk the later contributors in order. scratch: rows + 1 uint32.
cudaError_t scatter_add_rows_ordered(const void* dout, const int32_t* index, void* dx,
                                     FloatFormat f, int64_t m, int64_t h, int64_t rows,
                                     uint32_t* scratch, cudaStream_t s);
// dx[index[i], :] += src[i, :] (h columns) for m DISTINCT indices (but -1): src fp32, dx in
// format f, each sum in fp32 rounded once to f (the NSP head's [CLS] rows).
cudaError_t add_rows_f32(const float* src, const int32_t* index, void* dx, FloatFormat f, int64_t m,
                         int64_t h, cudaStream_t s);

// ---- softmax cross-entropy (loss_kernels.cu) -----------------------------------------------
// Softmax cross-entropy over m rows of v logits. Per row (one block): first argmax, lse, loss;
// dlogits (may alias logits, may be null) = (softmax - onehot) * grad_scale, the factor read
// from grad_scale_ptr when it is not null. A label of -1 leaves its row out (loss 0, not
// correct, dlogits 0). Row losses and correct flags go to row_loss / row_correct (m doubles
// each), then one block adds their sums (in row order) to loss_sum[0] and num_correct[0].
cudaError_t softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t m, int64_t v,
                                  float grad_scale, const float* grad_scale_ptr, float* dlogits,
                                  double* row_loss, double* row_correct, float* loss_sum,
                                  int32_t* num_correct, cudaStream_t s);

// The NSP head's rows and labels (loss_kernels.cu): for each of s slots, cls_row = seq_start and
// slot_label = labels, or -1 for both where seq_len is 0 (an empty slot, left out).
cudaError_t nsp_slots(const int32_t* seq_start, const int32_t* seq_len, const int32_t* labels,
                      int64_t s, int32_t* cls_row, int32_t* slot_label, cudaStream_t st);

// dst[0 .. n) = the values (n <= 8), carried as the kernel's arguments (Backend::write_floats).
struct FloatArgs {
  float v[8];
};
cudaError_t write_floats(float* dst, const FloatArgs& values, int n, cudaStream_t s);

// ---- LAMB (lamb_kernels.cu) ----------------------------------------------------------------
// LAMB over a work list of chunks (each inside one tensor, at most kNormChunk elements).
struct LambChunk {
  int64_t tensor;  // row of the table
  int64_t begin;   // first element (flat offset)
  int64_t end;     // one past the last
};
struct LambTensorRange {
  int64_t first_chunk;  // chunks [first_chunk, first_chunk + chunks) belong to the tensor
  int64_t chunks;
  float decay;    // weight decay of the tensor (0 for excluded tensors)
  int32_t adapt;  // trust ratio applies (decay tensor and weight_decay != 0)
  int64_t size;   // elements (StableAdamW's count)
};
struct LambArgs {
  int32_t rule;  // UpdateRule (kernels/ops/lamb.h)
  float lr, beta1, beta2, beta3, bias_correction1, bias_correction2, eps, max_grad_norm;
  float grad_scale;  // LambConfig::grad_scale (folded into the clip divisor)
  // LambConfig::step_scalars (may be null): lr, the bias corrections and grad_scale read from it
  // when the kernels run.
  const float* step_scalars;
};
// lamb_update: m, v and grads := u over the chunks, sums f64 [T, 2] per row (partial: doubles,
// one per chunk); a non-finite global_grad_norm / grad_scale skips it, and record (may be null)
// i32 [3] counts that (common/math.h, lamb_record_step). An empty table only updates the record
// (a rank of a sharded optimizer with no element of its own still counts the step).
cudaError_t lamb_update(const LambChunk* chunks, int64_t num_chunks, const LambTensorRange* tensors,
                        int64_t num_tensors, const LambArgs& args, const float* global_grad_norm,
                        const float* params, float* grads, float* m, float* v, double* sums,
                        double* partial, int32_t* record, cudaStream_t s);
// lamb_apply: w -= step * u with the norms from sums (the AdamW family: rule's step); params_lowp
// (may be null): the
// low-precision weight copy, written round(w) in the same pass; norms_ws (may be null) f32 [2T]
// (||w|| then ||u||).
cudaError_t lamb_apply(const LambChunk* chunks, int64_t num_chunks, const LambTensorRange* tensors,
                       int64_t num_tensors, int32_t rule, float lr, float grad_scale,
                       const float* step_scalars, const float* global_grad_norm, const double* sums,
                       float* params, const float* grads, void* params_lowp,
                       FloatFormat lowp_format, float* norms_ws, cudaStream_t s);

// ---- LayerNorm family (embedding_kernels.cu, layernorm_kernels.cu) -------------------------
// position, token_type, beta (and then segment_ids) may be null: nothing is added for them.
struct EmbeddingPtrs {
  const float* word;
  const float* position;
  const float* token_type;
  const float* gamma;
  const float* beta;
  const int32_t* input_ids;
  const int32_t* segment_ids;
  float eps;  // the LayerNorm's
};
cudaError_t embedding_forward(const DeviceLayout& l, const EmbeddingPtrs& p, int64_t h,
                              const DropoutStream& ds, float* out, float* mean, float* rstd,
                              cudaStream_t s);
// dout is scratch (overwritten with the gradient wrt the embedding sum: the d that
// embedding_scatter then adds into the tables); dgamma / dbeta may be null.
// partial: doubles, at least 2 * column_sum_partials(rows, h).
cudaError_t embedding_backward(const DeviceLayout& l, const EmbeddingPtrs& p, int64_t h,
                               const DropoutStream& ds, const float* mean, const float* rstd,
                               float* dout, float* dgamma, float* dbeta, double* partial,
                               cudaStream_t s);
// The tables' gradients from d [rows, h] (embedding_scatter.cu): dword[input_ids[r]],
// dpos[token_pos[r]], dtype[segment_ids[r]] += d[r] over the real rows; null tables are
// skipped. Parallel over table rows, in a fixed order: a table element hit by at most 256 rows
// adds them in row order (the CPU's sum, bit for bit); one hit more often (the [MASK] token, a
// token type) adds in-order sums of 256-row pieces, in order. scratch: at least
// embedding_scatter_scratch_bytes(rows, h, vocab + positions + types) bytes (0: a CUDA error).
size_t embedding_scatter_scratch_bytes(int64_t rows, int64_t h, int64_t key_limit);
cudaError_t embedding_scatter(const DeviceLayout& l, const int32_t* input_ids,
                              const int32_t* segment_ids, int64_t h, const float* d, float* dword,
                              int64_t vocab, float* dpos, int64_t positions, float* dtype,
                              int64_t types, void* scratch, size_t scratch_bytes,
                              cudaStream_t stream);
// h = dropout(x + bias) + residual; out = LN(h) * gamma + beta, LN with eps. bias / residual /
// beta may be null; ln_in may alias x. l is only read when dropout is enabled.
cudaError_t residual_layernorm_forward(const DeviceLayout& l, const float* x, const float* bias,
                                       const float* residual, const float* gamma, const float* beta,
                                       float eps, const DropoutStream& ds, int64_t rows, int64_t h,
                                       float* out, float* ln_in, float* mean, float* rstd,
                                       cudaStream_t s);
// dresidual may alias dout (unless dresidual_in: then dh adds what it holds) or be null;
// dbias / dgamma / dbeta may be null (+=). partial: doubles, at least
// 2 * column_sum_partials(rows, h).
cudaError_t residual_layernorm_backward(const DeviceLayout& l, const float* dout,
                                        const float* ln_in, const float* mean, const float* rstd,
                                        const float* gamma, const DropoutStream& ds, int64_t rows,
                                        int64_t h, float* dx, float* dresidual, bool dresidual_in,
                                        float* dbias, float* dgamma, float* dbeta, double* partial,
                                        cudaStream_t s);

// The same four ops with bf16 / f16 storage (their "lowp:" tensors), in one pass: load,
// the fp32 math of the functions above, store rounded to nearest even. The host dispatch sends
// only the combinations the model uses: the op's low-precision tensors all in one format f
// (bf16 or f16; the embedding tables f32 or f), every other float tensor f32; anything else
// returns cudaErrorInvalidValue.
struct EmbeddingLowpPtrs {
  const void* word;
  const void* position;
  const void* token_type;
  FloatFormat tables;  // of all three: f32 or the op's low-precision format
  const float* gamma;
  const float* beta;
  const int32_t* input_ids;
  const int32_t* segment_ids;
  float eps;
};
cudaError_t embedding_forward_lowp(const DeviceLayout& l, const EmbeddingLowpPtrs& p, int64_t h,
                                   const DropoutStream& ds, void* out, FloatFormat out_format,
                                   float* mean, float* rstd, cudaStream_t s);
// dout (format dout_format) is read, not overwritten: d [rows, h] fp32 is the scratch that takes
// the gradient wrt the embedding sum.
cudaError_t embedding_backward_lowp(const DeviceLayout& l, const EmbeddingLowpPtrs& p, int64_t h,
                                    const DropoutStream& ds, const float* mean, const float* rstd,
                                    const void* dout, FloatFormat dout_format, float* d,
                                    float* dgamma, float* dbeta, double* partial, cudaStream_t s);
// x, residual, out, ln_in in format f. The row's fp32 h stays in shared memory between the
// statistics and the normalisation, so h is at most kLowpLayerNormMaxHidden (the 48 KiB a block
// gets without opting in, less the reduction's 384 bytes).
constexpr int64_t kLowpLayerNormMaxHidden = 12160;
cudaError_t residual_layernorm_forward_lowp(const DeviceLayout& l, FloatFormat f, const void* x,
                                            const float* bias, const void* residual,
                                            const float* gamma, const float* beta, float eps,
                                            const DropoutStream& ds, int64_t rows, int64_t h,
                                            void* out, void* ln_in, float* mean, float* rstd,
                                            cudaStream_t s);
// dout, ln_in, dx, dresidual in format f. dx32: fp32 [rows, h] scratch, required with dbias
// (the bias gradient sums the unrounded dx).
cudaError_t residual_layernorm_backward_lowp(const DeviceLayout& l, FloatFormat f, const void* dout,
                                             const void* ln_in, const float* mean,
                                             const float* rstd, const float* gamma,
                                             const DropoutStream& ds, int64_t rows, int64_t h,
                                             void* dx, void* dresidual, bool dresidual_in,
                                             float* dx32, float* dbias, float* dgamma, float* dbeta,
                                             double* partial, cudaStream_t s);

// ---- attention (attention_kernels.cu) ------------------------------------------------------
constexpr int kAttentionMaxHeadDim = 64;  // the fp32 kernels' shared-memory row width
cudaError_t attention_forward(const DeviceLayout& l, const float* qkv, int64_t hidden, int heads,
                              const DropoutStream& ds, float* out, float* lse, cudaStream_t s);
cudaError_t attention_backward(const DeviceLayout& l, const float* qkv, const float* out,
                               const float* lse, const float* dout, int64_t hidden, int heads,
                               const DropoutStream& ds, float* dqkv, cudaStream_t s);

}  // namespace packbert::cuda
