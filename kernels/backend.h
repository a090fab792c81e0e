// The ops the BERT model calls, at the granularity the GPU fuses them. The model is written once
// against this interface; CpuBackend (kernels/cpu, fp32, the executable specification) and a
// CUDA backend implement it.
//
// Conventions for every op:
// - Buffers are row-major Tensor views; the caller owns every input, output and workspace (no
//   allocation inside an op, except the small grow-only scratch an op documents).
// - Token-wise buffers are [rows, hidden]. SeqLayout says which rows belong to which sequence,
//   so one op serves the three layouts: unpadded (sequences end to end), packed (rows of
//   max_seq_len holding several sequences) and padded (one sequence per max_seq_len slot).
//   Token-wise ops run on every row, padding rows included; only attention knows sequences.
// - Activation gradients are written (=); parameter gradients are accumulated (+=), which lets
//   the tied word embedding gather both of its gradients and lets micro-steps accumulate.
// - "none" (a default Tensor) marks an optional argument that is not given.
// - Precision (mixed precision, BertOptions::precision): every float tensor is f32, except
//   those an op's "lowp:" line names, which may also be bf16 or f16 (each tensor on its own;
//   the model passes one dtype for all of them). Low precision is storage only: every op
//   computes in fp32 and rounds what it writes to nearest even; an output the op accumulates
//   into is read, added in fp32 and rounded. Never low precision: LayerNorm means / rstds,
//   attention lse, loss sums, biases and LayerNorm parameters, parameter gradients (dw, db and
//   the rest: gradients accumulate in fp32), workspaces, and everything of the optimizer except
//   lamb_step's params_lowp. A call that gives one of those in bf16 / f16 is an error naming
//   the argument. Both backends take every combination the lowp lines allow: the CPU backend
//   emulates it exactly (widen, fp32 op, round; common/lowp_adapter.h), the CUDA backend runs
//   the GEMMs natively (cuBLASLt, fp32 accumulation) and the other ops through the same
//   adapter or native kernels. Tolerance of low precision against fp32: DESIGN.md, Testing.
// - Dropout never depends on where a token sits: see Dropout and kernels/common/philox.h.
// - A Backend object is used by one host thread at a time (it keeps scratch); ops run in call
//   order (on CUDA: in stream order, so a result is on the host only after copy()).
//
// One encoder layer (post-LN BERT) against these ops; x is the layer input [rows, H]:
//   linear_forward(x, Wqkv, bqkv, bias -> qkv)              Wqkv = query|key|value weights [3H, H]
//   attention_forward(qkv -> ctx, lse)                      site attention_probs
//   linear_forward(ctx, Wo, none -> a)                      its bias goes to the next op
//   residual_layernorm_forward(a, bo, residual x -> h1, ln1_in, ...)   site attention_output
//   linear_forward(h1, W1, b1, bias_gelu -> f, pre)
//   linear_forward(f, W2, none -> o)
//   residual_layernorm_forward(o, b2, residual h1 -> y, ln2_in, ...)   site ffn_output
// Backward, from dy:
//   residual_layernorm_backward(dy -> do, dresidual dh1; db2, dln2)
//   linear_backward(f, W2, do -> dx = d(pre) via x_gelu_pre = pre; dW2)
//   linear_backward(h1, W1, d(pre) -> dx += into dh1 (dx_accumulate); dW1, db1)
//   residual_layernorm_backward(dh1 -> da, dresidual dx; dbo, dln1)
//   linear_backward(ctx, Wo, da -> dctx; dWo)
//   attention_backward(dctx -> dqkv)
//   linear_backward(x, Wqkv, dqkv -> dx += (dx_accumulate); dWqkv, dbqkv)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "kernels/base/tensor.h"

