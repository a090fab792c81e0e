// The emulated CUDA execution model (kernels/cuda_emu) against CUDA's definitions: built-in
// indices, barriers and shared memory, warp shuffles, mma.sync against a plain matrix product
// with the fragments laid out from the PTX ISA's table (written here, apart from the
// emulation's), ldmatrix against plain loads laid out from its table, cp.async's groups (empty
// ones included), conversions, atomics, streams and events, and the errors a GPU leaves
// undefined (a barrier or a warp operation that not every thread reaches), which must name the
// kernel and the threads. A fault is sticky for the process, as on a GPU, so each faulting case
// runs in a child process (a death test).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/common/lowp_convert.h"
#include "kernels/cuda/device_seams.cuh"
#include "kernels/cuda_emu/runtime.h"

namespace {

template <typename T>
struct Dev {
  explicit Dev(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess); }
  Dev(const std::vector<T>& v) : Dev(v.size()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  T* p = nullptr;
  size_t n;
};

// ---- indices, barriers, shared memory ----------------------------------------------------------
__global__ void write_indices(int* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned id = block * blockDim.x * blockDim.y * blockDim.z + thread;
  out[4 * id] = static_cast<int>(threadIdx.x + 100 * threadIdx.y + 10000 * threadIdx.z);
  out[4 * id + 1] = static_cast<int>(blockIdx.x + 100 * blockIdx.y + 10000 * blockIdx.z);
  out[4 * id + 2] = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  out[4 * id + 3] = static_cast<int>(gridDim.x * gridDim.y * gridDim.z);
}

TEST(EmuExecution, BuiltInIndicesCoverTheGrid) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const int n = 12 * 24;
  Dev<int> out(4 * n);
  PB_LAUNCH(grid, block, 0, nullptr, write_indices)(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> h = out.get();
  int id = 0;
  for (unsigned bz = 0; bz < 2; ++bz)
    for (unsigned by = 0; by < 2; ++by)
      for (unsigned bx = 0; bx < 3; ++bx)
        for (unsigned tz = 0; tz < 2; ++tz)
          for (unsigned ty = 0; ty < 3; ++ty)
            for (unsigned tx = 0; tx < 4; ++tx, ++id) {
              EXPECT_EQ(h[4 * id], static_cast<int>(tx + 100 * ty + 10000 * tz));
              EXPECT_EQ(h[4 * id + 1], static_cast<int>(bx + 100 * by + 10000 * bz));
              EXPECT_EQ(h[4 * id + 2], 24);
              EXPECT_EQ(h[4 * id + 3], 12);
            }
}

// A tree reduction through shared memory: wrong without a real barrier between the levels.
__global__ void block_sums(const float* x, float* out) {
  __shared__ float s[256];
  const unsigned t = threadIdx.x;
  s[t] = x[blockIdx.x * 256 + t];
  __syncthreads();
  for (unsigned o = 128; o > 0; o >>= 1) {
    if (t < o) s[t] += s[t + o];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// The row reversed through dynamic shared memory.
__global__ void reverse_rows(const int* x, int* out, int n) {
  PB_EXTERN_SHARED(int, row);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x))
    row[i] = x[blockIdx.x * n + i];
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x))
    out[blockIdx.x * n + i] = row[n - 1 - i];
}

TEST(EmuExecution, BarriersAndSharedMemory) {
  std::mt19937_64 rng(7);
  std::vector<float> x(4 * 256);
  for (float& v : x) v = static_cast<float>(rng() % 1000);  // integers: exact sums
  Dev<float> dx(x), out(4);
  PB_LAUNCH(4, 256, 0, nullptr, block_sums)(dx.p, out.p);
  const std::vector<float> h = out.get();
  for (int b = 0; b < 4; ++b)
    EXPECT_EQ(h[b], std::accumulate(x.begin() + 256 * b, x.begin() + 256 * (b + 1), 0.f)) << b;

  const int n = 300;
  std::vector<int> rows(3 * n);
  std::iota(rows.begin(), rows.end(), 0);
  Dev<int> drows(rows), rev(3 * n);
  PB_LAUNCH(3, 64, n * sizeof(int), nullptr, reverse_rows)(drows.p, rev.p, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> r = rev.get();
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < n; ++i) EXPECT_EQ(r[b * n + i], b * n + n - 1 - i);
}

