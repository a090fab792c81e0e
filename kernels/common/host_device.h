// PB_HD marks per-element math shared by the CPU and CUDA backends (DESIGN.md, Testing): under
// nvcc it is __host__ __device__, in plain C++ it is nothing, so the CPU backend's tests run the
// very functions the CUDA kernels call.
#pragma once

#if defined(__CUDACC__)
#define PB_HD __host__ __device__ __forceinline__
#else
#define PB_HD inline
#endif