namespace packbert {

// BERT's LayerNorm epsilon, everywhere (embeddings, encoder, MLM transform).
constexpr float kLayerNormEps = 1e-12f;

// Where the tokens of one micro-batch sit in the token-wise buffers. Every tensor lives on the
// backend's device. A row that belongs to no sequence is padding: token_seq = -1.
struct SeqLayout {
  int64_t rows = 0;      // rows of every token-wise buffer
  int32_t num_seqs = 0;
  int32_t max_len = 0;   // the longest sequence (sizes the CPU attention scratch)
  Tensor seq_start;      // i32 [num_seqs]: row of each sequence's first token ([CLS])
  Tensor seq_len;        // i32 [num_seqs]: tokens of each sequence, >= 1; or 0, an empty slot
                         // (no row names it: a fixed-capacity batch's unused sequence, which
                         // the token-wise ops skip and nsp_loss leaves out)
  Tensor sample_id;      // i64 [num_seqs]: global sample id (the dropout key), < 2^44
  Tensor token_seq;      // i32 [rows]: sequence of each row, -1 for padding
  Tensor token_pos;      // i32 [rows]: position inside its sequence (0 for padding); this is
                         // also the position-embedding index, so positions restart per sequence
  // Optional: a host copy of seq_len (num_seqs values, equal to it), when the caller has one
  // (the model keeps its batch's). A device backend then plans its attention launches without
  // reading seq_len back, which would wait for the stream; with index validation on it checks
  // the copy against seq_len.
  const int32_t* host_seq_len = nullptr;
  // Attention's launches from num_seqs and max_len alone, never from the lengths: one grid of
  // num_seqs x max_len (a block past a shorter sequence's end exits at once), sequences in
  // layout order, no lengths read on the host and no work list uploaded. So the launches are the
  // same for every batch of this num_seqs and max_len, as a CUDA graph replayed over new batches
  // needs; max_len is then a bound every sequence keeps to. The same results, bit for bit, as
  // the length-bucketed launches (more blocks that exit at once). The CPU backend ignores it.
  bool fixed_launch = false;
};

enum class DropoutSite : uint32_t {
  embedding = 0,         // after the embedding LayerNorm
  attention_probs = 1,   // on the softmax probabilities
  attention_output = 2,  // on the attention output projection, before the residual add
  ffn_output = 3,        // on the FFN output projection, before the residual add
};

// One dropout site of one step. The mask of an element is Philox(seed; step, sample id, layer,
// site, head, position inside the sample, element) (kernels/common/philox.h). p = 0 disables
// dropout (evaluation); padding rows are never dropped.
struct Dropout {
  float p = 0.f;
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t layer = 0;    // encoder layer; the embedding uses 0 (the site tells them apart)
  DropoutSite site = DropoutSite::embedding;
  // Optional: i32 [1] in the backend's memory holding the step (equal to `step` when the op is
  // issued), read when the op runs instead of `step`, so that a CUDA graph captured at one step
  // replays with the masks of the step its memory holds then (the model uploads it with each
  // batch). Its value must keep to the step's range (< 2^24), which is checked on `step`.
  Tensor device_step;
};

// The factor a loss's gradient is multiplied by (softmax_cross_entropy, mlm_loss, nsp_loss): the
// step's 1 / global count times the loss scale. Optional: f32 [1] in the backend's memory holding
// the factor (equal to `value` when the op is issued), read when the op runs instead of `value`,
// so that a CUDA graph captured at one step replays with the factor of the step its memory holds
// then (the model uploads it with each batch). A float converts to a factor without one.
struct GradScale {
  float value = 1.f;
  Tensor device;
  GradScale(float v = 1.f) : value(v) {}  // NOLINT: implicit, a plain factor
  GradScale(float v, const Tensor& d) : value(v), device(d) {}
};

// The two GELUs BERT checkpoints are trained with: the exact x Phi(x) (erf; Hugging Face's
// "gelu", the default) and the tanh approximation of Google's original BERT and NVIDIA's MLPerf
// implementation (Hugging Face's "gelu_new"), which cuBLASLt's GELU epilogues compute. Formulas:
// kernels/common/math.h.
enum class Gelu { erf, tanh };

// Linear epilogues: what is applied to x * w^T before it is written. bias_gelu is the erf GELU,
// bias_gelu_tanh the tanh approximation.
enum class Epilogue { none, bias, bias_gelu, bias_gelu_tanh };

inline bool has_gelu(Epilogue e) { return e == Epilogue::bias_gelu || e == Epilogue::bias_gelu_tanh; }
inline Gelu gelu_of(Epilogue e) { return e == Epilogue::bias_gelu_tanh ? Gelu::tanh : Gelu::erf; }
inline Epilogue bias_gelu_epilogue(Gelu g) {
  return g == Gelu::tanh ? Epilogue::bias_gelu_tanh : Epilogue::bias_gelu;
}

struct LinearBackwardOptions {
  // The forward used a GELU epilogue with this pre-activation [N, M]: dout is the gradient
  // wrt gelu(pre) and is turned into the gradient wrt pre IN PLACE before anything else.
  Tensor out_gelu_pre;
  // The input x was gelu(x_gelu_pre) [N, K] (FFN2 after FFN1): dx is written as the gradient
  // wrt x_gelu_pre, i.e. (dout * w) * gelu'(x_gelu_pre) -- the dGELU fused into the dx GEMM.
  Tensor x_gelu_pre;
  // Which GELU the two pre-activations above went through.
  Gelu gelu = Gelu::erf;
  // dx += instead of dx = (where a residual branch already wrote its share).
  bool dx_accumulate = false;
};

// What Backend::fp8_gemm applies to its product.
struct Fp8GemmOptions {
  // linear_forward's epilogues: bias f32 [m]; the GELUs write pre [n, m] (out's dtype).
  Epilogue epilogue = Epilogue::none;
  Tensor bias, pre;
  // An input gradient through a GELU: out = product * gelu'(dgelu_pre) (dgelu_pre [n, m],
  // out's dtype; the form `gelu`), as linear_backward's x_gelu_pre.
  Tensor dgelu_pre;
  Gelu gelu = Gelu::erf;
  // out += product, added in fp32 and rounded once (Epilogue::none, no dgelu_pre).
  bool accumulate = false;
  // Lets the GPU accumulate in its faster, less exact way (cuBLASLt's FP8 fast accumulation);
  // the CPU ignores it.
  bool fast_accum = false;
};

struct EmbeddingParams {
  Tensor word;        // [vocab, H]
  Tensor position;    // [max_positions, H]
  Tensor token_type;  // [type_vocab, H]
  Tensor ln_gamma;    // [H]
  Tensor ln_beta;     // [H]
};

struct LayerNormParams {
  Tensor gamma;  // [H]
  Tensor beta;   // [H]
};

struct PoolerParams {
  Tensor dense_w;  // [H, H]   pooler dense
  Tensor dense_b;  // [H]
  Tensor cls_w;    // [2, H]   NSP classifier
  Tensor cls_b;    // [2]
};

// One tensor of the flat parameter buffer as LAMB sees it (a row of an i64 [T, 3] tensor).
struct LambTensor {
  int64_t offset;  // first element in the flat buffers
  int64_t size;    // elements
  int64_t decay;   // 1: weight decay and trust ratio apply; 0: excluded (LayerNorm, biases)
};

struct LambConfig {
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

// Floats of the workspace nsp_loss needs.
inline int64_t nsp_workspace_elems(int64_t num_seqs, int64_t hidden) {
  return num_seqs * (4 * hidden + 2);
}

class Backend;

// Memory of a backend's device, owned by the backend that made it (Backend::alloc) and given
// back to it when this object goes: the model and the optimizer hold their parameters, moments
// and activations in these and never name a device allocator (as ggml's backend buffers).
// Move-only; a default one holds nothing. It must not outlive its backend.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  // The memory `data` of `bytes` from owner->allocate_memory, seen as `view` (u8 [bytes] when
  // none is given).
  BackendBuffer(Backend* owner, void* data, size_t bytes, const Tensor& view = Tensor());
  ~BackendBuffer() { reset(); }
  BackendBuffer(BackendBuffer&& o) noexcept { *this = std::move(o); }
  BackendBuffer& operator=(BackendBuffer&& o) noexcept;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  void reset();  // gives the memory back (never throws)
  void* data() const { return view_.data; }
  size_t bytes() const { return bytes_; }
  // The view it was made with (Backend::alloc(dtype, dims)), on the backend's device.
  const Tensor& tensor() const { return view_; }
  // Another typed view of the buffer's first bytes (Error when it does not fit).
  Tensor tensor(DType dtype, std::initializer_list<int64_t> dims) const;

