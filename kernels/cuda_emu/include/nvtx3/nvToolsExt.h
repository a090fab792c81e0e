// NVTX's range API (nvtx3/nvToolsExt.h, the part packbert calls) on the emulated device: a
// recorder that keeps every push and pop in call order, which the tests read back
// (cuda_emu/runtime.h, take_nvtx_events). As NVTX's: ranges belong to the calling thread and
// nest; push returns the depth of the new range, pop the depth of the range it ends (negative
// when there is none).
#pragma once

extern "C" {
int nvtxRangePushA(const char* message);
int nvtxRangePop(void);
}
