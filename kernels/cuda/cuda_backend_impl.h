// CudaBackend's declaration and the host helpers its .cpp files share (internal to kernels/cuda).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/base/trace.h"
#include "kernels/common/lowp_adapter.h"
#include "kernels/common/op_checks.h"
#include "kernels/cuda/counters.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/fmha.h"
#include "kernels/ops/op_args.h"

// Every CUDA runtime call is checked; the error names the op, the call and file:line.
#define PB_CUDA_OP(op, call)                                                                       \
  do {                                                                                             \
    const cudaError_t pb_err_ = (call);                                                            \
    if (pb_err_ != cudaSuccess)                                                                    \
      PB_THROW("{}: CUDA error '{}' ({}) from {} at {}:{}", op, cudaGetErrorString(pb_err_),       \
               cudaGetErrorName(pb_err_), #call, __FILE__, __LINE__);                              \
  } while (0)

#define PB_CUBLASLT_OP(op, call)                                                                   \
  do {                                                                                             \
    const cublasStatus_t pb_st_ = (call);                                                          \
    if (pb_st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      PB_THROW("{}: cuBLASLt error {} ({}) from {} at {}:{}", op, cublasLtGetStatusName(pb_st_),   \
               cublasLtGetStatusString(pb_st_), #call, __FILE__, __LINE__);                        \
  } while (0)

namespace packbert {

// One cuBLASLt matmul in column-major terms: D = alpha op(A) op(B) + beta C with C = D
// (m x n, ld ldc), alpha = 1. A is stored (transa ? k x m : m x k), B (transb ? n x k : k x n).
// Types: fp32 throughout, or A and B both bf16 / f16 with C = D of that type or fp32 (the
// weight gradients); the compute type is always fp32 and a bias (vector) is always fp32.
struct GemmCall {
  bool transa = false, transb = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  cudaDataType_t ab_type = CUDA_R_32F;  // A and B
  cudaDataType_t c_type = CUDA_R_32F;   // C and D
  float alpha = 1.f;                    // D = alpha op(A) op(B) + beta C
  float beta = 0.f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;  // BIAS: the bias (read); BGRADB: the bias gradient (written, not added)
  // GELU_AUX_BIAS: the pre-activation (written); DGELU: the pre-activation (read). Same type,
  // shape and leading dimension as D.
  void* aux = nullptr;
  // FP8 (fp8_gemm): B's type where it differs from A's (-1: ab_type); the device pointers to the
  // factors A and B are multiplied by (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, B_SCALE_POINTER);
  // FP8 fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM).
  int32_t b_type = -1;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool fast_accum = false;
};

// The column-major GEMM C [m x n] = op(A) op(B) (op = transpose where asked): A and B of type
// ab, C of type c, beta 0, no epilogue.
inline GemmCall gemm_call(bool transa, bool transb, int64_t m, int64_t n, int64_t k, const void* a,
                          int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc,
                          cudaDataType_t ab, cudaDataType_t c_type) {
  GemmCall g;
  g.transa = transa;
  g.transb = transb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.c = c;
  g.ldc = ldc;
  g.ab_type = ab;
  g.c_type = c_type;
  return g;
}

// The memory and conversions of the low-precision adapter (common/lowp_adapter.h) on a
// device: grow-only fp32 slots and the convert kernel on the backend's stream. The ops without
// a native bf16 / f16 kernel run through it (widen, fp32 kernel, round back).
class CudaLowpStaging final : public lowp::Staging {
 public:
  explicit CudaLowpStaging(const cudaStream_t& stream) : stream_(stream) {}
  ~CudaLowpStaging() override;
  CudaLowpStaging(const CudaLowpStaging&) = delete;
  CudaLowpStaging& operator=(const CudaLowpStaging&) = delete;
  float* scratch(int slot, int64_t n) override;
  void widen(const Tensor& dst, const Tensor& src) override;
  void narrow(const Tensor& dst, const Tensor& src) override;

 private:
  const cudaStream_t& stream_;
  std::array<void*, lowp::kMaxStaged> slots_{};
  std::array<size_t, lowp::kMaxStaged> bytes_{};
};

// Vocabulary columns per block of the low-precision MLM decoder's backward (cuda_losses.cpp):
// as many as keep the rounded gradient of a block of m rows within 64 MiB, a multiple of 8
// (all v when they fit; at least min(8, v)).
int64_t mlm_backward_block_columns(int64_t m, int64_t v, int64_t elem_bytes);

// The kernels' name for a float dtype (f32, bf16, f16; Error naming op and argument otherwise).
cuda::FloatFormat float_format(const char* op, const char* name, const Tensor& t);
// cuBLASLt's name for a float dtype (bf16, f16; fp32 for any other).
inline cudaDataType_t cuda_type(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : t == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
}
// The same view read as f32: a bf16 / f16 op runs the shared shape checks (kernels/ops/) on it,
// and checks the dtypes itself.
inline Tensor shape_of(Tensor t) {
  if (t.defined()) t.dtype = DType::f32;
  return t;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }
  size_t workspace_bytes() const override;
  void* allocate_memory(size_t bytes) override;
  void free_memory(void* p) override;
  MemoryInfo memory_info() const override;  // cudaMemGetInfo on this backend's GPU
  void synchronize() override { synchronize("synchronize"); }
  void* native_stream() const override { return stream_; }
  BackendCounters counters() const override;
  bool supports_graphs() const override { return true; }
  void begin_capture() override;
  BackendGraph end_capture() override;
  void replay(const BackendGraph& graph) override;
  void destroy_graph(void* handle) noexcept override;
  void synchronize(const char* op);
  cudaStream_t stream() const { return stream_; }  // every op runs on it (native_stream())

  void write_floats(const Tensor& dst, const float* values, int n) override;
  void upload(const std::vector<HostUpload>& copies) override;
  void prefetch(const std::vector<HostUpload>& copies) override;
  cudaStream_t copy_stream() const { return copy_stream_; }  // prefetch()'s copies
  void read(const std::vector<HostRead>& reads) override;
  std::string fp8_unsupported() const override;

  // Every op (kernels/backend.h, PACKBERT_BACKEND_OPS), in a file per family: cuda_copies.cpp
  // (zero, copy), cuda_backend.cpp (convert), cuda_layernorm.cpp (embeddings, LayerNorm),
  // cuda_linear.cpp, cuda_attention.cpp, cuda_losses.cpp, cuda_lamb.cpp, cuda_fp8.cpp,
  // cuda_rotary.cpp, cuda_glu.cpp.
  PACKBERT_BACKEND_OPS(PACKBERT_OP_OVERRIDE)

 private:
  // ---- helpers (cuda_backend.cpp) ----
  void begin(const char* op);  // makes the backend's device current
  void end(const char* op);    // options_.sync_each_op: wait and check
  void launched(const char* op, const char* kernel, cudaError_t e);
  void expect(const char* op, const char* name, const Tensor& t, DType dtype,
              std::initializer_list<int64_t> dims);
  void expect_optional(const char* op, const char* name, const Tensor& t, DType dtype,
                       std::initializer_list<int64_t> dims);
  void check_pointer(const char* op, const char* name, const Tensor& t);
  // The per-tensor check this backend adds to the shared argument checks (kernels/ops/op_args.h).
  checks::OpArgs::Extra pointer_check() {
    return
        [this](const char* op, const char* name, const Tensor& t) { check_pointer(op, name, t); };
  }
  // Shapes and devices of the layout's tensors; with validate_indices also their contents.
  // An empty slot (length 0) only where `empty` allows it.
  cuda::DeviceLayout device_layout(const char* op, const SeqLayout& layout, int64_t rows,
                                   checks::EmptySeqs empty = checks::EmptySeqs::allowed);
  // What attention_forward and attention_backward set up alike once their tensors are checked
  // (cuda_attention.cpp): the device layout, the sequence lengths on the host (for the grouped
  // launch; read once, validation included) and the dropout stream.
  struct AttnLaunch {
    cuda::DeviceLayout dl;
    std::vector<int32_t> lens;
    DropoutStream ds;
  };
  AttnLaunch attention_launch(const char* op, const SeqLayout& layout, int64_t rows, int64_t heads,
                              const Dropout& dropout);
  // checks::checked_dropout_stream, and the device step (if any) checked as this GPU's memory.
  DropoutStream dropout_stream(const char* op, const Dropout& d, int64_t elements, int64_t heads,
                               int64_t max_position);
  // The grouped launch's plan: length buckets from launch.lens, or SeqLayout::fixed_launch's one
  // grid.
  static FmhaPlan attention_plan(const SeqLayout& layout, const AttnLaunch& launch);
  template <typename T>
  std::vector<T> to_host(const char* op, const Tensor& t);
  void check_indices(const char* op, const char* name, const Tensor& index, int64_t bound,
                     bool allow_none = false);
  // Grow-only device scratch (the documented exception to "the caller provides every buffer"):
  // doubles for the fixed-order reductions, floats for a bias gradient, bytes for LAMB's work
  // list. Warm after the first step of the largest shape.
  double* scratch_doubles(const char* op, size_t n);
  void sum_of_squares(const char* op, const Tensor& x, const Tensor& out);
  float* scratch_floats(const char* op, size_t n);
  void* scratch_bytes(const char* op, size_t n);

  // ---- cuBLASLt (cuda_gemm.cpp) ----
  // Runs the matmul; false when cuBLASLt has no algorithm for this epilogue or its matmul
  // refuses it (the caller then falls back to DEFAULT plus a kernel). The heuristic's choice,
  // and a refusal, are cached per shape.
  bool gemm(const char* op, const GemmCall& g);
  // The two GEMMs of linear_backward, shared by the fp32 and low-precision paths (operands of
  // type ab). dw [m, k] += g^T x in fp32, with BGRADB writing the bias gradient into db when
  // db is given and cuBLASLt has the epilogue: true when db got its share (else the caller
  // sums the columns). dx [n, k] = (or +=) g w, written in c_type.
  // With tanh_gelu_pre, dx is the gradient wrt that pre-activation through the tanh GELU,
  // fused as the DGELU epilogue: true when it was (else the caller runs the kernel).
  // alpha scales both products (g stored scaled, as the f16 MLM decoder's); db is then not
  // fused (BGRADB would sum the scaled g), so pass db only with alpha 1.
  bool weight_grad_gemm(const char* op, const void* x, const void* g, float* dw, float* db,
                        int64_t n, int64_t k, int64_t m, cudaDataType_t ab, float alpha = 1.f);
  bool input_grad_gemm(const char* op, const void* w, const void* g, void* dx, int64_t n, int64_t k,
                       int64_t m, bool accumulate, cudaDataType_t ab, cudaDataType_t c_type,
                       const void* tanh_gelu_pre = nullptr, float alpha = 1.f);
  // The forward GEMM out [n, m] = x [n, k] w^T, operands and output of one type.
  static GemmCall forward_gemm_call(const void* x, const void* w, void* out, int64_t n, int64_t k,
                                    int64_t m, cudaDataType_t type);
  // g (from forward_gemm_call, c = the pre-activation) as GELU_AUX_BIAS: out = gelu_tanh(x w^T
  // + bias), pre = x w^T + bias. False when cuBLASLt does not take it (the caller falls back).
  bool gelu_aux_gemm(const char* op, GemmCall g, void* out, const float* bias);

  // linear_forward / linear_backward with bf16 / f16 operands through cuBLASLt
  // (cuda_linear.cpp; true when they ran; false: a combination the native path does not take,
  // for the adapter).
  bool linear_forward_lowp(const Tensor& x, const Tensor& w, const Tensor& bias, Epilogue epilogue,
                           const Tensor& out, const Tensor& pre);
  bool linear_backward_lowp(const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                            const Tensor& dw, const Tensor& db,
                            const LinearBackwardOptions& options);
  // mlm_loss with x, w (and dx) bf16 / f16: the decoder GEMMs on the low-precision operands
  // (cuda_losses.cpp); false for a combination it does not take (the adapter's then).
  bool mlm_loss_lowp(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& labels,
                     const GradScale& grad_scale, const Tensor& logits_ws, const Tensor& loss_sum,
                     const Tensor& num_correct, const Tensor& dx, const Tensor& dw,
                     const Tensor& db);

  // nsp_loss (cuda_losses.cpp): the workspace's views [cls, pooled, dpooled, dcls, logits];
  // the fp32 head from the gathered cls rows to dcls (the weights fp32); the bf16 / f16 path
  // (false for a combination it does not take: the adapter's then).
  static std::array<Tensor, 5> nsp_workspace(const Tensor& workspace, int64_t s, int64_t h);
  static bool may_have_empty_slots(const SeqLayout& layout);
  std::pair<Tensor, Tensor> nsp_slots(const char* op, const SeqLayout& layout, const Tensor& labels,
                                      int32_t* scratch, bool derive);
  void nsp_head(const Tensor& workspace, int64_t s, int64_t h, const PoolerParams& params,
                const Tensor& labels, const GradScale& grad_scale, const Tensor& loss_sum,
                const Tensor& num_correct, bool backward, const PoolerParams& grads);
  bool nsp_loss_lowp(const SeqLayout& layout, const Tensor& x, const PoolerParams& params,
                     const Tensor& labels, const GradScale& grad_scale, const Tensor& workspace,
                     const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                     const PoolerParams& grads);

  struct GemmKey {
    int64_t m, n, k, lda, ldb, ldc;
    int32_t transa, transb, epilogue, beta_zero, ab_type, c_type, b_type, scaled, fast_accum;
    uint32_t align_a, align_b, align_c, align_bias, align_aux;
    bool operator==(const GemmKey& o) const;
  };
  struct GemmKeyHash {
    size_t operator()(const GemmKey& k) const;
  };
  struct GemmPlan {
    bool supported = false;
    cublasLtMatmulAlgo_t algo{};
  };

  int device_;
  int compute_capability_ = 0;
  std::string device_name_;
  CudaBackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;  // cuBLASLt workspace
  size_t workspace_bytes_ = 0;
  std::unordered_map<GemmKey, GemmPlan, GemmKeyHash> plans_;
  void* scratch_d_ = nullptr;
  size_t scratch_d_bytes_ = 0;
  void* scratch_f_ = nullptr;
  size_t scratch_f_bytes_ = 0;
  void* scratch_b_ = nullptr;
  size_t scratch_b_bytes_ = 0;
  // LAMB's work list, derived from the table on the host and uploaded once: it stays valid while
  // the rows and the weight decay it was made from (kept here to compare) stay the same.
  // lamb_work returns it (chunks, then at lamb_range_at_ the row ranges), rebuilt when needed.
  const char* lamb_work(const char* op, const LambTensor* entries, int64_t num_tensors,
                        float weight_decay);
  std::vector<LambTensor> lamb_rows_;
  float lamb_weight_decay_ = 0.f;
  void* lamb_work_ = nullptr;  // chunks, then (at lamb_range_at_) the tensor ranges
  size_t lamb_work_bytes_ = 0;
  size_t lamb_range_at_ = 0;
  int64_t lamb_num_chunks_ = 0;
  // Ops called with bf16 / f16 tensors and no native path run through this.
  CudaLowpStaging lowp_{stream_};
  // Attention's auxiliary streams, events and work list (grouped launch, cuda/fmha.h).
  std::unique_ptr<cuda::FmhaStreams> fmha_;
  // upload()'s pinned staging, two buffers used in turn: the host fills one while the stream
  // may still copy from the other; `done` is recorded after a buffer's copies.
  struct UploadStaging {
    void* data = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;  // done recorded and perhaps not yet reached
  };
  std::array<UploadStaging, 2> upload_staging_{};
  int next_upload_ = 0;
  // Stages copies into the next UploadStaging and copies them on `on` (stream_ for upload(),
  // copy_stream_ for prefetch()); returns that staging's `done` event, recorded after them
  // (nullptr when there was nothing to copy).
  cudaEvent_t stage_and_copy(const char* op, const std::vector<HostUpload>& copies,
                             cudaStream_t on);
  // prefetch()'s stream (non-blocking: it orders with stream_ only through events), and the
  // event recorded on stream_ at each prefetch() (the ops issued before it), which the next
  // prefetch()'s copies wait for.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t prefetch_issued_ = nullptr;
  bool prefetch_recorded_ = false;
  // read()'s pinned buffer (allocated at the first), kStagedCopyBytes: read() and copy() stage
  // host copies up to this size.
  static constexpr size_t kStagedCopyBytes = size_t{4} << 20;
  void* download_ = nullptr;
};

}  // namespace packbert