 private:
  Backend* owner_ = nullptr;
  size_t bytes_ = 0;
  Tensor view_;
};

// A recorded sequence of ops (a CUDA graph), made by Backend::end_capture and replayed by
// Backend::replay on the memory and with the host arguments it was recorded with (device memory
// it reads, a dropout's device_step among it, is read as it is at the replay). Owned by the
// backend that made it and given back when this object goes; move-only; must not outlive it.
class BackendGraph {
 public:
  BackendGraph() = default;
  BackendGraph(Backend* owner, void* handle) : owner_(owner), handle_(handle) {}
  ~BackendGraph() { reset(); }
  BackendGraph(BackendGraph&& o) noexcept { *this = std::move(o); }
  BackendGraph& operator=(BackendGraph&& o) noexcept;
  BackendGraph(const BackendGraph&) = delete;
  BackendGraph& operator=(const BackendGraph&) = delete;
  void reset();  // gives the graph back (never throws)
  void* handle() const { return handle_; }
  bool defined() const { return handle_ != nullptr; }

 private:
  Backend* owner_ = nullptr;
  void* handle_ = nullptr;
};

// What the host asked of a device since the process started: host synchronisations, launches
// (kernels, library calls, memsets), graph launches and copies with a pageable host side
// (kernels/cuda/counters.h says exactly what counts). All zero for the CPU backend, which has no
// device to wait for.
struct BackendCounters {
  int64_t host_syncs = 0;
  int64_t launches = 0;
  int64_t graph_launches = 0;
  int64_t pageable_copies = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;

