// The emulated CUDA execution model: every CUDA thread of a block is a fiber (Boost.Context's
// fcontext, a stack switch of a few nanoseconds), and the block's fibers run on one OS thread
// under a round-robin scheduler that resumes each ready thread in turn until it blocks: at
// __syncthreads, at a warp-collective operation whose lanes have not all arrived, or at its end.
// Blocks run one after another, in order of their linear index.
//
// What this makes checkable:
// - __syncthreads is a real barrier; a barrier that not every thread reaches (some exited, or
//   they wait elsewhere) is an error naming the kernel, the block and the threads.
// - Warp operations (shuffles, mma.sync) wait for every lane of their mask; a lane that has
//   exited, never arrives, or arrives at another operation is an error naming the lanes.
// - Under the sanitizers (tests/emulation): each CUDA thread is a fiber of its own to
//   AddressSanitizer (stack bounds announced at every switch) and to ThreadSanitizer (a fiber
//   context per thread; switches into a thread carry the scheduler's happens-before, switches
//   out carry none). Only __syncthreads orders one thread's memory accesses before another's
//   within a block (release on arrival, acquire on leaving), so a missing barrier is a data
//   race. Consecutive blocks, kernels and host code are ordered through the scheduler. This
//   file is compiled without instrumentation: its own bookkeeping is invisible to the tools.
#include <boost/context/detail/fcontext.hpp>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda_emu/device.h"
#include "kernels/cuda_emu/ptx.h"
#include "kernels/cuda_emu/runtime.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

// The sanitizers' fiber interfaces (common_interface_defs.h, tsan_interface.h): weak, present
// only when a sanitizer's runtime is linked.
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size)
    __attribute__((weak));
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                     size_t* size_old) __attribute__((weak));
void __asan_unpoison_memory_region(void const volatile* addr, size_t size) __attribute__((weak));
void* __tsan_get_current_fiber() __attribute__((weak));
void* __tsan_create_fiber(unsigned flags) __attribute__((weak));
void __tsan_switch_to_fiber(void* fiber, unsigned flags) __attribute__((weak));
void __tsan_acquire(void* addr) __attribute__((weak));
void __tsan_release(void* addr) __attribute__((weak));
}

namespace packbert::emu {
namespace {

namespace fc = boost::context::detail;

constexpr size_t kStackBytes = size_t{256} << 10;  // per CUDA thread (ASan's frames are larger)
constexpr size_t kGuardBytes = size_t{4} << 10;    // PROT_NONE below each stack: overflow faults
constexpr unsigned kTsanNoSync = 1u;               // __tsan_switch_to_fiber_no_sync

enum class State : uint8_t { ready, barrier, warp, done };

// What a switch needs of a context: the scheduler's (the OS thread's own stack) or a CUDA
// thread's fiber.
struct Context {
  fc::fcontext_t fc = nullptr;
  void* tsan = nullptr;  // ThreadSanitizer's fiber
  void* asan_fake_stack = nullptr;
  const void* stack_bottom = nullptr;  // AddressSanitizer: the stack it runs on
  size_t stack_size = 0;
};

struct Thread {
  Context ctx;
  char* stack = nullptr;     // lowest usable byte; kStackBytes long
  bool stack_dirty = false;  // abandoned mid-kernel: its stack may still hold ASan's poison
  uint3 idx{};
  State state = State::done;
  const char* waiting_at = nullptr;  // the warp operation it waits in
  uint32_t warp_out[kWarpWords] = {};
  AsyncCopies copies;  // cp.async copies not yet complete (ptx.cpp)
};

struct WarpOp {
  const char* op = nullptr;
  unsigned mask = 0, arrived = 0;
  uint32_t in[32][kWarpWords];  // not initialised: each lane writes its own row
  uint32_t out[32][kWarpWords];
};

// A warp's pending operations: at most two at once (lanes of disjoint masks), in practice one.
struct Warp {
  unsigned exited = 0;  // lanes that have ended
  int pending = 0;
  WarpOp ops[2];
};

struct Block {
  const Launch* launch = nullptr;
  uint3 idx{};
  int threads = 0;
  int exited = 0;
  int barrier_waiting = 0;
  unsigned barrier_generation = 0;
  char barrier_sync[2] = {0, 0};  // ThreadSanitizer's sync objects, one per barrier parity
  char block_start_sync = 0;
  char block_end_sync = 0;
  Warp* warps = nullptr;  // the scheduler's, reset for the block
  void* dynamic_shared = nullptr;
  std::string error;
};

// One per OS thread that runs kernels (in practice one: run_kernel holds a process-wide lock).
struct Scheduler {
  Context main;
  std::vector<Thread> pool;
  std::vector<Warp> warps;  // 32: one per warp of the largest block
  Block* block = nullptr;
  int current = -1;  // the running CUDA thread; -1: the scheduler

