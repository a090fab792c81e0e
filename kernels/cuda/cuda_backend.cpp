// CudaBackend: construction, argument checks, copies, scratch, the device allocator, and the
// ops that are a kernel or two (gathers, softmax cross-entropy, L2 norm, LAMB).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/common/op_args.h"
#include "kernels/common/op_checks.h"
#include "kernels/cuda/cuda_backend_impl.h"

// NVTX v3 is header-only (it loads the profiler's injection library when one is attached); the
// emulated build has a recorder of the same API (cuda_emu/include/nvtx3).
#include <nvtx3/nvToolsExt.h>

namespace packbert {

static_assert(cuda::kDeviceLayerNormEps == kLayerNormEps, "the kernels' LayerNorm epsilon");
static_assert(sizeof(LambTensor) == 3 * sizeof(int64_t), "LambTensor is a row of i64 [T, 3]");

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt workspace

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// The trace ranges (core/trace.h) as NVTX ranges: the phases of a step and every op, on the
// timeline of Nsight Systems (nsys profile --trace=cuda,nvtx).
void nvtx_push(const char* name) { nvtxRangePushA(name); }
void nvtx_pop() { nvtxRangePop(); }
const trace::Hooks kNvtxHooks{&nvtx_push, &nvtx_pop};
}  // namespace

// ---- allocator -------------------------------------------------------------------------------
void* cuda_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it
    PB_THROW("cuda_alloc: cudaMalloc of {:.1f} MiB failed: {} ({})",
             static_cast<double>(bytes) / (1 << 20), cudaGetErrorString(e), cudaGetErrorName(e));
  }
  return p;
}

void cuda_free(void* p) {
  if (!p) return;
  // Never throws (it runs in destructors); a failure here means an earlier fault, which the
  // next checked call reports.
  (void)cuda::device_free(p);
}

void cuda_synchronize(Backend& backend) {
  if (auto* b = dynamic_cast<CudaBackend*>(&backend)) b->synchronize("cuda_synchronize");
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(device, options);
}