// ---- warp shuffles ----------------------------------------------------------------------------
// Each lane's value is 1000 * warp + lane; each mode's source lane as CUDA defines it.
__global__ void shuffles(int* out, int width) {
  const int lane = static_cast<int>(threadIdx.x % 32), v = 1000 * (threadIdx.x / 32) + lane;
  int* o = out + 4 * threadIdx.x;
  o[0] = __shfl_sync(0xffffffffu, v, (lane * 7 + 3) % 37, width);
  o[1] = __shfl_xor_sync(0xffffffffu, v, 5, width);
  o[2] = __shfl_up_sync(0xffffffffu, v, 3u, width);
  o[3] = __shfl_down_sync(0xffffffffu, v, 3u, width);
}

// Two half-warps shuffle at the same time, each with a mask of its own lanes.
__global__ void half_warp_shuffles(double* out) {
  const int lane = static_cast<int>(threadIdx.x);
  const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  const double v = 0.5 + lane;
  out[lane] = __shfl_sync(mask, v, lane < 16 ? 15 - lane : 47 - lane);
}

TEST(EmuExecution, ShufflesFollowCudasDefinitions) {
  for (int width : {32, 16, 8, 4}) {
    Dev<int> out(4 * 64);
    PB_LAUNCH(1, 64, 0, nullptr, shuffles)(out.p, width);
    const std::vector<int> h = out.get();
    for (int t = 0; t < 64; ++t) {
      const int lane = t % 32, base = lane / width * width, warp = t / 32;
      auto val = [&](int src) { return 1000 * warp + src; };
      EXPECT_EQ(h[4 * t], val(base + ((lane * 7 + 3) % 37) % width)) << "idx w" << width;
      const int x = lane ^ 5;
      EXPECT_EQ(h[4 * t + 1], val(x < base + width ? x : lane)) << "xor w" << width;
      EXPECT_EQ(h[4 * t + 2], val(lane - 3 >= base ? lane - 3 : lane)) << "up w" << width;
      EXPECT_EQ(h[4 * t + 3], val(lane + 3 < base + width ? lane + 3 : lane)) << "down w" << width;
    }
  }
  Dev<double> out(32);
  PB_LAUNCH(1, 32, 0, nullptr, half_warp_shuffles)(out.p);
  const std::vector<double> h = out.get();
  for (int lane = 0; lane < 32; ++lane)
    EXPECT_EQ(h[lane], 0.5 + (lane < 16 ? 15 - lane : 47 - lane));
}

