// Planted mistakes that the emulated tests must catch (tests/emulation/CMakeLists.txt runs each
// and expects failures): PACKBERT_EMU_MUTANT=N in the emulated build turns on PB_MUTANT(N),
// which is the constant false in every other build. Why mutants 1-5 sit in the kernels' text:
// kernels/cuda/device_seams.cuh. Mutants 6 and 7 are not a kernel's: the emulated runtime plants
// 6 (cudaStreamWaitEvent), the NCCL transport 7 (src/comm/nccl_transport.cpp).
#pragma once

#ifdef PACKBERT_CUDA_EMULATION
namespace packbert::emu {
int mutant();  // PACKBERT_EMU_MUTANT, 0 when unset (kernels/cuda_emu)
}  // namespace packbert::emu
#define PB_MUTANT(which) (::packbert::emu::mutant() == static_cast<int>(which))
#else
#define PB_MUTANT(which) false
#endif

namespace packbert::cuda {
enum class Mutant : int {
  fmha_b_halves = 1,           // the two 16-bit halves of an attention B register swapped
  fmha_a1_a2 = 2,              // registers a1 and a2 of an attention A fragment swapped
  fmha_dkv_dropout_words = 3,  // the dK/dV kernel's dropout words permuted among the lanes
  fmha_barrier = 4,            // a __syncthreads removed from the attention forward
  layernorm_barrier = 5,       // a __syncthreads removed from the LayerNorm block reduction
  comm_stream_wait = 6,        // the NCCL transport's communication stream not waiting for a
                               // bucket's ready event (planted by the emulated runtime's
                               // cudaStreamWaitEvent, kernels/cuda_emu/runtime.cpp)
  gather_group_wait = 7,       // the backend's stream not waiting for a group of the sharded
                               // optimizer's gathers before reading it (planted in the NCCL
                               // transport's wait_group, src/comm/nccl_transport.cpp)
};
}  // namespace packbert::cuda
