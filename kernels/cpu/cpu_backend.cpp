// CpuBackend: construction, thread control, scratch, and the helpers of cpu_common.h.
#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/common/op_checks.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_simd.h"

namespace packbert {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

namespace cpu {

void set_num_threads(int n) {
  PB_REQUIRE(n >= 1, "cpu threads must be >= 1, got {}", n);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

void expect(const char* op, const char* name, const Tensor& t, DType dtype,
            std::initializer_list<int64_t> dims) {
  check_tensor(op, name, t, dtype, dims);
  check_device(op, name, t, Device::cpu);
}

void expect_optional(const char* op, const char* name, const Tensor& t, DType dtype,
                     std::initializer_list<int64_t> dims) {
  if (t.defined()) expect(op, name, t, dtype, dims);
}

void check_layout(const char* op, const SeqLayout& l, int64_t rows, checks::EmptySeqs empty) {
  PB_REQUIRE(l.rows == rows, "{}: layout has {} rows, the buffers {}", op, l.rows, rows);
  PB_REQUIRE(l.num_seqs >= 0 && l.max_len >= 0, "{}: layout with {} sequences, max_len {}", op,
             l.num_seqs, l.max_len);
  const int64_t s = l.num_seqs;
  expect(op, "layout.seq_start", l.seq_start, DType::i32, {s});
  expect(op, "layout.seq_len", l.seq_len, DType::i32, {s});
  expect(op, "layout.sample_id", l.sample_id, DType::i64, {s});
  expect(op, "layout.token_seq", l.token_seq, DType::i32, {rows});
  expect(op, "layout.token_pos", l.token_pos, DType::i32, {rows});
  checks::check_layout_arrays(
      op, l,
      {l.seq_start.ptr<int32_t>(), l.seq_len.ptr<int32_t>(), l.sample_id.ptr<int64_t>(),
       l.token_seq.ptr<int32_t>(), l.token_pos.ptr<int32_t>()},
      rows, empty);
}

DropoutStream dropout_stream(const char* op, const Dropout& d, int64_t elements, int64_t heads,
                             int64_t max_position) {
  // The CPU's ops run when they are called: the device step (host memory here) is read now.
  return dropout_now(checks::checked_dropout_stream(op, d, elements, heads, max_position));
}

void row_dropout_factors(const DropoutStream& s, const SeqLayout& layout, int64_t row, int64_t n,
                         float* factors) {
  const int32_t seq = dropout_enabled(s) ? layout.token_seq.ptr<int32_t>()[row] : -1;
  if (seq < 0) {
    std::fill(factors, factors + n, 1.0f);
    return;
  }
  const auto sample = static_cast<uint64_t>(layout.sample_id.ptr<int64_t>()[seq]);
  const auto pos = static_cast<uint32_t>(layout.token_pos.ptr<int32_t>()[row]);
  dropout_row(s, sample, 0, pos, n, factors);  // SSE2 Philox, bit for bit dropout_bits4
}

constexpr int64_t kColumnBlock = 64;

int64_t column_blocks(int64_t cols) { return (cols + kColumnBlock - 1) / kColumnBlock; }

void add_column_sums_block(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t block,
                           float* out) {
  const int64_t c0 = block * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
  double acc[kColumnBlock] = {};
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ld;
    for (int64_t c = c0; c < c1; ++c) acc[c - c0] += xr[c];
  }
  for (int64_t c = c0; c < c1; ++c) out[c] += static_cast<float>(acc[c - c0]);
}

void add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
  const int64_t blocks = column_blocks(cols);
#pragma omp parallel for schedule(static) if (rows * cols >= 16384)
  for (int64_t b = 0; b < blocks; ++b) add_column_sums_block(x, rows, cols, ld, b, out);
}

}  // namespace cpu

void* CpuBackend::allocate_memory(size_t bytes) {
  if (bytes == 0) return nullptr;
  constexpr size_t kAlign = 256;
  void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  PB_REQUIRE(p != nullptr, "cpu backend: allocating {:.1f} MiB failed",
             static_cast<double>(bytes) / (1 << 20));
  return p;
}

void CpuBackend::free_memory(void* p) { std::free(p); }

