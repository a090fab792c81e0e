// The part of cub the emulated CUDA build provides: the device-wide algorithms of
// kernels/cuda_emu/cub_algorithms.h.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