  // ---- memory and ordering -----------------------------------------------------------------
  // `bytes` of this backend's device memory, 256-byte aligned; an Error naming the size when
  // there is not enough. 0 bytes: nullptr. Give it back with free_memory (never throws;
  // nullptr: nothing). Callers use alloc(), which pairs the two.
  virtual void* allocate_memory(size_t bytes) = 0;
  virtual void free_memory(void* p) = 0;
  // `what` names the buffer in the Error an allocation that fails throws: the device, the bytes
  // asked, the device's free and total memory (memory_info) and what this backend's buffers
  // hold (allocated_bytes).
  BackendBuffer alloc(size_t bytes, const char* what = "a buffer");
  // A buffer holding one tensor of that shape (its tensor() is the view).
  BackendBuffer alloc(DType dtype, std::initializer_list<int64_t> dims,
                      const char* what = "a buffer");
  // Bytes held by the BackendBuffers alloc() made that are still alive.
  size_t allocated_bytes() const { return allocated_bytes_; }
  // Device memory the backend holds for itself, outside alloc(): the CUDA backend's cuBLASLt
  // workspace and its ops' grow-only scratch; 0 on the CPU.
  virtual size_t workspace_bytes() const { return 0; }
  // What the memory plan (train/memory_plan.h) says this process's buffers hold: an allocation
  // that fails says it beside what is held (0: no plan).
  void set_planned_bytes(size_t bytes) { planned_bytes_ = bytes; }
  size_t planned_bytes() const { return planned_bytes_; }
  // " (the plan: X MiB; ...)" when a plan was set, else empty: for out-of-memory messages.
  std::string planned_note() const;
  // The device's free and total memory now: the CUDA backend's cudaMemGetInfo; by default the
  // host's available and total RAM (/proc/meminfo).
  struct MemoryInfo {
    size_t free = 0, total = 0;
  };
  virtual MemoryInfo memory_info() const;
  // The host waits for every op issued so far (the CPU backend's ops are done when they
  // return: nothing to wait for).
  virtual void synchronize() {}
  // The native handle of the queue the ops run in, in issue order: a CUDA backend's
  // cudaStream_t; nullptr for the CPU backend. For code that orders device work of its own with
  // the ops (the NCCL gradient transport, src/comm/nccl_transport.h); the model and the
  // optimizer never need it.
  virtual void* native_stream() const { return nullptr; }
  // The process's counts of host work (BackendCounters); the trainer reports them per step.
  virtual BackendCounters counters() const { return {}; }

  // Why this backend's device cannot run FP8 GEMMs (fp8_gemm), naming it and its compute
  // capability; empty when it can (the CPU backend emulates them; a GPU needs compute
  // capability 8.9 or newer).
  virtual std::string fp8_unsupported() const { return {}; }

  // ---- graphs ------------------------------------------------------------------------------
  // Whether ops can be recorded into a BackendGraph (the CUDA backend: CUDA graphs by stream
  // capture; the CPU backend's ops run when they are called, so it records nothing).
  virtual bool supports_graphs() const { return false; }
  // The ops issued from begin_capture() until end_capture() are recorded, not run. They must
  // not wait for the device, allocate, or copy pageable memory (a backend that grows a scratch
  // buffer in an op does so on the op's first call: run the ops once before capturing them).
  // end_capture() returns the graph ready to replay; after an op failed during the capture,
  // call it anyway (it ends the capture) and discard what it returns. An Error where
  // unsupported.
  virtual void begin_capture();
  virtual BackendGraph end_capture();
  // Runs the recorded ops again, in op order with the ops issued around it. A graph stays valid
  // while the memory it was recorded with does: the backend's own (scratch it outgrows is kept
  // while a graph lives) and the caller's.
  virtual void replay(const BackendGraph& graph);
  // Gives a graph's resources back (BackendGraph::reset calls it; never throws).
  virtual void destroy_graph(void* handle) noexcept;
  // The ops recorded (begin_capture .. end_capture; a failure among them ends the capture and is
  // rethrown) and the graph replayed once: for the second use of ops whose first ran them.
  BackendGraph record_and_replay(const std::function<void()>& ops);

  // t = 0 (any dtype).
  virtual void zero(const Tensor& t) = 0;
  // dst f32 [n] = values (n <= 8, from the host) in op order, with nothing staged and nothing
  // waited for: per-step scalars that a recorded graph reads (LambConfig::step_scalars). The
  // default copies them; the CUDA backend launches one kernel that carries them as arguments.
  // Not during a capture (the values would be recorded).
  virtual void write_floats(const Tensor& dst, const float* values, int n);
  // dst = src: same dtype and element count (shapes may differ), no overlap. One side may be
  // host memory (weights, checkpoints; small copies go through upload and read).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // Host arrays into tensors of the backend's device, in op order: each dst receives its
  // dst.bytes() from src, host memory the caller may reuse once upload returns. The default
  // copies each with copy(); the CUDA backend stages them in pinned memory of its own (two
  // buffers used in turn) and copies them asynchronously, so that the host does not wait for
  // the device (kernels/cuda/cuda_backend.cpp). The batch goes up through prefetch (below).
  struct HostUpload {
    Tensor dst;
    const void* src = nullptr;
  };
  virtual void upload(const std::vector<HostUpload>& copies);
  // upload() ahead of the ops: the copies may run while ops issued before this call still run
  // (the CUDA backend copies on a stream of its own, so the next micro-batch goes up during the
  // current one's compute), and the ops issued after it see the data. Its copies wait only for
  // the ops issued before the PREVIOUS prefetch() call, so the destinations must not be memory
  // that ops issued since then use: the model's batch, in two buffers used in turn
  // (src/model/bert.h), was last read by the micro-step before the previous one. The default
  // is upload().
  virtual void prefetch(const std::vector<HostUpload>& copies) { upload(copies); }
  // Tensors of the backend's device into host memory, as the ops issued so far leave them, with
  // one wait for all of them: each dst receives src.bytes(). The default copies each with
  // copy(); the CUDA backend copies them into pinned memory and waits once.
  struct HostRead {
    void* dst = nullptr;
    Tensor src;
  };
  virtual void read(const std::vector<HostRead>& reads);