void CpuBackend::zero(const Tensor& t) {
  PB_REQUIRE(t.defined(), "zero: t is missing");
  check_device("zero", "t", t, Device::cpu);
  std::memset(t.data, 0, t.bytes());
}

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  PB_REQUIRE(dst.defined() && src.defined(), "copy: dst {} / src {} missing", dst.str(), src.str());
  check_device("copy", "dst", dst, Device::cpu);
  check_device("copy", "src", src, Device::cpu);
  PB_REQUIRE(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: dst {} and src {} differ",
             dst.str(), src.str());
  const auto* s = static_cast<const char*>(src.data);
  const auto* d = static_cast<const char*>(dst.data);
  PB_REQUIRE(d + dst.bytes() <= s || s + src.bytes() <= d, "copy: dst and src overlap");
  std::memcpy(dst.data, src.data, src.bytes());
}

void CpuBackend::convert(const Tensor& dst, const Tensor& src) {
  PB_REQUIRE(dst.defined() && src.defined(), "convert: dst {} / src {} missing", dst.str(),
             src.str());
  check_device("convert", "dst", dst, Device::cpu);
  check_device("convert", "src", src, Device::cpu);
  auto is_float = [](DType t) { return t == DType::f32 || lowp::is_lowp(t); };
  PB_REQUIRE(is_float(dst.dtype) && is_float(src.dtype) && dst.numel() == src.numel(),
             "convert: dst {} and src {} must be float tensors (f32, bf16, f16) of one size",
             dst.str(), src.str());
  const auto* s = static_cast<const char*>(src.data);
  const auto* d = static_cast<const char*>(dst.data);
  PB_REQUIRE(d + dst.bytes() <= s || s + src.bytes() <= d, "convert: dst and src overlap");
  cpu::convert(dst.data, dst.dtype, src.data, src.dtype, src.numel());
}

float* CpuBackend::thread_scratch(int thread, size_t floats) {
  PB_CHECK(
      thread < static_cast<int>(thread_scratch_.size()) && thread_scratch_[thread].size() >= floats,
      "thread scratch {} not reserved for {} floats", thread, floats);
  return thread_scratch_[thread].data();
}

void CpuBackend::reserve_thread_scratch(size_t floats) {
  const size_t threads = static_cast<size_t>(omp_get_max_threads());
  if (thread_scratch_.size() < threads) thread_scratch_.resize(threads);
  for (auto& s : thread_scratch_)
    if (s.size() < floats) s.resize(floats);
}

double* CpuBackend::reduction_scratch(size_t doubles) {
  if (reduction_scratch_.size() < doubles) reduction_scratch_.resize(doubles);
  return reduction_scratch_.data();
}

const int32_t* CpuBackend::longest_first(const SeqLayout& layout) {
  const auto n = static_cast<size_t>(layout.num_seqs);
  if (seq_order_.size() < n) seq_order_.resize(n);
  const int32_t* len = layout.seq_len.ptr<int32_t>();
  for (size_t i = 0; i < n; ++i) seq_order_[i] = static_cast<int32_t>(i);
  std::stable_sort(seq_order_.begin(), seq_order_.begin() + static_cast<std::ptrdiff_t>(n),
                   [len](int32_t x, int32_t y) { return len[x] > len[y]; });
  return seq_order_.data();
}

int64_t* CpuBackend::lamb_blocks(int64_t num_tensors) {
  if (lamb_blocks_.size() < static_cast<size_t>(num_tensors + 1))
    lamb_blocks_.resize(static_cast<size_t>(num_tensors + 1));
  return lamb_blocks_.data();
}

float* CpuBackend::lamb_step_sizes(int64_t num_tensors) {
  if (lamb_step_sizes_.size() < static_cast<size_t>(num_tensors))
    lamb_step_sizes_.resize(static_cast<size_t>(num_tensors));
  return lamb_step_sizes_.data();
}

double CpuBackend::sum_squares(const float* x, int64_t n) {
  // Fixed blocks, each summed in order in double, then the blocks in order: the same bits for
  // any thread count.
  const int64_t blocks = (n + cpu::kSumBlock - 1) / cpu::kSumBlock;
  double* partial = reduction_scratch(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * cpu::kSumBlock;
    partial[b] = cpu::block_sum_squares(x + i0, std::min(n, i0 + cpu::kSumBlock) - i0);
  }
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) total += partial[b];
  return total;
}

}  // namespace packbert