// ---- mma.sync.m16n8k16 ------------------------------------------------------------------------
// The PTX ISA's fragment layout for mma.m16n8k16 with .bf16/.f16 A and B and .f32 C/D ("Matrix
// Fragments for mma.m16n8k16 with floating point type"), element by element: g = lane >> 2,
// t = lane % 4.
int a_row(int lane, int i) { return (lane >> 2) + ((i % 4) >= 2 ? 8 : 0); }
int a_col(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
int b_row(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
int b_col(int lane, int) { return lane >> 2; }
int c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
int c_col(int lane, int i) { return (lane % 4) * 2 + (i & 1); }

// a [16 x 16] and b [16 x 8] as 16-bit bit patterns (row-major), c and d [16 x 8] fp32.
__global__ void mma_tile(const uint16_t* a, const uint16_t* b, const float* c, float* d,
                         int is_f16) {
  const int lane = static_cast<int>(threadIdx.x);
  uint32_t ra[4], rb[2];
  float rc[4];
  for (int r = 0; r < 4; ++r) {
    const int lo = 2 * r, hi = 2 * r + 1;
    ra[r] = a[a_row(lane, lo) * 16 + a_col(lane, lo)] |
            (static_cast<uint32_t>(a[a_row(lane, hi) * 16 + a_col(lane, hi)]) << 16);
  }
  for (int r = 0; r < 2; ++r) {
    const int lo = 2 * r, hi = 2 * r + 1;
    rb[r] = b[b_row(lane, lo) * 8 + b_col(lane, lo)] |
            (static_cast<uint32_t>(b[b_row(lane, hi) * 8 + b_col(lane, hi)]) << 16);
  }
  for (int i = 0; i < 4; ++i) rc[i] = c[c_row(lane, i) * 8 + c_col(lane, i)];
  if (is_f16)
    packbert::cuda::mma_m16n8k16_f16(rc, ra, rb[0], rb[1]);
  else
    packbert::cuda::mma_m16n8k16_bf16(rc, ra, rb[0], rb[1]);
  for (int i = 0; i < 4; ++i) d[c_row(lane, i) * 8 + c_col(lane, i)] = rc[i];
}

TEST(EmuExecution, MmaIsTheMatrixProductOfThePtxFragments) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  for (int is_f16 : {0, 1}) {
    for (int rep = 0; rep < 5; ++rep) {
      std::vector<uint16_t> a(256), b(128);
      std::vector<double> av(256), bv(128);
      auto round16 = [&](float f, uint16_t& bits, double& v) {
        bits = is_f16 ? packbert::lowp::float_to_f16(f) : packbert::lowp::float_to_bf16(f);
        v = is_f16 ? packbert::lowp::f16_to_float(bits) : packbert::lowp::bf16_to_float(bits);
      };
      for (int i = 0; i < 256; ++i) round16(normal(rng), a[i], av[i]);
      for (int i = 0; i < 128; ++i) round16(normal(rng), b[i], bv[i]);
      std::vector<float> c(128);
      for (float& v : c) v = normal(rng);
      Dev<uint16_t> da(a), db(b);
      Dev<float> dc(c), dd(128);
      PB_LAUNCH(1, 32, 0, nullptr, mma_tile)(da.p, db.p, dc.p, dd.p, is_f16);
      const std::vector<float> d = dd.get();
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
          double want = c[i * 8 + j], scale = std::abs(want);
          for (int k = 0; k < 16; ++k) {
            want += av[i * 16 + k] * bv[k * 8 + j];
            scale += std::abs(av[i * 16 + k] * bv[k * 8 + j]);
          }
          // The 16-bit products are exact in fp32 (8 + 8 or 11 + 11 significant bits), so the
          // only rounding is of the 16 adds onto c: at most g(16) = 16 u / (1 - 16 u) = 9.5e-7
          // of the sum of the terms' magnitudes (u = 2^-24), within the 1e-6 of it allowed.
          EXPECT_NEAR(d[i * 8 + j], want, 1e-6 * scale)
              << "f16 " << is_f16 << " (" << i << "," << j << ")";
        }
    }
  }
}

// ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 --------------------------------
// The PTX ISA's table ("Warp-level matrix load instruction: ldmatrix"): lane 8 i + r addresses
// row r of matrix i; register i of lane L holds matrix i's elements (L / 4, 2 (L % 4)) and
// (L / 4, 2 (L % 4) + 1), with .trans (2 (L % 4), L / 4) and (2 (L % 4) + 1, L / 4), the first
// in the lower 16 bits.
uint32_t ldmatrix_expected(const std::vector<uint16_t>& rows, const std::vector<int>& slot, int i,
                           int lane, bool trans) {
  auto at = [&](int r, int c) -> uint32_t { return rows[slot[8 * i + r] * 8 + c]; };
  const int g = lane / 4, c = 2 * (lane % 4);
  return trans ? at(c, g) | (at(c + 1, g) << 16) : at(g, c) | (at(g, c + 1) << 16);
}

template <int N, bool Trans>
__device__ void ldmatrix_into(const uint16_t* row, uint32_t* out) {
  uint32_t r[N];
  packbert::cuda::ldmatrix_m8n8<N, Trans>(r, row);
  for (int i = 0; i < N; ++i) out[i] = r[i];
}

// 32 rows of 8 16-bit elements in shared memory; lane l addresses row slot[l] (a permutation, so
// the rows of a matrix lie anywhere); out[lane * 4 + i]: register i.
__global__ void ldmatrix_rows(const uint16_t* rows, const int* slot, uint32_t* out, int num,
                              int trans) {
  __shared__ __align__(16) uint16_t sm[32 * 8];
  const int lane = static_cast<int>(threadIdx.x);
  for (int e = 0; e < 8; ++e) sm[lane * 8 + e] = rows[lane * 8 + e];
  __syncthreads();
  const uint16_t* row = sm + slot[lane] * 8;
  uint32_t* o = out + lane * 4;
  if (num == 1) trans ? ldmatrix_into<1, true>(row, o) : ldmatrix_into<1, false>(row, o);
  if (num == 2) trans ? ldmatrix_into<2, true>(row, o) : ldmatrix_into<2, false>(row, o);
  if (num == 4) trans ? ldmatrix_into<4, true>(row, o) : ldmatrix_into<4, false>(row, o);
}