  ~Scheduler() {
    for (Thread& t : pool)
      if (t.stack) munmap(t.stack - kGuardBytes, kStackBytes + kGuardBytes);
  }
};

thread_local Scheduler* g_sched = nullptr;
std::mutex g_exec_mutex;  // one kernel at a time: __shared__ variables are process-wide statics

Scheduler& sched() {
  if (!g_sched) g_sched = new Scheduler();  // lives as long as its OS thread's kernels may
  return *g_sched;
}

// threadIdx of linear thread t, as "(x,y,z)".
std::string thread_name(const Block& b, int t) {
  const dim3 bd = b.launch->block;
  const unsigned x = static_cast<unsigned>(t) % bd.x, y = static_cast<unsigned>(t) / bd.x % bd.y,
                 z = static_cast<unsigned>(t) / (bd.x * bd.y);
  return "(" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
}

// "3-7, 12" for a set of linear thread indices.
std::string ranges(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(v[i]);
    if (j > i) s += "-" + std::to_string(v[j]);
    i = j + 1;
  }
  return s;
}

std::string where(const Block& b) {
  const Launch& l = *b.launch;
  auto d3 = [](unsigned x, unsigned y, unsigned z) {
    return "(" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
  };
  return "kernel '" + l.name + "' (grid " + d3(l.grid.x, l.grid.y, l.grid.z) + ", block " +
         d3(l.block.x, l.block.y, l.block.z) + "), block " + d3(b.idx.x, b.idx.y, b.idx.z);
}

// ---- switching -------------------------------------------------------------------------------
// A thread that blocks or ends hands over to the next ready thread of the block (round robin
// from its own index) directly, and to the scheduler only when none is ready: a warp operation
// costs one switch per lane.
Context& context_of(Scheduler& s, int t) {
  return t < 0 ? s.main : s.pool[static_cast<size_t>(t)].ctx;
}

// Whoever switched to us left its suspended state in the transfer.
void arrived(const fc::transfer_t& r) { static_cast<Context*>(r.data)->fc = r.fctx; }

// From the running context to thread `to` (-1: the scheduler); returns when some context
// switches back. `leaving`: the running thread never runs again. Only switches out of the
// scheduler carry happens-before to ThreadSanitizer.
void switch_to(Scheduler& s, int to, bool leaving) {
  const int from = s.current;
  Context& f = context_of(s, from);
  Context& t = context_of(s, to);
  s.current = to;
  if (to >= 0) threadIdx = s.pool[static_cast<size_t>(to)].idx;
  if (__tsan_switch_to_fiber) __tsan_switch_to_fiber(t.tsan, from < 0 ? 0 : kTsanNoSync);
  if (__sanitizer_start_switch_fiber)
    __sanitizer_start_switch_fiber(leaving ? nullptr : &f.asan_fake_stack, t.stack_bottom,
                                   t.stack_size);
  const fc::transfer_t r = fc::jump_fcontext(t.fc, &f);
  arrived(r);
  if (__sanitizer_finish_switch_fiber)
    __sanitizer_finish_switch_fiber(f.asan_fake_stack, nullptr, nullptr);
}

// The next ready thread after the running one, cyclically; -1 when none.
int next_ready(const Scheduler& s, int threads) {
  for (int i = 1; i <= threads; ++i) {
    const int t = (s.current + i) % threads;
    if (s.pool[static_cast<size_t>(t)].state == State::ready) return t;
  }
  return -1;
}

// The running thread waits (its state already says for what) until it is ready again.
void block_here(Scheduler& s) { switch_to(s, next_ready(s, s.block->threads), false); }

// An error inside a kernel: recorded for the block, and the thread never runs again.
[[noreturn]] void abandon(Scheduler& s, std::string message) {
  Block& b = *s.block;
  if (b.error.empty()) b.error = where(b) + ": " + message;
  Thread& th = s.pool[static_cast<size_t>(s.current)];
  th.state = State::done;
  th.stack_dirty = true;
  switch_to(s, -1, true);
  std::abort();  // never resumed
}

std::vector<int> lanes_of(unsigned mask, int warp) {
  std::vector<int> v;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l) & 1u) v.push_back(warp * 32 + l);
  return v;
}