  // ---- embeddings ------------------------------------------------------------------------
  // out = dropout(LayerNorm(word[input_ids] + position[token_pos] + token_type[segment_ids])).
  // input_ids, segment_ids: i32 [rows] (padding rows: any valid id, e.g. 0). out: [rows, H].
  // Saves ln_mean, ln_rstd: f32 [rows] (the sum is re-gathered in backward). Site: embedding.
  // lowp: out; word, position, token_type (the model passes its 16-bit tables).
  virtual void embedding_forward(const SeqLayout& layout, const Tensor& input_ids,
                                 const Tensor& segment_ids, const EmbeddingParams& params,
                                 const Dropout& dropout, const Tensor& out, const Tensor& ln_mean,
                                 const Tensor& ln_rstd) = 0;
  // Gradients += for all five tensors of grads (each may be none). dout [rows, H] is used as
  // scratch and overwritten. Padding rows add nothing. Scatter-adds in a fixed row order.
  // lowp: dout; word, position, token_type. The gradients are f32.
  virtual void embedding_backward(const SeqLayout& layout, const Tensor& input_ids,
                                  const Tensor& segment_ids, const EmbeddingParams& params,
                                  const Dropout& dropout, const Tensor& ln_mean,
                                  const Tensor& ln_rstd, const Tensor& dout,
                                  const EmbeddingParams& grads) = 0;