TEST(EmuExecution, LdmatrixGivesThePtxFragmentsOfTheAddressedRows) {
  std::mt19937_64 rng(12);
  for (int num : {1, 2, 4})
    for (int trans : {0, 1})
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<uint16_t> rows(32 * 8);
        for (uint16_t& v : rows) v = static_cast<uint16_t>(rng());
        std::vector<int> slot(32);
        std::iota(slot.begin(), slot.end(), 0);
        std::shuffle(slot.begin(), slot.end(), rng);
        Dev<uint16_t> drows(rows);
        Dev<int> dslot(slot);
        Dev<uint32_t> dout(std::vector<uint32_t>(32 * 4, 0xabababab));
        PB_LAUNCH(1, 32, 0, nullptr, ldmatrix_rows)(drows.p, dslot.p, dout.p, num, trans);
        const std::vector<uint32_t> got = dout.get();
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < num; ++i)
            EXPECT_EQ(got[lane * 4 + i], ldmatrix_expected(rows, slot, i, lane, trans))
                << ".x" << num << (trans ? ".trans" : "") << " lane " << lane << " reg " << i;
      }
}

// ---- cp.async -------------------------------------------------------------------------------
// Three groups of one 16-byte copy per thread (the third with src-size 0: zeros). seen[t * 5 + k]
// records the first word of a destination at five points: before any wait, after
// wait_group 2 (the first group complete), after wait_group 0 (all complete).
__global__ void cp_async_groups(const uint32_t* src, uint32_t* seen, uint32_t* dst_out) {
  __shared__ __align__(16) uint32_t sm[3][32][4];
  const int t = static_cast<int>(threadIdx.x);
  for (int g = 0; g < 3; ++g)
    for (int w = 0; w < 4; ++w) sm[g][t][w] = 0xdeadbeefu;
  for (int g = 0; g < 3; ++g) {
    packbert::cuda::cp_async_16(sm[g][t], src + (g * 32 + t) * 4, g == 2 ? 0 : 16);
    packbert::cuda::cp_async_commit();
  }
  uint32_t* s = seen + t * 5;
  s[0] = sm[0][t][0];
  packbert::cuda::cp_async_wait_group<2>();
  s[1] = sm[0][t][0];
  s[2] = sm[1][t][0];
  packbert::cuda::cp_async_wait_group<0>();
  s[3] = sm[1][t][0];
  s[4] = sm[2][t][0];
  for (int g = 0; g < 3; ++g)
    for (int w = 0; w < 4; ++w) dst_out[(g * 32 + t) * 4 + w] = sm[g][t][w];
}

TEST(EmuExecution, CpAsyncCompletesAGroupAtItsWait) {
  std::vector<uint32_t> src(3 * 32 * 4);
  std::mt19937 rng(13);
  for (uint32_t& v : src) v = rng() | 1u;  // never 0 (the zero fill) nor the sentinel
  Dev<uint32_t> dsrc(src), seen(32 * 5), dst(3 * 32 * 4);
  PB_LAUNCH(1, 32, 0, nullptr, cp_async_groups)(dsrc.p, seen.p, dst.p);
  const std::vector<uint32_t> s = seen.get(), d = dst.get();
  for (int t = 0; t < 32; ++t) {
    // Before its wait a copy has not landed: the emulation defers it to the wait (the latest
    // moment the PTX ISA allows), so kernels that read early fail their tests.
    EXPECT_EQ(s[t * 5 + 0], 0xdeadbeefu) << t;
    EXPECT_EQ(s[t * 5 + 1], src[t * 4]) << t;
    EXPECT_EQ(s[t * 5 + 2], 0xdeadbeefu) << t;  // wait_group 2 leaves the newest two groups
    EXPECT_EQ(s[t * 5 + 3], src[(32 + t) * 4]) << t;
    EXPECT_EQ(s[t * 5 + 4], 0u) << t;
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(d[t * 4 + w], src[t * 4 + w]);
      EXPECT_EQ(d[(32 + t) * 4 + w], src[(32 + t) * 4 + w]);
      EXPECT_EQ(d[(64 + t) * 4 + w], 0u);
    }
  }
}

