// FmhaStreams: the auxiliary streams, events and work-list buffer of the grouped attention
// launch (fmha.h). The plan itself is kernels/common/fmha_work_list.h (plain C++, unit-tested).
//
// Why streams: the buckets are independent grids (disjoint rows), and a bucket of short
// sequences is a small grid that would leave most SMs idle while it drains; on separate streams
// the next bucket's blocks fill them. Every auxiliary stream waits on a fork event recorded on
// the backend's stream after the op's earlier work (the padding zeroing, the order upload), and
// the backend's stream waits on each used stream's join event, so the op stays one step in the
// backend's stream order for its callers.
#include "kernels/cuda/fmha_host.h"

#include <algorithm>

#include "kernels/common/op_checks.h"
#include "kernels/cuda/counters.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/base/error.h"

namespace packbert::cuda {

void FmhaStreams::check_error(const char* op, const char* what, cudaError_t e) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // a launch-configuration error is not sticky; it was reported here
  PB_THROW("{}: CUDA error '{}' ({}) in {}", op, cudaGetErrorString(e), cudaGetErrorName(e), what);
}

FmhaStreams::FmhaStreams() {
  const char* op = "make_cuda_backend";
  try {
    // Non-blocking: the auxiliary streams order with the backend's stream through events only,
    // never implicitly with the legacy default stream.
    for (cudaStream_t& s : streams_)
      check_error(op, "cudaStreamCreateWithFlags",
                  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    check_error(op, "cudaEventCreateWithFlags",
                cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (cudaEvent_t& e : uploaded_)
      check_error(op, "cudaEventCreateWithFlags",
                  cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : join_)
      check_error(op, "cudaEventCreateWithFlags",
                  cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } catch (...) {
    release();
    throw;
  }
}

FmhaStreams::~FmhaStreams() { release(); }

void FmhaStreams::release() {
  // Never throws; the backend synchronised its stream (which joined every auxiliary stream).
  for (cudaStream_t& s : streams_) {
    if (s) stream_synchronize(s);
  }
  release_order();
  device_free(workspace_d_);
  workspace_d_ = nullptr;
  workspace_capacity_ = 0;
  for (cudaEvent_t& e : join_) {
    if (e) cudaEventDestroy(e);
    e = nullptr;
  }
  if (fork_) cudaEventDestroy(fork_);
  fork_ = nullptr;
  for (cudaEvent_t& e : uploaded_) {
    if (e) cudaEventDestroy(e);
    e = nullptr;
  }
  for (cudaStream_t& s : streams_) {
    if (s) cudaStreamDestroy(s);
    s = nullptr;
  }
}

void FmhaStreams::release_order() {
  device_free(order_d_);
  order_d_ = nullptr;
  order_capacity_ = 0;
  for (int32_t*& h : order_h_) {
    host_free(h);
    h = nullptr;
  }
  have_order_ = false;
  order_last_.clear();
}

// Every attention op of a step (each layer's forward and backward) has the same layout, hence
// the same plan: the device copy of the last order serves them all, and a new order (a new
// batch) is copied once, from pinned memory (a pageable source would be staged by the driver,
// which may synchronise). The device copy is rewritten in stream order, after the kernels of the
// earlier batches that read it.
const int32_t* FmhaStreams::upload(const char* op, const FmhaPlan& plan, cudaStream_t main) {
  const size_t n = plan.order.size();
  if (have_order_ && plan.order == order_last_) return order_d_;
  if (n > order_capacity_) {
    // Kernels of an earlier call may still read the old list, and copies out of the pinned
    // buffers may be pending: wait for them (the grow happens only until the largest batch has
    // been seen).
    check_error(op, "cudaStreamSynchronize", stream_synchronize(main));
    release_order();
    const size_t cap = n + n / 4 + 64;
    order_d_ = static_cast<int32_t*>(cuda_alloc_named(
        op, "attention work list", cap * sizeof(int32_t), oom_note ? oom_note() : std::string()));
    for (int32_t*& h : order_h_)
      check_error(op, "cudaMallocHost of the attention work list",
                  cudaMallocHost(&h, cap * sizeof(int32_t)));
    order_capacity_ = cap;
  }
  // The pinned buffer used two uploads ago: the host rewrites it once its copy has run (a query
  // first; the host waits only when the device is that far behind).
  const int i = order_next_;
  order_next_ = 1 - order_next_;
  const cudaError_t q = cudaEventQuery(uploaded_[i]);
  check_error(op, "cudaEventSynchronize (attention work list)",
              q == cudaErrorNotReady ? event_synchronize(uploaded_[i]) : q);
  std::copy(plan.order.begin(), plan.order.end(), order_h_[i]);
  order_last_ = plan.order;
  have_order_ = true;
  if (n) {
    check_error(
        op, "cudaMemcpyAsync of the attention work list",
        memcpy_async(order_d_, order_h_[i], n * sizeof(int32_t), cudaMemcpyHostToDevice, main));
    check_error(op, "cudaEventRecord (attention work list)", cudaEventRecord(uploaded_[i], main));
  }
  return order_d_;
}

float* FmhaStreams::workspace(const char* op, size_t n, cudaStream_t main) {
  if (n > workspace_capacity_) {
    check_error(op, "cudaStreamSynchronize", stream_synchronize(main));
    check_error(op, "cudaFree of the attention workspace", retire(workspace_d_));
    workspace_d_ = nullptr;
    workspace_capacity_ = 0;
    const size_t cap = n + n / 4 + 64;
    workspace_d_ = static_cast<float*>(cuda_alloc_named(
        op, "attention workspace", cap * sizeof(float), oom_note ? oom_note() : std::string()));
    workspace_capacity_ = cap;
  }
  return workspace_d_;
}

void FmhaStreams::fork(const char* op, cudaStream_t main, int used) {
  check_error(op, "cudaEventRecord (fork)", cudaEventRecord(fork_, main));
  for (int i = 0; i < used; ++i)
    check_error(op, "cudaStreamWaitEvent (fork)", cudaStreamWaitEvent(streams_[i], fork_, 0));
}

void FmhaStreams::join(const char* op, cudaStream_t main, int used) {
  for (int i = 0; i < used; ++i) {
    check_error(op, "cudaEventRecord (join)", cudaEventRecord(join_[i], streams_[i]));
    check_error(op, "cudaStreamWaitEvent (join)", cudaStreamWaitEvent(main, join_[i], 0));
  }
}

// ---- argument checks of the attention ops -----------------------------------------------------
FmhaType fmha_type(DType t) { return t == DType::bf16 ? FmhaType::bf16 : FmhaType::f16; }

namespace {
bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }
}  // namespace

bool fmha_native(const Tensor& qkv, int num_heads, std::initializer_list<const Tensor*> same) {
  if (!qkv.defined() || (qkv.dtype != DType::bf16 && qkv.dtype != DType::f16)) return false;
  if (!aligned16(qkv)) return false;
  for (const Tensor* t : same)
    if (!t->defined() || t->dtype != qkv.dtype || !aligned16(*t)) return false;
  return qkv.ndim == 2 && num_heads >= 1 && qkv.shape[1] == 3 * int64_t{num_heads} * kFmhaHeadDim;
}

FmhaShape fmha_attention_shape(const char* op, const SeqLayout& layout, const Tensor& qkv,
                               int num_heads) {
  check_tensor(op, "qkv", qkv, qkv.dtype, {layout.rows, kAnyDim});
  const int64_t ld = qkv.dim(1), hidden = checks::qkv_hidden(op, ld, num_heads);
  const int64_t d = hidden / num_heads;
  PB_REQUIRE(d == kFmhaHeadDim,
             "{}: head dim {} is not supported by the CUDA {} attention (only {}; f32 takes "
             "1..{})",
             op, d, dtype_name(qkv.dtype), kFmhaHeadDim, kAttentionMaxHeadDim);
  PB_REQUIRE(num_heads <= 65535, "{}: {} heads exceed the grid", op, num_heads);
  const int64_t blocks =
      int64_t{layout.num_seqs} * ((int64_t{layout.max_len} + kFmhaTile - 1) / kFmhaTile);
  PB_REQUIRE(blocks <= 0x7fffffff, "{}: {} blocks exceed the grid", op, blocks);
  return FmhaShape{layout.rows, hidden, num_heads};
}

void fmha_check_grid(const char* op, const FmhaPlan& plan, int tile) {
  for (const FmhaBucket& b : plan.buckets) {
    const int64_t blocks = b.count * ((int64_t{b.max_len} + tile - 1) / tile);
    PB_REQUIRE(blocks <= 0x7fffffff, "{}: {} blocks of length bucket {} exceed the grid", op,
               blocks, b.index);
  }
}

namespace {
template <typename T>
std::vector<T> copy_to_host(const char* op, const Tensor& t, cudaStream_t s) {
  std::vector<T> h(static_cast<size_t>(t.numel()));
  if (!h.empty())
    FmhaStreams::check_error(op, "cudaMemcpyAsync of the layout",
                             memcpy_async(h.data(), t.data, t.bytes(), cudaMemcpyDeviceToHost, s));
  return h;
}
}  // namespace

std::vector<int32_t> fmha_host_lengths(const char* op, const SeqLayout& l, bool validate,
                                       cudaStream_t s) {
  if (l.num_seqs == 0 && !validate) return {};
  if (l.host_seq_len != nullptr && !validate)  // the caller's copy: no read-back, no wait
    return std::vector<int32_t>(l.host_seq_len, l.host_seq_len + l.num_seqs);
  std::vector<int32_t> len = copy_to_host<int32_t>(op, l.seq_len, s);
  if (validate) {
    const auto start = copy_to_host<int32_t>(op, l.seq_start, s);
    const auto sample = copy_to_host<int64_t>(op, l.sample_id, s);
    const auto tseq = copy_to_host<int32_t>(op, l.token_seq, s);
    const auto tpos = copy_to_host<int32_t>(op, l.token_pos, s);
    FmhaStreams::check_error(op, "cudaStreamSynchronize", stream_synchronize(s));
    checks::check_layout_arrays(
        op, l, {start.data(), len.data(), sample.data(), tseq.data(), tpos.data()}, l.rows);
    if (l.host_seq_len != nullptr)
      for (int32_t i = 0; i < l.num_seqs; ++i)
        PB_REQUIRE(l.host_seq_len[i] == len[static_cast<size_t>(i)],
                   "{}: layout host_seq_len[{}] = {} but seq_len[{}] = {}", op, i,
                   l.host_seq_len[i], i, len[static_cast<size_t>(i)]);
  } else {
    FmhaStreams::check_error(op, "cudaStreamSynchronize", stream_synchronize(s));
  }
  return len;
}

}  // namespace packbert::cuda