// A thread ends: it must not leave a barrier or a warp operation waiting for it.
void on_exit(Scheduler& s) {
  Block& b = *s.block;
  const int t = s.current;
  if (b.barrier_waiting > 0)
    abandon(s, "thread " + thread_name(b, t) + " exited while " +
                   std::to_string(b.barrier_waiting) +
                   " threads wait at __syncthreads (a barrier every thread must reach)");
  Warp& w = b.warps[t / 32];
  for (int i = 0; i < w.pending; ++i)
    if ((w.ops[i].mask >> (t % 32)) & 1u)
      abandon(s, "thread " + thread_name(b, t) + " (lane " + std::to_string(t % 32) +
                     ") exited while lanes " + ranges(lanes_of(w.ops[i].arrived, 0)) + " wait in " +
                     w.ops[i].op + " for it");
  const int pending = s.pool[static_cast<size_t>(t)].copies.count;
  if (pending > 0)
    abandon(s, "thread " + thread_name(b, t) + " exited with " + std::to_string(pending) +
                   " cp.async copies it never waited for (cp.async.wait_group)");
  w.exited |= 1u << (t % 32);
  ++b.exited;
}

void fiber_main(fc::transfer_t from) {
  arrived(from);
  Scheduler& s = sched();
  const void* bottom = nullptr;
  size_t size = 0;
  if (__sanitizer_finish_switch_fiber) __sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
  if (from.data == &s.main) {  // the first switch out of the OS thread's stack tells its bounds
    s.main.stack_bottom = bottom;
    s.main.stack_size = size;
  }
  if (__tsan_acquire) __tsan_acquire(&s.block->block_start_sync);
  s.block->launch->call->run();
  on_exit(s);
  s.pool[static_cast<size_t>(s.current)].state = State::done;
  if (__tsan_release) __tsan_release(&s.block->block_end_sync);
  switch_to(s, next_ready(s, s.block->threads), true);
  std::abort();  // never resumed
}

void prepare_thread(Scheduler& s, int t, uint3 idx) {
  Thread& th = s.pool[static_cast<size_t>(t)];
  if (!th.stack) {
    void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "cuda emulation: no memory for a thread stack\n");
      std::abort();
    }
    mprotect(m, kGuardBytes, PROT_NONE);
    th.stack = static_cast<char*>(m) + kGuardBytes;
    th.ctx.stack_bottom = th.stack;
    th.ctx.stack_size = kStackBytes;
    if (__tsan_create_fiber) th.ctx.tsan = __tsan_create_fiber(0);
  }
  if (th.stack_dirty && __asan_unpoison_memory_region)
    __asan_unpoison_memory_region(th.stack, kStackBytes);
  th.stack_dirty = false;
  th.ctx.fc = fc::make_fcontext(th.stack + kStackBytes, kStackBytes, fiber_main);
  th.idx = idx;
  th.state = State::ready;
  th.waiting_at = nullptr;
  th.copies.count = 0;
  th.copies.groups = 0;
  th.copies.committed = 0;
}

