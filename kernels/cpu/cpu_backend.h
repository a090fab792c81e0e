// The reference backend: fp32, OpenBLAS for GEMMs, OpenMP loops for the rest. bf16 / f16
// tensors (mixed precision) are emulated: widened, run through the fp32 op, rounded back to
// nearest even (cpu_lowp.h), so the CPU also specifies what low-precision storage computes. It
// is the executable specification the CUDA backend is tested against, so clarity and
// determinism come before speed: every reduction runs in a fixed order that does not depend on
// the thread count (row-wise sums inside one row, column sums over rows in row order, long sums
// in fixed blocks).
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_lowp.h"

namespace packbert {

namespace cpu {
// Threads for OpenMP loops and OpenBLAS alike (multi-rank runs use 1 per rank).
void set_num_threads(int n);
int num_threads();
}  // namespace cpu

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }

  void* allocate_memory(size_t bytes) override;
  void free_memory(void* p) override;

  // Every op (kernels/backend.h, PACKBERT_BACKEND_OPS), in a file per family: cpu_backend.cpp
  // (zero, copy, convert), cpu_layernorm.cpp (embeddings, LayerNorm), cpu_linear.cpp,
  // cpu_attention.cpp, cpu_losses.cpp, cpu_lamb.cpp, cpu_fp8.cpp, cpu_rotary.cpp, cpu_glu.cpp.
  PACKBERT_BACKEND_OPS(PACKBERT_OP_OVERRIDE)

 private:
  // Grow-only scratch, the documented exception to "the caller provides every buffer": one
  // float buffer per OpenMP thread (attention score rows and dK/dV accumulators, sized by the
  // longest sequence) and one double buffer for fixed-order reductions. Warm after the first
  // step of the largest shape, so the step loop does not allocate.
  float* thread_scratch(int thread, size_t floats);
  void reserve_thread_scratch(size_t floats);
  double* reduction_scratch(size_t doubles);
  double sum_squares(const float* x, int64_t n);
  // The sequences of a layout by decreasing length (ties: by index), the attention ops' task
  // order; grow-only.
  const int32_t* longest_first(const SeqLayout& layout);
  // lamb_update / lamb_apply's grow-only tables: the first work item of each row, each row's
  // step size.
  int64_t* lamb_blocks(int64_t num_tensors);
  float* lamb_step_sizes(int64_t num_tensors);

  std::vector<std::vector<float>> thread_scratch_;
  std::vector<double> reduction_scratch_;
  std::vector<int32_t> seq_order_;
  std::vector<int64_t> lamb_blocks_;
  std::vector<float> lamb_step_sizes_;
  // fp8_gemm's de-scaled operands (and its fp32 outputs when out is 16-bit); grow-only.
  std::vector<float> fp8_scratch_;
  // Ops called with bf16 / f16 tensors run through this (cpu_lowp.h).
  cpu::LowpStaging lowp_;
};

}  // namespace packbert
