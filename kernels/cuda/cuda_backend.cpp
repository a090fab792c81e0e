// CudaBackend: construction, argument checks, scratch, the device allocator, graphs, and the
// low-precision staging with convert. Zero, copies, uploads and read-backs are in
// cuda_copies.cpp; the other ops are in files by family, as the CPU backend's: cuda_linear.cpp
// (and cuda_gemm.cpp), cuda_attention.cpp, cuda_layernorm.cpp, cuda_losses.cpp, cuda_lamb.cpp,
// cuda_fp8.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/common/op_checks.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/device.h"
#include "kernels/ops/op_args.h"

// NVTX v3 is header-only (it loads the profiler's injection library when one is attached); the
// emulated build has a recorder of the same API (cuda_emu/include/nvtx3).
#include <nvtx3/nvToolsExt.h>

namespace packbert {

static_assert(sizeof(LambTensor) == 3 * sizeof(int64_t), "LambTensor is a row of i64 [T, 3]");

namespace {
constexpr size_t kWorkspaceBytes = kCudaGemmWorkspaceBytes;  // cuBLASLt workspace

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// The trace ranges (kernels/base/trace.h) as NVTX ranges: the phases of a step and every op, on the
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

void* cuda_alloc_named(const char* op, const char* what, size_t bytes, const std::string& note) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {  // not sticky: clear it, say what was asked and free
    cudaGetLastError();
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) cudaGetLastError();
    PB_THROW(
        "out of cuda memory: {}'s {} asked {} bytes ({:.1f} MiB), {:.1f} MiB free of "
        "{:.1f} MiB{}",
        op, what, bytes, static_cast<double>(bytes) / (1 << 20),
        static_cast<double>(free) / (1 << 20), static_cast<double>(total) / (1 << 20), note);
  }
  PB_CUDA_OP(op, e);
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
  cudaDeviceProp prop{};
  PB_CUDA_OP(op, cudaGetDeviceProperties(&prop, device_));
  compute_capability_ = prop.major * 10 + prop.minor;
  device_name_ = prop.name;
  // A blocking stream: it orders with the legacy default stream, so plain cudaMemcpy in tests
  // and callers sees this backend's work completed.
  PB_CUDA_OP(op, cudaStreamCreate(&stream_));
  PB_CUBLASLT_OP(op, cublasLtCreate(&lt_));
  PB_CUDA_OP(op, cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  fmha_ = std::make_unique<cuda::FmhaStreams>();
  fmha_->oom_note = [this] { return planned_note(); };
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

size_t CudaBackend::workspace_bytes() const {
  return workspace_bytes_ + scratch_d_bytes_ + scratch_f_bytes_ + scratch_b_bytes_ +
         lamb_work_bytes_ + (fmha_ ? fmha_->device_bytes() : 0);
}

Backend::MemoryInfo CudaBackend::memory_info() const {
  MemoryInfo m;
  (void)cudaSetDevice(device_);
  if (cudaMemGetInfo(&m.free, &m.total) != cudaSuccess) cudaGetLastError();
  return m;
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
    PB_CUDA_OP(
        op, cuda::memcpy_async(h.data(), t.ptr<T>(), t.bytes(), cudaMemcpyDeviceToHost, stream_));
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
        op, l, {start.data(), len.data(), sample.data(), tseq.data(), tpos.data()}, rows, empty);
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
// owner (optional): the backend whose plan an out-of-memory message names.
void* grow(const char* op, void*& p, size_t& have, size_t want, const Backend* owner) {
  if (want <= have) return p;
  // Freed now (cudaFree waits for the work that may still use it), or once no recorded graph
  // that may read it lives.
  if (p) PB_CUDA_OP(op, cuda::retire(p));
  p = nullptr;
  have = 0;
  const size_t bytes = want + want / 4;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {  // not sticky: clear it, say what was asked and free
    cudaGetLastError();
    p = nullptr;
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) cudaGetLastError();
    PB_THROW(
        "out of cuda memory: {}'s scratch asked {} bytes ({:.1f} MiB), {:.1f} MiB free of "
        "{:.1f} MiB{}",
        op, bytes, static_cast<double>(bytes) / (1 << 20), static_cast<double>(free) / (1 << 20),
        static_cast<double>(total) / (1 << 20), owner ? owner->planned_note() : std::string());
  }
  PB_CUDA_OP(op, e);
  have = bytes;
  return p;
}
}  // namespace

double* CudaBackend::scratch_doubles(const char* op, size_t n) {
  return static_cast<double*>(
      grow(op, scratch_d_, scratch_d_bytes_, (n ? n : 1) * sizeof(double), this));
}
float* CudaBackend::scratch_floats(const char* op, size_t n) {
  return static_cast<float*>(
      grow(op, scratch_f_, scratch_f_bytes_, (n ? n : 1) * sizeof(float), this));
}
void* CudaBackend::scratch_bytes(const char* op, size_t n) {
  return grow(op, scratch_b_, scratch_b_bytes_, n ? n : 1, this);
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
      grow(op, slots_[i], bytes_[i], static_cast<size_t>(n > 0 ? n : 1) * sizeof(float), nullptr));
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

}  // namespace packbert