// No thread can run, yet not all have ended: say who waits where.
std::string describe_deadlock(Scheduler& s) {
  Block& b = *s.block;
  std::vector<int> at_barrier, done;
  for (int t = 0; t < b.threads; ++t) {
    const State st = s.pool[static_cast<size_t>(t)].state;
    if (st == State::barrier) at_barrier.push_back(t);
    if (st == State::done) done.push_back(t);
  }
  std::string m = "deadlock:";
  if (!at_barrier.empty()) m += " threads " + ranges(at_barrier) + " wait at __syncthreads;";
  for (int w = 0; w < (b.threads + 31) / 32; ++w)
    for (int i = 0; i < b.warps[w].pending; ++i) {
      const WarpOp& op = b.warps[w].ops[i];
      std::vector<int> missing = lanes_of(op.mask & ~op.arrived, w);
      m += " warp " + std::to_string(w) + " lanes " + ranges(lanes_of(op.arrived, 0)) +
           " wait in " + op.op + " for lanes " + ranges(lanes_of(op.mask & ~op.arrived, 0)) +
           " (threads " + ranges(missing) + ", which ";
      std::string states;
      for (int t : missing) {
        const Thread& th = s.pool[static_cast<size_t>(t)];
        const std::string st = th.state == State::barrier ? "wait at __syncthreads"
                               : th.state == State::done  ? "exited"
                               : th.waiting_at            ? std::string("wait in ") + th.waiting_at
                                                          : "run";
        if (states.find(st) == std::string::npos) states += (states.empty() ? "" : "; ") + st;
      }
      m += states + ");";
    }
  if (!done.empty()) m += " threads " + ranges(done) + " have exited";
  return m;
}

void run_block(Scheduler& s, Block& b) {
  const dim3 bd = b.launch->block;
  for (int t = 0; t < b.threads; ++t)
    prepare_thread(s, t,
                   uint3{static_cast<unsigned>(t) % bd.x, static_cast<unsigned>(t) / bd.x % bd.y,
                         static_cast<unsigned>(t) / (bd.x * bd.y)});
  if (__tsan_release) __tsan_release(&b.block_start_sync);
  s.current = -1;
  for (;;) {
    int t = 0;
    while (t < b.threads && s.pool[static_cast<size_t>(t)].state != State::ready) ++t;
    if (t == b.threads) break;
    switch_to(s, t, false);  // back when no thread is ready, or on an error
    if (!b.error.empty()) break;
  }
  if (b.error.empty() && b.exited < b.threads) {
    b.error = where(b) + ": " + describe_deadlock(s);
    for (int i = 0; i < b.threads; ++i)
      if (s.pool[static_cast<size_t>(i)].state != State::done)
        s.pool[static_cast<size_t>(i)].stack_dirty = true;
  }
  if (__tsan_acquire) __tsan_acquire(&b.block_end_sync);
}

Block& current_block(const char* what) {
  Scheduler* s = g_sched;
  if (!s || !s->block || s->current < 0) {
    std::fprintf(stderr, "cuda emulation: %s called outside a kernel\n", what);
    std::abort();
  }
  return *s->block;
}

}  // namespace

// ---- the device-side API --------------------------------------------------------------------
void syncthreads() {
  Block& b = current_block("__syncthreads");
  Scheduler& s = *g_sched;
  const int t = s.current;
  if (b.exited > 0) {
    std::vector<int> done;
    for (int i = 0; i < b.threads; ++i)
      if (s.pool[static_cast<size_t>(i)].state == State::done) done.push_back(i);
    abandon(s, "thread " + thread_name(b, t) + " reached __syncthreads after threads " +
                   ranges(done) + " exited (a barrier every thread must reach)");
  }
  const unsigned generation = b.barrier_generation;
  if (__tsan_release) __tsan_release(&b.barrier_sync[generation & 1u]);
  if (++b.barrier_waiting == b.threads) {
    b.barrier_waiting = 0;
    ++b.barrier_generation;
    for (int i = 0; i < b.threads; ++i)
      if (s.pool[static_cast<size_t>(i)].state == State::barrier)
        s.pool[static_cast<size_t>(i)].state = State::ready;
  } else {
    s.pool[static_cast<size_t>(t)].state = State::barrier;
    block_here(s);
  }
  if (__tsan_acquire) __tsan_acquire(&b.barrier_sync[generation & 1u]);
}