// Empty groups (a commit with no copy since the last one), as the PTX ISA defines them: complete
// at once, yet each is one of the "N most recent" groups that cp.async.wait_group N may leave
// pending. Copies A and B committed in the order A, empty, B, empty, empty; seen[t * 4 + k]
// records the first word of a destination after each wait.
__global__ void cp_async_mixed_groups(const uint32_t* src, uint32_t* seen) {
  __shared__ __align__(16) uint32_t sm[2][32][4];
  const int t = static_cast<int>(threadIdx.x);
  for (int c = 0; c < 2; ++c)
    for (int w = 0; w < 4; ++w) sm[c][t][w] = 0xdeadbeefu;
  uint32_t* s = seen + t * 4;
  packbert::cuda::cp_async_16(sm[0][t], src + t * 4, 16);
  packbert::cuda::cp_async_commit();  // A
  packbert::cuda::cp_async_commit();  // empty
  packbert::cuda::cp_async_16(sm[1][t], src + (32 + t) * 4, 16);
  packbert::cuda::cp_async_commit();         // B
  packbert::cuda::cp_async_commit();         // empty
  packbert::cuda::cp_async_commit();         // empty
  packbert::cuda::cp_async_wait_group<4>();  // all but the newest 4 (B on): A
  s[0] = sm[0][t][0];
  s[1] = sm[1][t][0];
  packbert::cuda::cp_async_wait_group<3>();  // B is the third newest: it may stay pending
  s[2] = sm[1][t][0];
  packbert::cuda::cp_async_wait_group<2>();  // only the two empty groups may remain
  s[3] = sm[1][t][0];
}

TEST(EmuExecution, CpAsyncWaitGroupCountsEmptyGroups) {
  std::vector<uint32_t> src(2 * 32 * 4);
  std::mt19937 rng(17);
  for (uint32_t& v : src) v = rng() | 1u;
  Dev<uint32_t> dsrc(src), seen(32 * 4);
  PB_LAUNCH(1, 32, 0, nullptr, cp_async_mixed_groups)(dsrc.p, seen.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint32_t> s = seen.get();
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(s[t * 4 + 0], src[t * 4]) << t;
    // The emulation performs a copy at the wait that must complete it, not before.
    EXPECT_EQ(s[t * 4 + 1], 0xdeadbeefu) << t;
    EXPECT_EQ(s[t * 4 + 2], 0xdeadbeefu) << t;
    EXPECT_EQ(s[t * 4 + 3], src[(32 + t) * 4]) << t;
  }
}

// 200 empty groups with no copy in flight, then a copy followed by 200 empty groups: a thread
// may commit any number of groups, however few copies it has in flight.
__global__ void cp_async_many_empty_groups(const uint32_t* src, uint32_t* seen) {
  __shared__ __align__(16) uint32_t sm[32][4];
  const int t = static_cast<int>(threadIdx.x);
  for (int w = 0; w < 4; ++w) sm[t][w] = 0xdeadbeefu;
  uint32_t* s = seen + t * 3;
  for (int i = 0; i < 200; ++i) packbert::cuda::cp_async_commit();
  packbert::cuda::cp_async_wait_group<0>();
  packbert::cuda::cp_async_16(sm[t], src + t * 4, 16);
  for (int i = 0; i < 201; ++i) packbert::cuda::cp_async_commit();  // the copy's, 200 empty
  s[0] = sm[t][0];
  packbert::cuda::cp_async_wait_group<201>();  // the copy's group is among the newest 201
  s[1] = sm[t][0];
  packbert::cuda::cp_async_wait_group<200>();  // the newest 200 are empty: the copy lands
  s[2] = sm[t][0];
}

TEST(EmuExecution, CpAsyncEmptyGroupsCompleteAtOnce) {
  std::vector<uint32_t> src(32 * 4);
  std::mt19937 rng(19);
  for (uint32_t& v : src) v = rng() | 1u;
  Dev<uint32_t> dsrc(src), seen(32 * 3);
  PB_LAUNCH(1, 32, 0, nullptr, cp_async_many_empty_groups)(dsrc.p, seen.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint32_t> s = seen.get();
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(s[t * 3 + 0], 0xdeadbeefu) << t;
    EXPECT_EQ(s[t * 3 + 1], 0xdeadbeefu) << t;
    EXPECT_EQ(s[t * 3 + 2], src[t * 4]) << t;
  }
}

