// cub::DeviceRunLengthEncode for the emulated CUDA build: emulated on the CPU in
// kernels/cuda_emu/cub_algorithms.h.
#pragma once

#include "kernels/cuda_emu/cub_algorithms.h"