std::string hex(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", m);
  return buf;
}

// The checks of warp_collective, out of its hot path: the error of lane `lane`'s call, if any.
[[gnu::cold, gnu::noinline]] void warp_misuse(Scheduler& s, const char* op, unsigned mask,
                                              const Warp& wp) {
  Block& b = *s.block;
  const int t = s.current, warp = t / 32, lane = t % 32;
  if (!((mask >> lane) & 1u))
    abandon(s, std::string(op) + " by lane " + std::to_string(lane) + " of thread " +
                   thread_name(b, t) + " whose mask " + hex(mask) + " leaves it out");
  const int lanes = std::min(32, b.threads - warp * 32);
  const unsigned existing = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
  if (mask & ~existing)
    abandon(s, std::string(op) + " with mask " + hex(mask) + " names lanes " +
                   ranges(lanes_of(mask & ~existing, 0)) + " that warp " + std::to_string(warp) +
                   " of a " + std::to_string(b.threads) + "-thread block does not have");
  if (mask & wp.exited)
    abandon(s, std::string(op) + " in warp " + std::to_string(warp) + " with mask " + hex(mask) +
                   " names lanes " + ranges(lanes_of(mask & wp.exited, 0)) + ", which have exited");
  for (int i = 0; i < wp.pending; ++i) {
    const WarpOp& o = wp.ops[i];
    if (o.mask != mask && (o.mask & mask))
      abandon(s, "warp " + std::to_string(warp) + " lane " + std::to_string(lane) + " calls " + op +
                     " with mask " + hex(mask) + " while lanes " + ranges(lanes_of(o.arrived, 0)) +
                     " wait in " + o.op + " with mask " + hex(o.mask));
    if (o.mask == mask && std::strcmp(o.op, op) != 0)
      abandon(s, "warp " + std::to_string(warp) + " lanes disagree: lane " + std::to_string(lane) +
                     " calls " + op + " while lanes " + ranges(lanes_of(o.arrived, 0)) +
                     " wait in " + o.op + " (mask " + hex(mask) + ")");
  }
}

// The hot path of every shuffle and mma: a few bit tests, one copy in, one copy out.
void warp_collective(const char* op, unsigned mask, const uint32_t* in, int in_words, uint32_t* out,
                     int out_words, WarpCombine combine, const void* arg) {
  Scheduler& s = *g_sched;
  Block& b = current_block(op);
  const int t = s.current, warp = t / 32, lane = t % 32;
  Warp& wp = b.warps[warp];
  const unsigned existing =
      b.threads - warp * 32 >= 32 ? 0xffffffffu : ((1u << (b.threads - warp * 32)) - 1u);
  WarpOp* w = wp.pending > 0 && wp.ops[0].mask == mask ? &wp.ops[0] : nullptr;
  if (!((mask >> lane) & 1u) || (mask & ~existing) || (mask & wp.exited) ||
      (w ? (w->op != op && std::strcmp(w->op, op) != 0) : wp.pending > 0))
    warp_misuse(s, op, mask, wp);  // returns only when lanes of disjoint masks both wait
  for (int i = 1; !w && i < wp.pending; ++i)
    if (wp.ops[i].mask == mask) w = &wp.ops[i];
  if (!w) {
    if (wp.pending == 2)
      abandon(s, "warp " + std::to_string(warp) + ": three warp operations at once");
    w = &wp.ops[wp.pending++];
    w->op = op;
    w->mask = mask;
    w->arrived = 0;
  }
  for (int i = 0; i < in_words; ++i) w->in[lane][i] = in[i];
  w->arrived |= 1u << lane;
  Thread& me = s.pool[static_cast<size_t>(t)];
  if (w->arrived == mask) {
    combine(mask, w->in, w->out, arg);
    for (unsigned m = mask; m; m &= m - 1) {
      const int l = __builtin_ctz(m);
      Thread& th = s.pool[static_cast<size_t>(warp * 32 + l)];
      for (int i = 0; i < out_words; ++i) th.warp_out[i] = w->out[l][i];
      th.state = State::ready;
      th.waiting_at = nullptr;
    }
    const int last = --wp.pending;  // remove: the last pending one takes its place
    if (w != &wp.ops[last]) *w = wp.ops[last];
  } else {
    me.state = State::warp;
    me.waiting_at = op;
    block_here(s);
  }
  for (int i = 0; i < out_words; ++i) out[i] = me.warp_out[i];
}

