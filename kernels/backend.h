// The ops the BERT model calls, at the granularity the GPU fuses them. The model is written once
// against this interface; CpuBackend (kernels/cpu, fp32, the executable specification) and a
// CUDA backend implement it. Each op is declared once, with its contract, in its family's header
// under kernels/ops/ (embedding.h, linear.h, layernorm.h, attention.h, losses.h, lamb.h,
// convert.h, fp8.h, rotary.h, glu.h; the form of their op lists: kernels/ops/op_list.h). This
// header includes them all and holds what is not an op's: the Backend class with its memory,
// ordering and graphs, BackendBuffer, BackendGraph and BackendCounters.
//
// Conventions for every op:
// - Buffers are row-major Tensor views; the caller owns every input, output and workspace (no
//   allocation inside an op, except the small grow-only scratch an op documents).
// - Token-wise buffers are [rows, hidden]. SeqLayout says which rows belong to which sequence,
//   so one op serves the three layouts: unpadded (sequences end to end), packed (rows of
//   max_seq_len holding several sequences) and padded (one sequence per max_seq_len slot).
//   Token-wise ops run on every row, padding rows included (but rotary_embedding, which leaves
//   them alone); only attention knows sequences.
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
#include "kernels/ops/attention.h"
#include "kernels/ops/convert.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/fp8.h"
#include "kernels/ops/glu.h"
#include "kernels/ops/lamb.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/layout.h"
#include "kernels/ops/linear.h"
#include "kernels/ops/losses.h"
#include "kernels/ops/op_list.h"
#include "kernels/ops/rotary.h"

namespace packbert {

// ---- memory ops ------------------------------------------------------------------------------
#define PACKBERT_MEMORY_OPS(OP)                                                                    \
  /* t = 0 (any dtype). */                                                                         \
  OP(zero, (const Tensor& t), (t))                                                                 \
  /* dst = src: same dtype and element count (shapes may differ), no overlap. One side may be      \
     host memory (weights, checkpoints; small copies go through upload and read). */               \
  OP(copy, (const Tensor& dst, const Tensor& src), (dst, src))

// Every op of a backend, family by family: the Backend's pure virtuals and each backend's
// overrides are this list's expansions (kernels/ops/op_list.h).
#define PACKBERT_BACKEND_OPS(OP)                                                                   \
  PACKBERT_MEMORY_OPS(OP)                                                                          \
  PACKBERT_EMBEDDING_OPS(OP)                                                                       \
  PACKBERT_LINEAR_OPS(OP)                                                                          \
  PACKBERT_LAYERNORM_OPS(OP)                                                                       \
  PACKBERT_ATTENTION_OPS(OP)                                                                       \
  PACKBERT_LOSS_OPS(OP)                                                                            \
  PACKBERT_LAMB_OPS(OP)                                                                            \
  PACKBERT_CONVERT_OPS(OP)                                                                         \
  PACKBERT_FP8_OPS(OP)                                                                             \
  PACKBERT_ROTARY_OPS(OP)                                                                          \
  PACKBERT_GLU_OPS(OP)

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

  // dst f32 [n] = values (n <= 8, from the host) in op order, with nothing staged and nothing
  // waited for: per-step scalars that a recorded graph reads (LambConfig::step_scalars). The
  // default copies them; the CUDA backend launches one kernel that carries them as arguments.
  // Not during a capture (the values would be recorded).
  virtual void write_floats(const Tensor& dst, const float* values, int n);
  // Host arrays into tensors of the backend's device, in op order: each dst receives its
  // dst.bytes() from src, host memory the caller may reuse once upload returns. The default
  // copies each with copy(); the CUDA backend stages them in pinned memory of its own (two
  // buffers used in turn) and copies them asynchronously, so that the host does not wait for
  // the device (kernels/cuda/cuda_copies.cpp). The batch goes up through prefetch (below).
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

  // ---- the ops: zero and copy (PACKBERT_MEMORY_OPS above), then every family's -------------
  // (kernels/ops/<family>.h), each with its contract there.
  PACKBERT_BACKEND_OPS(PACKBERT_OP_PURE_VIRTUAL)

  // lamb_update then lamb_apply (kernels/ops/lamb.h) over the same sums: the whole step on one
  // device (tests and benchmarks; it allocates its f64 [T, 2] sums on every call, the optimizer
  // keeps its own). norms_ws f32 [2T] as lamb_apply's.
  void lamb_step(const Tensor& table, const LambConfig& config, const Tensor& global_grad_norm,
                 const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                 const Tensor& norms_ws, const Tensor& params_lowp = Tensor(),
                 const Tensor& record = Tensor());

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