// ---- construction ------------------------------------------------------------------------
CudaBackend::CudaBackend(int device, const CudaBackendOptions& options)
    : device_(device), options_(options) {
  const char* op = "make_cuda_backend";
  if (env_flag("PACKBERT_CUDA_SYNC")) options_.sync_each_op = true;
  if (env_flag("PACKBERT_CUDA_NO_EPILOGUES")) options_.use_epilogues = false;
  if (env_flag("PACKBERT_NVTX")) trace::install(&kNvtxHooks);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    PB_THROW("{}: no CUDA device ({})", op, cudaGetErrorString(e));
  }
  PB_REQUIRE(device >= 0 && device < count, "{}: device {} requested, {} present", op, device,
             count);
  PB_CUDA_OP(op, cudaSetDevice(device_));
  // A blocking stream: it orders with the legacy default stream, so plain cudaMemcpy in tests
  // and callers sees this backend's work completed.
  PB_CUDA_OP(op, cudaStreamCreate(&stream_));
  PB_CUBLASLT_OP(op, cublasLtCreate(&lt_));
  PB_CUDA_OP(op, cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  fmha_ = std::make_unique<cuda::FmhaStreams>();
  PB_CUDA_OP(op, cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  PB_CUDA_OP(op, cudaEventCreateWithFlags(&prefetch_issued_, cudaEventDisableTiming));
}

CudaBackend::~CudaBackend() {
  // Destructors never throw: errors here follow an earlier fault that was already reported.
  cudaSetDevice(device_);
  if (stream_) cuda::stream_synchronize(stream_);
  if (copy_stream_) cuda::stream_synchronize(copy_stream_);
  fmha_.reset();
  cuda::device_free(workspace_);
  cuda::device_free(scratch_d_);
  cuda::device_free(scratch_f_);
  cuda::device_free(scratch_b_);
  cuda::device_free(lamb_work_);
  cuda::host_free(download_);
  for (UploadStaging& s : upload_staging_) {
    cuda::host_free(s.data);
    if (s.done) cudaEventDestroy(s.done);
  }
  if (prefetch_issued_) cudaEventDestroy(prefetch_issued_);
  if (lt_) cublasLtDestroy(lt_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

void* CudaBackend::allocate_memory(size_t bytes) {
  begin("allocate_memory");  // on this backend's GPU
  return cuda_alloc(bytes);
}

void CudaBackend::free_memory(void* p) {
  if (!p) return;
  (void)cudaSetDevice(device_);
  cuda_free(p);
}

BackendCounters CudaBackend::counters() const {
  const cuda::HostWork w = cuda::host_work();
  BackendCounters c;
  c.host_syncs = w.host_syncs;
  c.launches = w.launches;
  c.graph_launches = w.graph_launches;
  c.pageable_copies = w.pageable_copies;
  return c;
}

// ---- graphs: stream capture on stream_ (thread-local mode: other host threads, the loader's
// and MPI's, may call the runtime meanwhile) --------------------------------------------------
namespace {
struct CudaGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};
}  // namespace

void CudaBackend::begin_capture() {
  const char* op = "begin_capture";
  begin(op);
  PB_REQUIRE(!options_.sync_each_op && !options_.validate_indices,
             "{}: a backend that waits after each op or validates indices (both wait for the "
             "device) cannot record graphs",
             op);
  PB_CUDA_OP(op, cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
}

BackendGraph CudaBackend::end_capture() {
  const char* op = "end_capture";
  begin(op);
  auto g = std::make_unique<CudaGraph>();
  PB_CUDA_OP(op, cudaStreamEndCapture(stream_, &g->graph));
  const cudaError_t e = cudaGraphInstantiate(&g->exec, g->graph, 0);
  if (e != cudaSuccess) {
    cudaGraphDestroy(g->graph);
    PB_CUDA_OP(op, e);
  }
  cuda::graph_made();
  return BackendGraph(this, g.release());
}

void CudaBackend::replay(const BackendGraph& graph) {
  const char* op = "replay";
  PB_REQUIRE(graph.defined(), "{}: no graph", op);
  begin(op);
  PB_CUDA_OP(op, cuda::graph_launch(static_cast<CudaGraph*>(graph.handle())->exec, stream_));
  end(op);
}

void CudaBackend::destroy_graph(void* handle) noexcept {
  auto* g = static_cast<CudaGraph*>(handle);
  if (!g) return;
  cudaSetDevice(device_);
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->graph) cudaGraphDestroy(g->graph);
  delete g;
  cuda::graph_gone();
}

void CudaBackend::begin(const char* op) { PB_CUDA_OP(op, cudaSetDevice(device_)); }

void CudaBackend::end(const char* op) {
  if (!options_.sync_each_op) return;
  PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
  PB_CUDA_OP(op, cudaGetLastError());
}

void CudaBackend::synchronize(const char* op) {
  const trace::Range range("synchronize");
  begin(op);
  PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
}

void CudaBackend::launched(const char* op, const char* kernel, cudaError_t e) {
  if (e != cudaSuccess)
    PB_THROW("{}: CUDA error '{}' ({}) launching {}", op, cudaGetErrorString(e),
             cudaGetErrorName(e), kernel);
}

// ---- argument checks -------------------------------------------------------------------------
void CudaBackend::check_pointer(const char* op, const char* name, const Tensor& t) {
  if (!options_.validate_pointers || !t.defined()) return;
  cudaPointerAttributes attr{};
  PB_CUDA_OP(op, cudaPointerGetAttributes(&attr, t.data));
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (t.device == Device::cuda) {
    PB_REQUIRE(on_device && attr.device == device_,
               "{}: {} ({}) is not memory of cuda:{} (pointer type {}, device {})", op, name,
               t.str(), device_, static_cast<int>(attr.type), attr.device);
  } else {
    PB_REQUIRE(!on_device, "{}: {} ({}) says cpu but points to device memory", op, name, t.str());
  }
}

void CudaBackend::expect(const char* op, const char* name, const Tensor& t, DType dtype,
                         std::initializer_list<int64_t> dims) {
  check_tensor(op, name, t, dtype, dims);
  check_device(op, name, t, Device::cuda);
  check_pointer(op, name, t);
}

void CudaBackend::expect_optional(const char* op, const char* name, const Tensor& t, DType dtype,
                                  std::initializer_list<int64_t> dims) {
  if (t.defined()) expect(op, name, t, dtype, dims);
}

template <typename T>
std::vector<T> CudaBackend::to_host(const char* op, const Tensor& t) {
  std::vector<T> h(static_cast<size_t>(t.numel()));
  if (!h.empty()) {
    PB_CUDA_OP(op, cuda::memcpy_async(h.data(), t.ptr<T>(), t.bytes(), cudaMemcpyDeviceToHost,
                                   stream_));
    PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
  }
  return h;
}

cuda::DeviceLayout CudaBackend::device_layout(const char* op, const SeqLayout& l, int64_t rows,
                                              checks::EmptySeqs empty) {
  PB_REQUIRE(l.rows == rows, "{}: layout has {} rows, the buffers {}", op, l.rows, rows);
  PB_REQUIRE(l.num_seqs >= 0 && l.max_len >= 0, "{}: layout with {} sequences, max_len {}", op,
             l.num_seqs, l.max_len);
  const int64_t s = l.num_seqs;
  expect(op, "layout.seq_start", l.seq_start, DType::i32, {s});
  expect(op, "layout.seq_len", l.seq_len, DType::i32, {s});
  expect(op, "layout.sample_id", l.sample_id, DType::i64, {s});
  expect(op, "layout.token_seq", l.token_seq, DType::i32, {rows});
  expect(op, "layout.token_pos", l.token_pos, DType::i32, {rows});
  if (options_.validate_indices) {
    const auto start = to_host<int32_t>(op, l.seq_start);
    const auto len = to_host<int32_t>(op, l.seq_len);
    const auto sample = to_host<int64_t>(op, l.sample_id);
    const auto tseq = to_host<int32_t>(op, l.token_seq);
    const auto tpos = to_host<int32_t>(op, l.token_pos);
    checks::check_layout_arrays(
        op, l, {start.data(), len.data(), sample.data(), tseq.data(), tpos.data()}, rows,
        empty);
  }
  cuda::DeviceLayout d;
  // A "none" view of 0 elements has no pointer; kernels never read it then.
  d.seq_start = s ? l.seq_start.ptr<int32_t>() : nullptr;
  d.seq_len = s ? l.seq_len.ptr<int32_t>() : nullptr;
  d.sample_id = s ? l.sample_id.ptr<int64_t>() : nullptr;
  d.token_seq = rows ? l.token_seq.ptr<int32_t>() : nullptr;
  d.token_pos = rows ? l.token_pos.ptr<int32_t>() : nullptr;
  d.rows = rows;
  d.num_seqs = l.num_seqs;
  d.max_len = l.max_len;
  return d;
}

void CudaBackend::check_indices(const char* op, const char* name, const Tensor& index,
                                int64_t bound, bool allow_none) {
  if (!options_.validate_indices) return;
  const auto h = to_host<int32_t>(op, index);
  checks::check_indices(op, name, h.data(), static_cast<int64_t>(h.size()), bound, allow_none);
}

// ---- scratch ---------------------------------------------------------------------------------
namespace {
void* grow(const char* op, void*& p, size_t& have, size_t want) {
  if (want <= have) return p;
  // Freed now (cudaFree waits for the work that may still use it), or once no recorded graph
  // that may read it lives.
  if (p) PB_CUDA_OP(op, cuda::retire(p));
  p = nullptr;
  have = 0;
  const size_t bytes = want + want / 4;
  PB_CUDA_OP(op, cudaMalloc(&p, bytes));
  have = bytes;
  return p;
}
}  // namespace

double* CudaBackend::scratch_doubles(const char* op, size_t n) {
  return static_cast<double*>(grow(op, scratch_d_, scratch_d_bytes_, (n ? n : 1) * sizeof(double)));
}
float* CudaBackend::scratch_floats(const char* op, size_t n) {
  return static_cast<float*>(grow(op, scratch_f_, scratch_f_bytes_, (n ? n : 1) * sizeof(float)));
}
void* CudaBackend::scratch_bytes(const char* op, size_t n) {
  return grow(op, scratch_b_, scratch_b_bytes_, n ? n : 1);
}

// ---- low precision ---------------------------------------------------------------------------
cuda::FloatFormat float_format(const char* op, const char* name, const Tensor& t) {
  switch (t.dtype) {
    case DType::f32: return cuda::FloatFormat::f32;
    case DType::bf16: return cuda::FloatFormat::bf16;
    case DType::f16: return cuda::FloatFormat::f16;
    default: break;
  }
  PB_THROW("{}: {} is {}, expected a float tensor (f32, bf16 or f16)", op, name, t.str());
}

CudaLowpStaging::~CudaLowpStaging() {
  for (void* p : slots_) (void)cuda::device_free(p);
}

float* CudaLowpStaging::scratch(int slot, int64_t n) {
  const char* op = "low-precision staging";
  PB_CHECK(slot >= 0 && slot < lowp::kMaxStaged, "staging slot {}", slot);
  const auto i = static_cast<size_t>(slot);
  return static_cast<float*>(
      grow(op, slots_[i], bytes_[i], static_cast<size_t>(n > 0 ? n : 1) * sizeof(float)));
}

void CudaLowpStaging::widen(const Tensor& dst, const Tensor& src) {
  const char* op = "low-precision staging (widen)";
  PB_CHECK(dst.numel() == src.numel(), "widen {} into {}", src.str(), dst.str());
  PB_CUDA_OP(op, cuda::convert(src.data, float_format(op, "src", src), dst.data,
                               float_format(op, "dst", dst), src.numel(), stream_));
}

void CudaLowpStaging::narrow(const Tensor& dst, const Tensor& src) {
  const char* op = "low-precision staging (narrow)";
  PB_CHECK(dst.numel() == src.numel(), "narrow {} into {}", src.str(), dst.str());
  PB_CUDA_OP(op, cuda::convert(src.data, float_format(op, "src", src), dst.data,
                               float_format(op, "dst", dst), src.numel(), stream_));
}

void CudaBackend::convert(const Tensor& dst, const Tensor& src) {
  const trace::Range range("convert");
  const char* op = "convert";
  PB_REQUIRE(dst.defined() && src.defined(), "{}: dst {} / src {} missing", op, dst.str(),
             src.str());
  check_device(op, "dst", dst, Device::cuda);
  check_device(op, "src", src, Device::cuda);
  check_pointer(op, "dst", dst);
  check_pointer(op, "src", src);
  const cuda::FloatFormat df = float_format(op, "dst", dst), sf = float_format(op, "src", src);
  PB_REQUIRE(dst.numel() == src.numel(), "{}: dst {} and src {} differ in size", op, dst.str(),
             src.str());
  const auto* s = static_cast<const char*>(src.data);
  const auto* d = static_cast<const char*>(dst.data);
  PB_REQUIRE(d + dst.bytes() <= s || s + src.bytes() <= d, "{}: dst and src overlap", op);
  begin(op);
  launched(op, "convert", cuda::convert(src.data, sf, dst.data, df, src.numel(), stream_));
  end(op);
}

// ---- zero / copy -----------------------------------------------------------------------------
void CudaBackend::zero(const Tensor& t) {
  const trace::Range range("zero");
  const char* op = "zero";
  PB_REQUIRE(t.defined(), "zero: t is missing");
  check_device(op, "t", t, Device::cuda);
  check_pointer(op, "t", t);
  begin(op);
  if (t.bytes()) PB_CUDA_OP(op, cuda::memset_async(t.data, 0, t.bytes(), stream_));
  end(op);
}

void CudaBackend::write_floats(const Tensor& dst, const float* values, int n) {
  const trace::Range range("write_floats");
  const char* op = "write_floats";
  PB_REQUIRE(n >= 0 && n <= 8 && dst.dtype == DType::f32 && dst.numel() == n,
             "{}: {} values into {}", op, n, dst.str());
  check_device(op, "dst", dst, Device::cuda);
  check_pointer(op, "dst", dst);
  if (n == 0) return;
  cuda::FloatArgs a{};
  std::copy(values, values + n, a.v);
  begin(op);
  launched(op, op, cuda::write_floats(dst.ptr<float>(), a, n, stream_));
  end(op);
}

void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  const trace::Range range("copy");
  const char* op = "copy";
  PB_REQUIRE(dst.defined() && src.defined(), "copy: dst {} / src {} missing", dst.str(), src.str());
  PB_REQUIRE(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: dst {} and src {} differ",
             dst.str(), src.str());
  check_pointer(op, "dst", dst);
  check_pointer(op, "src", src);
  if (dst.device == src.device) {
    const auto* s = static_cast<const char*>(src.data);
    const auto* d = static_cast<const char*>(dst.data);
    PB_REQUIRE(d + dst.bytes() <= s || s + src.bytes() <= d, "copy: dst and src overlap");
  }
  if (src.bytes() == 0) return;
  if (dst.device == Device::cpu && src.device == Device::cpu) {
    std::memcpy(dst.data, src.data, src.bytes());
    return;
  }
  // Small copies with a host side (the per-step ones: scalars, loss sums) go through pinned
  // memory of the backend's: an upload is staged and asynchronous (upload()), a read-back one
  // copy into pinned memory and one wait. Large ones (weights, checkpoints) go directly: they
  // are rare, and pinned buffers of their size would be a waste.
  const size_t bytes = src.bytes();
  if (src.device == Device::cpu && dst.device == Device::cuda && bytes <= kStagedCopyBytes) {
    upload({{dst, src.data}});
    return;
  }
  if (dst.device == Device::cpu && src.device == Device::cuda && bytes <= kStagedCopyBytes) {
    read({{dst.data, src}});
    return;
  }
  begin(op);
  PB_CUDA_OP(op, cuda::memcpy_async(dst.data, src.data, bytes, cudaMemcpyDefault, stream_));
  // With host memory on either side the copy is complete when copy() returns: a read-back is
  // on the host, and the caller may reuse an uploaded host buffer at once.
  if (dst.device == Device::cpu || src.device == Device::cpu)
    PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
  end(op);
}

// The batch's arrays: each into the next staging buffer (pinned), then copied by the stream.
// The host waits only when that buffer's previous copies, issued two uploads ago, have not run
// yet (a query first: on a device that keeps up they have, and nothing waits).
void CudaBackend::upload(const std::vector<HostUpload>& copies) {
  const trace::Range range("upload");
  stage_and_copy("upload", copies, stream_);
  end("upload");
}

// The same staging, copied on copy_stream_: after the ops issued before the previous
// prefetch() (the event recorded then), before the ops issued after this one (stream_ waits for
// the copies' event). No host wait beyond the staging buffer's, as upload().
void CudaBackend::prefetch(const std::vector<HostUpload>& copies) {
  const trace::Range range("prefetch");
  const char* op = "prefetch";
  begin(op);
  if (prefetch_recorded_) PB_CUDA_OP(op, cudaStreamWaitEvent(copy_stream_, prefetch_issued_, 0));
  PB_CUDA_OP(op, cudaEventRecord(prefetch_issued_, stream_));
  prefetch_recorded_ = true;
  if (cudaEvent_t copied = stage_and_copy(op, copies, copy_stream_))
    PB_CUDA_OP(op, cudaStreamWaitEvent(stream_, copied, 0));
  end(op);
}

cudaEvent_t CudaBackend::stage_and_copy(const char* op, const std::vector<HostUpload>& copies,
                                        cudaStream_t on) {
  constexpr size_t kAlign = 256;
  size_t total = 0;
  for (const HostUpload& c : copies) {
    PB_REQUIRE(c.dst.defined(), "{}: a destination is missing", op);
    PB_REQUIRE(c.src != nullptr || c.dst.bytes() == 0, "{}: no host source for {}", op,
               c.dst.str());
    check_device(op, "dst", c.dst, Device::cuda);
    check_pointer(op, "dst", c.dst);
    total += (c.dst.bytes() + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return nullptr;
  begin(op);
  UploadStaging& s = upload_staging_[static_cast<size_t>(next_upload_)];
  next_upload_ = 1 - next_upload_;
  if (s.pending) {
    const cudaError_t q = cudaEventQuery(s.done);
    if (q == cudaErrorNotReady)
      PB_CUDA_OP(op, cuda::event_synchronize(s.done));
    else
      PB_CUDA_OP(op, q);
    s.pending = false;
  }
  if (total > s.bytes) {  // the first uploads, and a batch larger than any before
    PB_CUDA_OP(op, cuda::host_free(s.data));
    s.data = nullptr;
    s.bytes = 0;
    const size_t bytes = total + total / 4;
    PB_CUDA_OP(op, cudaMallocHost(&s.data, bytes));
    s.bytes = bytes;
  }
  if (!s.done) PB_CUDA_OP(op, cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  auto* staged = static_cast<char*>(s.data);
  for (const HostUpload& c : copies) {
    const size_t n = c.dst.bytes();
    if (n == 0) continue;
    std::memcpy(staged, c.src, n);
    PB_CUDA_OP(op, cuda::memcpy_async(c.dst.data, staged, n, cudaMemcpyHostToDevice, on));
    staged += (n + kAlign - 1) / kAlign * kAlign;
  }
  PB_CUDA_OP(op, cudaEventRecord(s.done, on));
  s.pending = true;
  return s.done;
}

// Every source into the pinned read-back buffer, one wait, then out to the destinations. More
// than the buffer holds: copy() each (large read-backs are rare: weights, checkpoints).
void CudaBackend::read(const std::vector<HostRead>& reads) {
  const trace::Range range("read");
  const char* op = "read";
  constexpr size_t kAlign = 256;
  size_t total = 0;
  for (const HostRead& r : reads) {
    PB_REQUIRE(r.src.defined() && (r.dst != nullptr || r.src.bytes() == 0),
               "{}: a source or a host destination is missing", op);
    check_device(op, "src", r.src, Device::cuda);
    check_pointer(op, "src", r.src);
    total += (r.src.bytes() + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return;
  if (total > kStagedCopyBytes) {
    for (const HostRead& r : reads) {
      if (r.src.bytes() == 0) continue;
      begin(op);
      PB_CUDA_OP(op, cuda::memcpy_async(r.dst, r.src.data, r.src.bytes(),
                                        cudaMemcpyDeviceToHost, stream_));
      PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
    }
    end(op);
    return;
  }
  begin(op);
  if (!download_) {
    PB_CUDA_OP(op, cudaMallocHost(&download_, kStagedCopyBytes));
  }
  auto* staged = static_cast<char*>(download_);
  for (const HostRead& r : reads) {
    const size_t n = r.src.bytes();
    if (n == 0) continue;
    PB_CUDA_OP(op, cuda::memcpy_async(staged, r.src.data, n, cudaMemcpyDeviceToHost, stream_));
    staged += (n + kAlign - 1) / kAlign * kAlign;
  }
  PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
  staged = static_cast<char*>(download_);
  for (const HostRead& r : reads) {
    const size_t n = r.src.bytes();
    if (n == 0) continue;
    std::memcpy(r.dst, staged, n);
    staged += (n + kAlign - 1) / kAlign * kAlign;
  }
  end(op);
}

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
             cuda::gather_rows(x.data, index.ptr<int32_t>(), out.data, float_format(op, "x", x),
                               m, h, stream_));
  end(op);
}

void CudaBackend::gather_rows_backward(const Tensor& dout, const Tensor& index, const Tensor& dx) {
  const trace::Range range("gather_rows_backward");
  if (lowp::any({&dout, &dx}) && !same_float_format(dout, dx))
    return lowp::gather_rows_backward(*this, lowp_, dout, index, dx);
  const char* op = "gather_rows_backward";
  const auto [rows, h, m] =
      checks::gather_rows_args(checks::OpArgs(op, Device::cuda, pointer_check()), "dx",
                               as_f32(dx), index, "dout", as_f32(dout));
  begin(op);
  check_indices(op, "index", index, rows, true);
  if (dx.bytes()) PB_CUDA_OP(op, cuda::memset_async(dx.data, 0, dx.bytes(), stream_));
  if (m * h > 0) {
    auto* scratch = static_cast<uint32_t*>(
        scratch_bytes(op, static_cast<size_t>(rows + 1) * sizeof(uint32_t)));
    launched(op, "scatter_add_rows_ordered",
             cuda::scatter_add_rows_ordered(dout.data, index.ptr<int32_t>(), dx.data,
                                            float_format(op, "dx", dx), m, h, rows, scratch,
                                            stream_));
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
             cuda::softmax_cross_entropy(logits.ptr<float>(), labels.ptr<int32_t>(), m, v,
                                         grad_scale.value,
                                         grad_scale.device.defined()
                                             ? grad_scale.device.ptr<float>()
                                             : nullptr,
                                         dlogits.defined() ? dlogits.ptr<float>() : nullptr,
                                         rows, rows + m, loss_sum.ptr<float>(),
                                         num_correct.ptr<int32_t>(), stream_));
  }
  end(op);
}

// ---- optimizer -------------------------------------------------------------------------------
void CudaBackend::l2_norm(const Tensor& x, const Tensor& out) {
  const trace::Range range("l2_norm");
  sum_of_squares("l2_norm", x, out);
}

void CudaBackend::sum_squares(const Tensor& x, const Tensor& out) {
  const trace::Range range("sum_squares");
  sum_of_squares("sum_squares", x, out);
}

void CudaBackend::norm_from_sum_squares(const Tensor& sum, const Tensor& out) {
  const char* op = "norm_from_sum_squares";
  expect(op, "sum", sum, DType::f64, {1});
  expect(op, "out", out, DType::f32, {1});
  begin(op);
  launched(op, op, cuda::root_of_sums(sum.ptr<double>(), 1, out.ptr<float>(), stream_));
  end(op);
}

// l2_norm (out f32: the root) and sum_squares (out f64: the sum) share one reduction.
void CudaBackend::sum_of_squares(const char* op, const Tensor& x, const Tensor& out) {
  const bool root = out.dtype != DType::f64;
  expect(op, "x", x, DType::f32, {kAnyDim});
  expect(op, "out", out, root ? DType::f32 : DType::f64, {1});
  const int64_t n = x.dim(0);
  PB_REQUIRE(cuda::l2_norm_partials(n) <= 0x7fffffff, "{}: {} elements exceed the grid", op, n);
  begin(op);
  double* partial = scratch_doubles(op, static_cast<size_t>(cuda::l2_norm_partials(n)));
  launched(op, op,
           cuda::sum_of_squares(n ? x.ptr<float>() : nullptr, n, partial,
                                root ? out.ptr<float>() : nullptr,
                                root ? nullptr : out.ptr<double>(), stream_));
  end(op);
}

const char* CudaBackend::lamb_work(const char* op, const LambTensor* entries,
                                   int64_t num_tensors, float weight_decay) {
  const bool same_work = lamb_work_ && weight_decay == lamb_weight_decay_ &&
                         lamb_rows_.size() == static_cast<size_t>(num_tensors) &&
                         std::equal(lamb_rows_.begin(), lamb_rows_.end(), entries,
                                    [](const LambTensor& x, const LambTensor& y) {
                                      return x.offset == y.offset && x.size == y.size &&
                                             x.decay == y.decay;
                                    });
  if (same_work) return static_cast<const char*>(lamb_work_);
  // A new table (the first step): the chunk list and the per-row ranges, uploaded once.
  std::vector<cuda::LambChunk> chunks;
  std::vector<cuda::LambTensorRange> ranges;
  for (int64_t t = 0; t < num_tensors; ++t) {
    const LambTensor& e = entries[t];
    cuda::LambTensorRange r;
    r.first_chunk = static_cast<int64_t>(chunks.size());
    for (int64_t b = e.offset; b < e.offset + e.size; b += cuda::kNormChunk)
      chunks.push_back({t, b, std::min(e.offset + e.size, b + cuda::kNormChunk)});
    r.chunks = static_cast<int64_t>(chunks.size()) - r.first_chunk;
    r.decay = e.decay == 1 ? weight_decay : 0.f;
    // apex applies the trust ratio only where weight decay is non-zero (use_nvlamb = false).
    r.adapt = e.decay == 1 && weight_decay != 0.f;
    ranges.push_back(r);
  }
  PB_REQUIRE(chunks.size() <= 0x7fffffff, "{}: {} chunks exceed the grid", op, chunks.size());
  const size_t chunk_bytes = chunks.size() * sizeof(cuda::LambChunk);
  const size_t range_at = (chunk_bytes + 255) / 256 * 256;
  const size_t bytes = range_at + std::max<size_t>(ranges.size(), 1) * sizeof(cuda::LambTensorRange);
  // The previous list may still be read by a launch in flight: wait before replacing it.
  PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
  if (bytes > lamb_work_bytes_) {
    PB_CUDA_OP(op, cuda::device_free(lamb_work_));
    lamb_work_ = nullptr;
    lamb_work_bytes_ = 0;
    PB_CUDA_OP(op, cudaMalloc(&lamb_work_, bytes));
    lamb_work_bytes_ = bytes;
  }
  char* w = static_cast<char*>(lamb_work_);
  if (chunk_bytes)
    PB_CUDA_OP(op, cuda::memcpy_sync(w, chunks.data(), chunk_bytes, cudaMemcpyHostToDevice));
  if (!ranges.empty())
    PB_CUDA_OP(op, cuda::memcpy_sync(w + range_at, ranges.data(),
                              ranges.size() * sizeof(cuda::LambTensorRange),
                              cudaMemcpyHostToDevice));
  lamb_rows_.assign(entries, entries + num_tensors);
  lamb_weight_decay_ = weight_decay;
  lamb_range_at_ = range_at;
  lamb_num_chunks_ = static_cast<int64_t>(chunks.size());
  return w;
}

void CudaBackend::lamb_update(const Tensor& table, const LambConfig& cfg,
                              const Tensor& global_grad_norm, const Tensor& params,
                              const Tensor& grads, const Tensor& m, const Tensor& v,
                              const Tensor& sums, const Tensor& record) {
  const trace::Range range("lamb_update");
  const char* op = "lamb_update";
  const auto [num_tensors, n] = checks::lamb_update_args(
      checks::OpArgs(op, Device::cuda, pointer_check()), table, cfg, global_grad_norm, params,
      grads, m, v, sums, record);
  begin(op);
  const auto* entries = static_cast<const LambTensor*>(table.data);
  checks::check_lamb_table(op, entries, num_tensors, n);
  const char* ws = lamb_work(op, entries, num_tensors, cfg.weight_decay);
  const int64_t num_chunks = lamb_num_chunks_;
  // As the CPU backend: the bias corrections in double, then rounded (lamb_step_scalars); the
  // kernels read them from step_scalars instead when it is given.
  const LambStepScalars sc = lamb_step_scalars(cfg);
  cuda::LambArgs a;
  a.lr = sc.lr;
  a.beta1 = cfg.beta1;
  a.beta2 = cfg.beta2;
  a.beta3 = 1.0f - cfg.beta1;
  a.bias_correction1 = sc.bias_correction1;
  a.bias_correction2 = sc.bias_correction2;
  a.eps = cfg.eps;
  a.max_grad_norm = cfg.max_grad_norm;
  a.grad_scale = sc.grad_scale;
  a.step_scalars = cfg.step_scalars.defined() ? cfg.step_scalars.ptr<float>() : nullptr;
  double* partial = scratch_doubles(op, static_cast<size_t>(std::max<int64_t>(num_chunks, 1)));
  launched(op, op,
           cuda::lamb_update(reinterpret_cast<const cuda::LambChunk*>(ws), num_chunks,
                             reinterpret_cast<const cuda::LambTensorRange*>(ws + lamb_range_at_),
                             num_tensors, a, global_grad_norm.ptr<float>(),
                             n ? params.ptr<float>() : nullptr, n ? grads.ptr<float>() : nullptr,
                             n ? m.ptr<float>() : nullptr, n ? v.ptr<float>() : nullptr,
                             num_tensors ? sums.ptr<double>() : nullptr, partial,
                             record.defined() ? record.ptr<int32_t>() : nullptr, stream_));
  end(op);
}

void CudaBackend::lamb_apply(const Tensor& table, const LambConfig& cfg,
                             const Tensor& global_grad_norm, const Tensor& sums,
                             const Tensor& params, const Tensor& grads, const Tensor& params_lowp,
                             const Tensor& norms_ws) {
  const trace::Range range("lamb_apply");
  const char* op = "lamb_apply";
  const auto [num_tensors, n] = checks::lamb_apply_args(
      checks::OpArgs(op, Device::cuda, pointer_check()), table, cfg, global_grad_norm, sums,
      params, grads, norms_ws);
  cuda::FloatFormat lowp_format = cuda::FloatFormat::f32;
  if (params_lowp.defined()) {
    PB_REQUIRE(lowp::is_lowp(params_lowp.dtype), "{}: params_lowp is {}, expected bf16 or f16",
               op, params_lowp.str());
    expect(op, "params_lowp", params_lowp, params_lowp.dtype, {n});
    lowp_format = float_format(op, "params_lowp", params_lowp);
  }
  begin(op);
  const auto* entries = static_cast<const LambTensor*>(table.data);
  checks::check_lamb_table(op, entries, num_tensors, n);
  if (num_tensors == 0) return end(op);
  const char* ws = lamb_work(op, entries, num_tensors, cfg.weight_decay);
  launched(op, op,
           cuda::lamb_apply(reinterpret_cast<const cuda::LambChunk*>(ws), lamb_num_chunks_,
                            reinterpret_cast<const cuda::LambTensorRange*>(ws + lamb_range_at_),
                            num_tensors, cfg.lr, cfg.grad_scale,
                            cfg.step_scalars.defined() ? cfg.step_scalars.ptr<float>() : nullptr,
                            global_grad_norm.ptr<float>(),
                            sums.ptr<double>(), n ? params.ptr<float>() : nullptr,
                            n ? grads.ptr<float>() : nullptr,
                            n && params_lowp.defined() ? params_lowp.data : nullptr, lowp_format,
                            norms_ws.defined() ? norms_ws.ptr<float>() : nullptr, stream_));
  end(op);
}

}  // namespace packbert