void device_error(const char* message) {
  Block& b = current_block("device_error");
  abandon(*g_sched, "thread " + thread_name(b, g_sched->current) + ": " + message);
}

AsyncCopies& async_copies() {
  current_block("cp.async");
  return g_sched->pool[static_cast<size_t>(g_sched->current)].copies;
}

void* dynamic_shared_memory() { return current_block("dynamic shared memory").dynamic_shared; }

void shfl_combine(unsigned mask, const uint32_t (*in)[kWarpWords], uint32_t (*out)[kWarpWords],
                  const void* arg) {
  const ShflArg& a = *static_cast<const ShflArg*>(arg);
  const int width = a.width;
  for (int lane = 0; lane < 32; ++lane) {
    if (!((mask >> lane) & 1u)) continue;
    const int base = lane & ~(width - 1), n = static_cast<int>(in[lane][2]);
    int src = lane;
    switch (a.mode) {
      case ShflMode::idx: src = base + (n & (width - 1)); break;
      case ShflMode::xor_:
        src = lane ^ n;
        if (src >= base + width) src = lane;  // a later group: the lane's own value
        break;
      case ShflMode::up: src = lane - n >= base ? lane - n : lane; break;
      case ShflMode::down: src = lane + n < base + width ? lane + n : lane; break;
    }
    // A source lane outside the mask yields an undefined value on a GPU: here the caller's own.
    if (src < 0 || src > 31 || !((mask >> src) & 1u)) src = lane;
    out[lane][0] = in[src][0];
    out[lane][1] = in[src][1];
  }
}

int mutant() {
  static const int m = [] {
    const char* v = std::getenv("PACKBERT_EMU_MUTANT");
    return v ? std::atoi(v) : 0;
  }();
  return m;
}

void run_kernel(const Launch& l) {
  std::lock_guard<std::mutex> lock(g_exec_mutex);
  Scheduler& s = sched();
  if (!s.main.tsan && __tsan_get_current_fiber) s.main.tsan = __tsan_get_current_fiber();
  const int threads = static_cast<int>(l.block.x * l.block.y * l.block.z);
  if (s.pool.size() < static_cast<size_t>(threads)) s.pool.resize(static_cast<size_t>(threads));
  if (s.warps.empty()) s.warps.resize(32);
  blockDim = l.block;
  gridDim = l.grid;
  for (unsigned z = 0; z < l.grid.z; ++z)
    for (unsigned y = 0; y < l.grid.y; ++y)
      for (unsigned x = 0; x < l.grid.x; ++x) {
        Block b;
        b.launch = &l;
        b.idx = uint3{x, y, z};
        b.threads = threads;
        for (Warp& w : s.warps) {
          w.exited = 0;
          w.pending = 0;
        }
        b.warps = s.warps.data();
        if (l.shared_bytes) {
          // A heap block per launched block: out-of-bounds accesses meet ASan's redzones. Filled
          // with 0xff (a NaN in every float format): shared memory starts undefined on a GPU.
          if (posix_memalign(&b.dynamic_shared, 16, l.shared_bytes) != 0) {
            fault("no host memory for " + std::to_string(l.shared_bytes) +
                  " bytes of dynamic shared memory");
            return;
          }
          std::memset(b.dynamic_shared, 0xff, l.shared_bytes);
        }
        blockIdx = b.idx;
        s.block = &b;
        run_block(s, b);
        s.block = nullptr;
        std::free(b.dynamic_shared);
        if (!b.error.empty()) {
          fault(b.error);
          return;
        }
      }
}

}  // namespace packbert::emu
