// The emulated NVTX (include/nvtx3/nvToolsExt.h): a record of the range pushes and pops.
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda_emu/runtime.h"

namespace {

std::mutex& record_mutex() {
  static std::mutex m;
  return m;
}
std::vector<packbert::emu::NvtxEvent>& record() {
  static std::vector<packbert::emu::NvtxEvent> r;
  return r;
}
thread_local int depth = 0;  // ranges open on this thread

void note(bool push, const char* name, int at) {
  std::lock_guard<std::mutex> lk(record_mutex());
  record().push_back({push, name ? name : "", at, std::this_thread::get_id()});
}

}  // namespace

extern "C" int nvtxRangePushA(const char* message) {
  note(true, message, depth);
  return depth++;
}

extern "C" int nvtxRangePop(void) {
  if (depth == 0) return -1;
  --depth;
  note(false, nullptr, depth);
  return depth;
}

namespace packbert::emu {

std::vector<NvtxEvent> take_nvtx_events() {
  std::lock_guard<std::mutex> lk(record_mutex());
  return std::exchange(record(), {});
}

}  // namespace packbert::emu