// ---- conversions, atomics --------------------------------------------------------------------
TEST(EmuExecution, SixteenBitConversionsRoundToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7: to the even, 1. 1 + 3 * 2^-8 lies
  // halfway between 1 + 2^-7 and 1 + 2^-6: to the even, 1 + 2^-6.
  EXPECT_EQ(__bfloat162float(__float2bfloat16_rn(1.f + std::ldexp(1.f, -8))), 1.f);
  EXPECT_EQ(__bfloat162float(__float2bfloat16_rn(1.f + 3 * std::ldexp(1.f, -8))),
            1.f + std::ldexp(1.f, -6));
  // f16: 1 + 2^-11 halfway between 1 and 1 + 2^-10; 2^-25 halfway between 0 and 2^-24.
  EXPECT_EQ(__half2float(__float2half_rn(1.f + std::ldexp(1.f, -11))), 1.f);
  EXPECT_EQ(__half2float(__float2half_rn(std::ldexp(1.f, -25))), 0.f);
  EXPECT_EQ(__half2float(__float2half_rn(std::ldexp(3.f, -26))), std::ldexp(1.f, -24));
  EXPECT_EQ(__float2bfloat16_rn(std::nanf("")).x, 0x7fffu);
  EXPECT_EQ(__float2half_rn(std::nanf("")).x, 0x7fffu);
  // Against the project's converters on random finite values of every magnitude.
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(__float2bfloat16_rn(f).x, packbert::lowp::float_to_bf16(f)) << f;
    ASSERT_EQ(__float2half_rn(f).x, packbert::lowp::float_to_f16(f)) << f;
  }
}

__global__ void atomics(int* sum, int* min) {
  const int id = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(sum, id);
  atomicMin(min, 1000 - id);
}

TEST(EmuExecution, Atomics) {
  Dev<int> sum(std::vector<int>{0}), mn(std::vector<int>{1 << 30});
  PB_LAUNCH(4, 96, 0, nullptr, atomics)(sum.p, mn.p);
  EXPECT_EQ(sum.get()[0], 383 * 384 / 2);
  EXPECT_EQ(mn.get()[0], 1000 - 383);
}

// ---- streams and events --------------------------------------------------------------------
__global__ void add_one(int* x) { x[threadIdx.x] += 1; }

TEST(EmuExecution, StreamsRunInIssueOrderAndWaitForEvents) {
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  Dev<int> x(std::vector<int>(32, 0));
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 32 * sizeof(int)), cudaSuccess);
  std::fill(pinned, pinned + 32, -1);
  PB_LAUNCH(1, 32, 0, a, add_one)(x.p);
  PB_LAUNCH(1, 32, 0, a, add_one)(x.p);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  PB_LAUNCH(1, 32, 0, a, add_one)(x.p);  // after the event: b must not see it
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned, x.p, 32 * sizeof(int), cudaMemcpyDeviceToHost, b), cudaSuccess);
  EXPECT_EQ(pinned[0], -1) << "an asynchronous copy ran before the host waited for it";
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(pinned[0], 2) << "b waits for the work before the event, and only for that";
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(x.get()[31], 3);
  cudaFreeHost(pinned);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST(EmuExecution, LegacyStreamWaitsForBlockingStreamsOnly) {
  cudaStream_t blocking, nonblocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
  Dev<int> x(std::vector<int>(32, 0)), y(std::vector<int>(32, 0));
  PB_LAUNCH(1, 32, 0, blocking, add_one)(x.p);
  PB_LAUNCH(1, 32, 0, nonblocking, add_one)(y.p);
  EXPECT_EQ(x.get()[0], 1);  // cudaMemcpy (legacy stream) waited for the blocking stream
  EXPECT_EQ(y.get()[0], 0);  // but not for the non-blocking one
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(y.get()[0], 1);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
}