  // ---- linear layers (GEMM + epilogue) ----------------------------------------------------
  // out = x * w^T (+ bias) (then gelu), PyTorch nn.Linear: x [N, K], w [M, K] (out_features x
  // in_features), bias [M], out [N, M], all row-major; fp32 accumulation. For bias_gelu and
  // bias_gelu_tanh, pre [N, M] keeps x * w^T + bias for backward.
  // lowp: x, w, out, pre; bias is f32. pre = round(x w^T + bias), out = round(gelu(.)) of the
  // fp32 pre-activation on the CPU, of the rounded one on CUDA (a difference of one rounding of
  // the argument, inside the precision's tolerance).
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                              Epilogue epilogue, const Tensor& out, const Tensor& pre) = 0;
  // Given dout [N, M]: dx = dout * w [N, K] (written, or see options), dw += dout^T * x [M, K],
  // db += column sums of dout [M]. dx, dw, db are each optional; x is needed only for dw.
  // Saves nothing; dout is read-only unless options.out_gelu_pre is given.
  // lowp: x, w, dout, dx, options.out_gelu_pre, options.x_gelu_pre; dw and db are f32 (the
  // weight gradients read low-precision operands and accumulate in fp32).
  virtual void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dout,
                               const Tensor& dx, const Tensor& dw, const Tensor& db,
                               const LinearBackwardOptions& options = {}) = 0;

  // ---- bias + dropout + residual add + LayerNorm -------------------------------------------
  // h = dropout(x + bias) + residual;  out = LayerNorm(h) * gamma + beta.
  // x, residual, out: [rows, H]; bias [H] and residual optional. Saves ln_in = h [rows, H]
  // (may alias x, which is then overwritten) and ln_mean, ln_rstd f32 [rows]; out aliases
  // neither. layout supplies the dropout keys and may be empty when dropout.p == 0 (the MLM
  // transform's plain LayerNorm: no bias, no residual, p = 0). Padding rows are never dropped.
  // lowp: x, residual, out, ln_in (h is formed in fp32, then stored rounded in ln_in, and the
  // statistics are those of the fp32 h).
  virtual void residual_layernorm_forward(const SeqLayout& layout, const Tensor& x,
                                          const Tensor& bias, const Tensor& residual,
                                          const LayerNormParams& ln, const Dropout& dropout,
                                          const Tensor& out, const Tensor& ln_in,
                                          const Tensor& ln_mean, const Tensor& ln_rstd) = 0;
  // From dout [rows, H] and the saved ln_in, ln_mean, ln_rstd: dh = LayerNorm backward,
  // dresidual = dh (written, optional; may alias dout), dx = dropout'(dh) (written, required),
  // dbias += column sums of dx, dln.gamma += sums of dout * xhat, dln.beta += sums of dout
  // (each optional). The same layout and dropout as the forward.
  // lowp: dout, ln_in, dx, dresidual.
  virtual void residual_layernorm_backward(const SeqLayout& layout, const Tensor& dout,
                                           const Tensor& ln_in, const Tensor& ln_mean,
                                           const Tensor& ln_rstd, const LayerNormParams& ln,
                                           const Dropout& dropout, const Tensor& dx,
                                           const Tensor& dresidual, const Tensor& dbias,
                                           const LayerNormParams& dln) = 0;

  // ---- attention ------------------------------------------------------------------------
  // Variable-length multi-head self-attention within each sequence of layout (never across).
  // qkv [rows, 3H]: per row q (H) | k (H) | v (H), each head-major (head h at h*d .. h*d+d-1,
  // d = H / num_heads). out [rows, H] = dropout(softmax(q k^T / sqrt(d))) v, head-major.
  // Saves lse f32 [rows, num_heads]: log-sum-exp of each query row's scaled scores (only this
  // backend's attention_backward reads it, so a backend may order it differently within the
  // same size, e.g. [heads, rows] as FlashAttention does). Rows of no sequence get out = 0 and
  // lse = 0. Site: attention_probs (position = query, element = key).
  // lowp: qkv, out (lse is f32).
  virtual void attention_forward(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                                 const Dropout& dropout, const Tensor& out, const Tensor& lse) = 0;
  // dqkv [rows, 3H] written (zero in rows of no sequence), from dout [rows, H], the forward's
  // qkv, out and lse, and the same dropout (its mask is recomputed, never stored). Zero rows
  // of no sequence are what keep padding out of the weight gradients in the padded layout.
  // CPU: two min(128, max_len) x max_len score blocks per thread (about 0.5 MiB at 512), kept by
  // the backend.
  // lowp: qkv, out, dout, dqkv (lse is f32).
  virtual void attention_backward(const SeqLayout& layout, const Tensor& qkv, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, int num_heads,
                                  const Dropout& dropout, const Tensor& dqkv) = 0;

  // ---- masked positions ----------------------------------------------------------------
  // out[i] = x[index[i]]: x [rows, H], index i32 [M] (rows of the masked positions), out [M, H].
  // An index of -1 is a slot of a fixed-capacity batch's masked positions that holds none: its
  // out row is 0, and the backward adds nothing for it.
  // lowp: x, out (and dout, dx of the backward).
  virtual void gather_rows(const Tensor& x, const Tensor& index, const Tensor& out) = 0;
  // dx = 0, then dx[index[i]] += dout[i] in order of i. dx [rows, H] is written whole.
  virtual void gather_rows_backward(const Tensor& dout, const Tensor& index,
                                    const Tensor& dx) = 0;

  // ---- losses ------------------------------------------------------------------------------
  // Per row: loss = logsumexp(logits) - logits[label]; correct = (first argmax == label).
  // logits [m, V], labels i32 [m] in [0, V), or -1: a row that is left out (no loss, never
  // correct, its dlogits 0; a fixed-capacity batch's unused masked slot). loss_sum f32 [1] += sum
  // of row losses (unscaled); num_correct i32 [1] += correct rows. dlogits [m, V] (optional, may
  // alias logits) = (softmax - onehot(label)) * grad_scale.
  // lowp: logits, dlogits (loss_sum is f32).
  virtual void softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                                     const GradScale& grad_scale, const Tensor& loss_sum,
                                     const Tensor& num_correct, const Tensor& dlogits) = 0;
  // The MLM decoder and loss over a chunk of m masked tokens, forward and backward at once (the
  // loss is the graph's end, so the logits never outlive the chunk -- the MST feature calls it
  // per chunk). logits = x w^T + b with x [m, H] (the transform's output), w [V, H] (tied word
  // embeddings), b [V]; logits_ws [m, V] is the workspace. loss_sum, num_correct as above;
  // grad_scale = 1 / global masked-token count; a label of -1 leaves its row out (as in
  // softmax_cross_entropy). If dx [m, H] is given: dx written, dw += and
  // db += (both optional); if dx is none, forward only.
  // lowp: x, w, dx; b, logits_ws, dw, db are f32 (the logits never leave fp32; CUDA rounds
  // their gradient to the operands' type for the two backward GEMMs, the CPU does not).
  virtual void mlm_loss(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& labels,
                        const GradScale& grad_scale, const Tensor& logits_ws, const Tensor& loss_sum,
                        const Tensor& num_correct, const Tensor& dx, const Tensor& dw,
                        const Tensor& db) = 0;
  // Pooler + NSP over each sequence's first token: pooled = tanh(x[cls] Wp^T + bp),
  // logits = pooled Wc^T + bc, cross-entropy with labels i32 [num_seqs] in {0, 1}.
  // x [rows, H]; loss_sum, num_correct accumulate as above; grad_scale = 1 / global sample
  // count. An empty slot (seq_len 0) is left out: no loss, not counted, no gradient, its label
  // not read. workspace f32 [nsp_workspace_elems(num_seqs, H)]; when dx is none the logits
  // f32 [num_seqs, 2] are left at workspace offset 4 * num_seqs * H (read by evaluation
  // hooks; with dx that memory holds their gradient). If dx [rows, H] is given, the
  // gradient is ADDED into dx's [CLS] rows (after gather_rows_backward wrote dx) and the
  // defined tensors of grads accumulate (+=).
  // lowp: x, dx, params.dense_w, params.cls_w; the biases, workspace and grads are f32.
  virtual void nsp_loss(const SeqLayout& layout, const Tensor& x, const PoolerParams& params,
                        const Tensor& labels, const GradScale& grad_scale, const Tensor& workspace,
                        const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                        const PoolerParams& grads) = 0;

  // ---- optimizer -------------------------------------------------------------------------
  // out f32 [1] = sqrt(sum x^2) of a flat f32 buffer, in a fixed reduction order (the same
  // result for any thread count).
  virtual void l2_norm(const Tensor& x, const Tensor& out) = 0;
  // out f64 [1] = sum x^2 of a flat f32 buffer, the double l2_norm takes the root of, in the
  // same fixed order: a rank's share of a global norm summed over ranks (the sharded
  // optimizer), which then rounds as l2_norm's over the whole buffer does.
  virtual void sum_squares(const Tensor& x, const Tensor& out) = 0;
  // out f32 [1] = sqrt(sum[0]) rounded to f32, for sum f64 [1] on the device: the norm l2_norm
  // gives from the sum sum_squares gives (bit for bit). The sharded optimizer's global norm from
  // its ranks' sums, added on the device: no host round trip.
  virtual void norm_from_sum_squares(const Tensor& sum, const Tensor& out) = 0;
  // One LAMB step (apex FusedLAMB: adam_w_mode, grad averaging, bias correction) over the flat
  // f32 buffers params (fp32 master weights), grads, m, v, all [n], in two passes, so that a
  // tensor cut between ranks (the sharded optimizer, optim/distributed_lamb.h) has the sums of
  // its norms added over the ranks in between. table i64 [T, 3] of LambTensor rows, in HOST
  // memory on every backend (it shapes the launch, as host_seq_len does attention's): a device
  // backend derives its work list from it once and keeps that on the device while the rows and
  // the weight decay stay the same, so a step reads nothing back and waits for nothing. Rows
  // ascend by offset without overlap; elements outside every row are left alone.
  // global_grad_norm f32 [1] (the all-reduced gradient norm): gradients are divided by
  // max(1, norm / max_grad_norm). Per tensor: u = m^/(sqrt(v^)+eps) + wd*w (wd only for decay
  // tensors), w -= lr * (decay tensor and wd != 0 and both norms > 0 ? ||w||/||u|| : 1).
  // A non-finite global_grad_norm / grad_scale skips the step on the device, with no read-back:
  // params, m, v and params_lowp stay as they were (grads, sums and norms_ws are then
  // unspecified).
  //
  // lamb_update: m and v updated in place, grads overwritten with u (as apex does, saving a
  // buffer), and sums f64 [T, 2] = (sum of w^2 before the step, sum of u^2) per row, each added
  // in a fixed order within the row (l2_norm's blocks from the row's first element). record
  // (optional) i32 [3] keeps count (common/math.h, lamb_record_step): [0] skipped steps, [1]
  // the current run of them (0 after a step that updated), [2] the longest run.
  virtual void lamb_update(const Tensor& table, const LambConfig& config,
                           const Tensor& global_grad_norm, const Tensor& params,
                           const Tensor& grads, const Tensor& m, const Tensor& v,
                           const Tensor& sums, const Tensor& record = Tensor()) = 0;
  // lamb_apply: the norms of each row from its sums (the square root rounded to f32, as
  // l2_norm), the trust ratio, and w -= step * u with u read from grads. params_lowp (optional)
  // bf16 / f16 [n]: the low-precision copy of the weights that mixed precision's GEMMs read,
  // written in the same pass: round-to-nearest-even of each updated master weight (elements
  // outside every row are left alone). Without it the op is the fp32 step, bit for bit.
  // norms_ws (optional) f32 [2T] receives ||w|| (before the step) of every row, then ||u||.
  virtual void lamb_apply(const Tensor& table, const LambConfig& config,
                          const Tensor& global_grad_norm, const Tensor& sums,
                          const Tensor& params, const Tensor& grads,
                          const Tensor& params_lowp = Tensor(),
                          const Tensor& norms_ws = Tensor()) = 0;
  // lamb_update then lamb_apply over the same sums: the whole step on one device (tests and
  // benchmarks; it allocates its f64 [T, 2] sums on every call, the optimizer keeps its own).
  // norms_ws f32 [2T] as lamb_apply's.
  void lamb_step(const Tensor& table, const LambConfig& config, const Tensor& global_grad_norm,
                 const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                 const Tensor& norms_ws, const Tensor& params_lowp = Tensor(),
                 const Tensor& record = Tensor());

  // ---- precision -------------------------------------------------------------------------
  // dst = src in another float dtype, same element count, no overlap: f32 -> bf16 / f16 rounds
  // to nearest even (NaN kept, overflow to infinity), bf16 / f16 -> f32 is exact; equal dtypes
  // copy. The model fills its low-precision weight copy with it (after initialisation or a
  // checkpoint load; afterwards lamb_step keeps it current).
  virtual void convert(const Tensor& dst, const Tensor& src) = 0;

  // ---- FP8 (train.precision = "fp8"; docs/fp8.md) -----------------------------------------
  // An FP8 operand is an e4m3 or e5m2 tensor holding fp8(v * s) of the values v it was cast from
  // (common/fp8_convert.h: nearest even, saturating, a non-finite v to NaN) with its scale, an
  // f32 [2] tensor in the backend's memory: [0] = s, a power of two, [1] = 1 / s, which the GEMM
  // multiplies its products by (both exact). Scales and amaxes are read and written where the
  // ops run, so a CUDA graph replays with the values its memory holds then.
  //
  // fp8_cast: src [n, c] (f32, bf16 or f16) times scale[0] into out [n_out, c] and / or its
  // transpose out_t [c, n_t] (both of one FP8 dtype), n_out, n_t >= n. Written 0: the rows of
  // out (columns of out_t) from n on, and the rows whose entry in `rows` (optional, i32 [n],
  // SeqLayout::token_seq) is negative, padding. amax (optional) f32 [1]:
  // amax = max(amax, |v|) over the values of the other rows, compared as IEEE bit patterns (a
  // NaN above infinity), so that no order of the reduction changes it. With neither output the
  // op takes the amax only (scale may then be none).
  virtual void fp8_cast(const Tensor& src, const Tensor& rows, const Tensor& scale,
                        const Tensor& amax, const Tensor& out, const Tensor& out_t) = 0;
  // fp8_gemm: out [n, m] = (a [n, k] b [m, k]^T) * a_scale[1] * b_scale[1], fp32 accumulation,
  // then the options' epilogue, out rounded once. Both operands K-major (the layout cuBLASLt's
  // FP8 GEMMs take), e4m3 or e5m2, not both e5m2; n, k and m multiples of 16 (the model pads
  // its rows); out bf16, f16 or f32. The CPU computes exactly that: the operands widened and
  // de-scaled (exact), an fp32 GEMM, the epilogue in fp32 (linear_forward's order).
  virtual void fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b,
                        const Tensor& b_scale, const Tensor& out,
                        const Fp8GemmOptions& options) = 0;
  // Delayed scaling's bookkeeping over n operands, once per optimizer step (docs/fp8.md).
  // fp8_amax_share: shared f64 [ranks, n] = 0 but row `rank` = amax f32 [n], widened: summed
  // over ranks (one small all-reduce) it holds every rank's amax, exactly.
  virtual void fp8_amax_share(const Tensor& amax, int rank, const Tensor& shared) = 0;
  // fp8_scale_update: per operand i, a = the largest |shared[r, i]| over the ranks (a NaN
  // above everything). A finite a is pushed into history f32 [n, h] (row i, oldest first: the
  // row shifts left by one), and then scales f32 [n, 2] = {s, 1 / s} with
  // s = fp8_scale(max of the row, fp8_max[i], margin, the previous s) (common/fp8_convert.h). A
  // non-finite a (a step the overflow check skips) changes neither. amax f32 [n] is set to 0
  // for the next step.
  virtual void fp8_scale_update(const Tensor& shared, const Tensor& fp8_max, int margin,
                                const Tensor& history, const Tensor& scales,
                                const Tensor& amax) = 0;

 private:
  friend class BackendBuffer;  // gives its bytes back to allocated_bytes_
  void* allocate_named(size_t bytes, const char* what);
  size_t allocated_bytes_ = 0;
  size_t planned_bytes_ = 0;
};

// The reference backend (fp32, BLAS + OpenMP).
std::unique_ptr<Backend> make_cpu_backend();

struct BackendOptions {
  int cuda_device = 0;  // Device::cuda: which GPU
  // Device::cuda: copy each op's index arrays to the host and check them, and check that every
  // tensor is device memory (a stream synchronisation per op). Off where the caller checked its
  // batches and tables on the host (the trainer). The CPU backend always checks.
  bool validate = true;
};
// The backend of a device (kernels/backends.cpp, the one place that names them): an Error for
// Device::cuda in a build without the CUDA backend, or without that GPU.
std::unique_ptr<Backend> make_backend(Device device, const BackendOptions& options = {});

}  // namespace packbert