// A query of unfinished work (an asynchronous item, as a collective waiting for its peers)
// answers cudaErrorNotReady, which CUDA never makes the last error: the next launch's
// cudaGetLastError must not report it (the trainer's launches check it, and once failed with
// "device not ready" after the NCCL transport polled an event).
TEST(EmuExecution, NotReadyIsNotTheLastError) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  ASSERT_EQ(packbert::emu::enqueue_async(
                s, "test item", [] {}, [finished] { return finished->load(); }),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  Dev<int> x(std::vector<int>(32, 0));
  PB_LAUNCH(1, 32, 0, nullptr, add_one)(x.p);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  finished->store(true);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

TEST(EmuExecution, BadCopiesAndLaunchesAreErrorsNotFaults) {
  Dev<float> x(100);
  std::vector<float> h(101);
  EXPECT_EQ(cudaMemcpy(x.p, h.data(), 101 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), x.p, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not sticky";
  PB_LAUNCH(1, 1025, 0, nullptr, add_one)(reinterpret_cast<int*>(x.p));
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  PB_LAUNCH(1, 32, 64 << 10, nullptr, add_one)(reinterpret_cast<int*>(x.p));
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- what a GPU leaves undefined: errors naming the kernel and the threads -------------------
__global__ void early_exit_then_barrier(int* x) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
  x[threadIdx.x] = 1;
}
__global__ void shuffle_with_exited_lane(int* x) {
  if (threadIdx.x == 7) return;
  x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}
__global__ void shuffle_against_barrier(int* x) {
  if (threadIdx.x < 16)
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  else
    __syncthreads();
}
__global__ void mma_with_missing_lane(float* d) {
  uint32_t a[4] = {0, 0, 0, 0};
  float c[4] = {0, 0, 0, 0};
  if (threadIdx.x == 31) return;
  packbert::cuda::mma_m16n8k16_bf16(c, a, 0u, 0u);
  d[threadIdx.x] = c[0];
}

__global__ void cp_async_never_waited(const uint32_t* src) {
  __shared__ __align__(16) uint32_t sm[32][4];
  packbert::cuda::cp_async_16(sm[threadIdx.x], src + threadIdx.x * 4, 16);
  packbert::cuda::cp_async_commit();
}

template <typename F>
void fault_in_child(F launch) {
  launch();
  const cudaError_t e = cudaDeviceSynchronize();
  void* p = nullptr;
  std::exit(e == cudaErrorLaunchFailure && cudaMalloc(&p, 16) == cudaErrorLaunchFailure ? 0 : 3);
}

TEST(EmuExecutionDeathTest, UndefinedSynchronisationIsAnErrorNamingTheThreads) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fault_in_child([] {
                Dev<int> x(64);
                PB_LAUNCH(2, 64, 0, nullptr, early_exit_then_barrier)(x.p);
              }),
              testing::ExitedWithCode(0),
              "kernel 'early_exit_then_barrier' .*block \\(0,0,0\\): thread \\(32,0,0\\) exited "
              "while 32 threads wait at __syncthreads");
  EXPECT_EXIT(fault_in_child([] {
                Dev<int> x(32);
                PB_LAUNCH(1, 32, 0, nullptr, shuffle_with_exited_lane)(x.p);
              }),
              testing::ExitedWithCode(0),
              "thread \\(7,0,0\\) \\(lane 7\\) exited while lanes "
              "0-6 wait in __shfl_xor_sync");
  EXPECT_EXIT(fault_in_child([] {
                Dev<int> x(32);
                PB_LAUNCH(1, 32, 0, nullptr, shuffle_against_barrier)(x.p);
              }),
              testing::ExitedWithCode(0),
              "deadlock: threads 16-31 wait at __syncthreads; warp 0 lanes 0-15 wait in "
              "__shfl_xor_sync for lanes 16-31");
  EXPECT_EXIT(fault_in_child([] {
                Dev<float> d(32);
                PB_LAUNCH(1, 32, 0, nullptr, mma_with_missing_lane)(d.p);
              }),
              testing::ExitedWithCode(0), "lane 31\\) exited while lanes 0-30 wait in mma.sync");
  EXPECT_EXIT(fault_in_child([] {
                Dev<uint32_t> src(32 * 4);
                PB_LAUNCH(1, 32, 0, nullptr, cp_async_never_waited)(src.p);
              }),
              testing::ExitedWithCode(0),
              "thread \\(0,0,0\\) exited with 1 cp.async copies it never waited for");
  EXPECT_EXIT(fault_in_child([] {
                std::vector<int> host(32);
                PB_LAUNCH(1, 32, 0, nullptr, add_one)(host.data());
              }),
              testing::ExitedWithCode(0), "kernel 'add_one': argument 0 is not device memory");
}

}  // namespace
