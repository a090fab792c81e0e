// The scatter-add of the embedding backward into the three tables, in parallel and in a fixed
// order (cuda_kernels.h, embedding_scatter). The (table row, token row) pairs of a batch are
// sorted by table row with cub's radix sort, which is stable, so each table row's token rows
// stay in row order; runs of one table row are then added with one thread per (table row,
// column). A run of at most kPiece tokens is added straight into the table element in row
// order -- the CPU's order, so the same bits. A longer run (the [MASK] token's, a token type's)
// is cut into pieces of kPiece tokens summed in parallel, then the pieces are added in order:
// deterministic, but grouped otherwise than the CPU's one running sum.
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int64_t kPiece = 256;  // tokens per piece of a long run
constexpr int kColumns = 128;    // threads per block, one column each

// The bits of a key in [0, limit]: the sort looks at no more.
int key_bits(uint32_t limit) {
  int b = 1;
  while (b < 32 && (uint64_t{1} << b) <= limit) ++b;
  return b;
}

// Byte offsets of the scratch's parts (each 256-aligned), for n pairs.
struct ScratchLayout {
  size_t keys_in, keys_out, rows_in, rows_out, unique, counts, offsets, pieces, piece_offsets,
      num_runs, sums, temp, temp_bytes, total;
};

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// Upper bound of the pieces: every run longer than kPiece has ceil(len / kPiece) <= 2 len /
// kPiece of them, so at most 2 n / kPiece in all.
int64_t max_pieces(int64_t n) { return 2 * n / kPiece + 1; }

cudaError_t scratch_layout(int64_t n, int64_t h, int bits, ScratchLayout& s) {
  size_t sort_temp = 0, rle_temp = 0, scan_temp = 0;
  const int items = static_cast<int>(n);
  cudaError_t e = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_temp, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items, 0, bits);
  if (e != cudaSuccess) return e;
  e = cub::DeviceRunLengthEncode::Encode(
      nullptr, rle_temp, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items);
  if (e != cudaSuccess) return e;
  e = cub::DeviceScan::ExclusiveSum(nullptr, scan_temp, static_cast<const int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), items);
  if (e != cudaSuccess) return e;
  const size_t ints = align256(static_cast<size_t>(n) * 4);
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += align256(bytes);
    return here;
  };
  s.keys_in = take(ints);
  s.keys_out = take(ints);
  s.rows_in = take(ints);
  s.rows_out = take(ints);
  s.unique = take(ints);
  s.counts = take(ints);
  s.offsets = take(ints);
  s.pieces = take(ints);
  s.piece_offsets = take(ints);
  s.num_runs = take(4);
  s.sums = take(static_cast<size_t>(max_pieces(n) * h) * sizeof(float));
  s.temp_bytes = std::max(sort_temp, std::max(rle_temp, scan_temp));
  s.temp = take(s.temp_bytes);
  s.total = at;
  return cudaSuccess;
}

// Three pairs per row: (word id, row), (vocab + position, row), (vocab + positions + type, row);
// padding rows and absent tables get the key `limit`, which sorts last and is skipped.
__global__ void make_pairs_kernel(DeviceLayout l, const int32_t* input_ids,
                                  const int32_t* segment_ids, bool word, bool pos, bool type,
                                  uint32_t vocab, uint32_t positions, uint32_t limit,
                                  uint32_t* keys, int32_t* rows) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < l.rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    const bool real = l.token_seq[r] >= 0;
    keys[3 * r] = real && word ? static_cast<uint32_t>(input_ids[r]) : limit;
    keys[3 * r + 1] = real && pos ? vocab + static_cast<uint32_t>(l.token_pos[r]) : limit;
    keys[3 * r + 2] =
        real && type ? vocab + positions + static_cast<uint32_t>(segment_ids[r]) : limit;
    rows[3 * r] = rows[3 * r + 1] = rows[3 * r + 2] = static_cast<int32_t>(r);
  }
}

// pieces[s] = the pieces of run s: ceil(len / kPiece) for a run longer than kPiece, else 0
// (and 0 for the skipped run of key `limit`).
__global__ void count_pieces_kernel(const uint32_t* unique, const int32_t* counts,
                                    const int32_t* num_runs, uint32_t limit, int32_t* pieces,
                                    int64_t n) {
  for (int64_t s = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; s < n;
       s += int64_t{gridDim.x} * blockDim.x)
    pieces[s] = s < *num_runs && unique[s] < limit && counts[s] > kPiece
                    ? static_cast<int32_t>((counts[s] + kPiece - 1) / kPiece)
                    : 0;
}

// The run that piece q belongs to: the last s with piece_offsets[s] <= q and pieces[s] > 0.
__device__ int64_t run_of_piece(const int32_t* piece_offsets, const int32_t* pieces, int32_t runs,
                                int64_t q) {
  int64_t lo = 0, hi = runs - 1;
  while (lo < hi) {  // the last s with piece_offsets[s] <= q
    const int64_t mid = (lo + hi + 1) / 2;
    if (piece_offsets[mid] <= q)
      lo = mid;
    else
      hi = mid - 1;
  }
  while (lo > 0 && pieces[lo] == 0) --lo;  // runs without pieces share the next offset
  return lo;
}

// sums[q, c] = the in-order sum of piece q's tokens of column c.
__global__ void piece_sums_kernel(const int32_t* rows_sorted, const int32_t* offsets,
                                  const int32_t* counts, const int32_t* pieces,
                                  const int32_t* piece_offsets, const int32_t* num_runs,
                                  const float* d, int64_t h, float* sums) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int32_t runs = *num_runs;
  if (c >= h || runs == 0) return;
  const int64_t total = int64_t{piece_offsets[runs - 1]} + pieces[runs - 1];
  for (int64_t q = blockIdx.y; q < total; q += gridDim.y) {
    const int64_t s = run_of_piece(piece_offsets, pieces, runs, q);
    const int64_t begin = offsets[s] + (q - piece_offsets[s]) * kPiece;
    const int64_t run_end = int64_t{offsets[s]} + counts[s];
    const int64_t end = begin + kPiece < run_end ? begin + kPiece : run_end;
    float acc = 0.f;
    for (int64_t i = begin; i < end; ++i) acc += d[static_cast<int64_t>(rows_sorted[i]) * h + c];
    sums[q * h + c] = acc;
  }
}

// Adds run s into its table row: its tokens in order, or its pieces' sums in order.
__global__ void add_runs_kernel(const uint32_t* unique, const int32_t* rows_sorted,
                                const int32_t* offsets, const int32_t* counts,
                                const int32_t* pieces, const int32_t* piece_offsets,
                                const int32_t* num_runs, const float* d, const float* sums,
                                int64_t h, float* dword, float* dpos, float* dtype, uint32_t vocab,
                                uint32_t positions, uint32_t limit) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h) return;
  const int64_t runs = *num_runs;
  for (int64_t s = blockIdx.y; s < runs; s += gridDim.y) {
    const uint32_t key = unique[s];
    if (key >= limit) continue;
    float* table;
    int64_t row;
    if (key < vocab) {
      table = dword;
      row = key;
    } else if (key < vocab + positions) {
      table = dpos;
      row = key - vocab;
    } else {
      table = dtype;
      row = key - vocab - positions;
    }
    float acc = table[row * h + c];
    if (pieces[s] == 0) {
      for (int64_t i = offsets[s], end = i + counts[s]; i < end; ++i)
        acc += d[static_cast<int64_t>(rows_sorted[i]) * h + c];
    } else {
      for (int64_t q = piece_offsets[s], end = q + pieces[s]; q < end; ++q) acc += sums[q * h + c];
    }
    table[row * h + c] = acc;
  }
}

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace

size_t embedding_scatter_scratch_bytes(int64_t rows, int64_t h, int64_t key_limit) {
  ScratchLayout s{};
  if (scratch_layout(3 * rows, h, key_bits(static_cast<uint32_t>(key_limit)), s) != cudaSuccess)
    return 0;
  return s.total;
}

cudaError_t embedding_scatter(const DeviceLayout& l, const int32_t* input_ids,
                              const int32_t* segment_ids, int64_t h, const float* d, float* dword,
                              int64_t vocab, float* dpos, int64_t positions, float* dtype,
                              int64_t types, void* scratch, size_t scratch_bytes,
                              cudaStream_t stream) {
  if (l.rows == 0 || h == 0 || (!dword && !dpos && !dtype)) return cudaSuccess;
  const int64_t n = 3 * l.rows;
  const auto limit = static_cast<uint32_t>(vocab + positions + types);
  const int bits = key_bits(limit);
  ScratchLayout s{};
  cudaError_t e = scratch_layout(n, h, bits, s);
  if (e != cudaSuccess) return e;
  if (scratch_bytes < s.total) return cudaErrorInvalidValue;
  auto* keys_in = at<uint32_t>(scratch, s.keys_in);
  auto* keys_out = at<uint32_t>(scratch, s.keys_out);
  auto* rows_in = at<int32_t>(scratch, s.rows_in);
  auto* rows_out = at<int32_t>(scratch, s.rows_out);
  auto* unique = at<uint32_t>(scratch, s.unique);
  auto* counts = at<int32_t>(scratch, s.counts);
  auto* offsets = at<int32_t>(scratch, s.offsets);
  auto* pieces = at<int32_t>(scratch, s.pieces);
  auto* piece_offsets = at<int32_t>(scratch, s.piece_offsets);
  auto* num_runs = at<int32_t>(scratch, s.num_runs);
  auto* sums = at<float>(scratch, s.sums);
  void* temp = at<char>(scratch, s.temp);
  const int items = static_cast<int>(n);

  PB_LAUNCH(grid_for(l.rows, 256), 256, 0, stream, make_pairs_kernel)(
      l, input_ids, segment_ids, dword != nullptr, dpos != nullptr, dtype != nullptr,
      static_cast<uint32_t>(vocab), static_cast<uint32_t>(positions), limit, keys_in, rows_in);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  size_t temp_bytes = s.temp_bytes;
  e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, rows_in, rows_out, items,
                                      0, bits, stream);
  if (e != cudaSuccess) return e;
  count_launch();
  // counts beyond the runs stay 0, so the scans below read defined values only.
  if ((e = memset_async(counts, 0, static_cast<size_t>(n) * 4, stream)) != cudaSuccess) return e;
  temp_bytes = s.temp_bytes;
  e = cub::DeviceRunLengthEncode::Encode(temp, temp_bytes, keys_out, unique, counts, num_runs,
                                         items, stream);
  if (e != cudaSuccess) return e;
  count_launch();
  temp_bytes = s.temp_bytes;
  e = cub::DeviceScan::ExclusiveSum(temp, temp_bytes, counts, offsets, items, stream);
  if (e != cudaSuccess) return e;
  count_launch();
  PB_LAUNCH(grid_for(n, 256), 256, 0, stream, count_pieces_kernel)(unique, counts, num_runs, limit,
                                                                   pieces, n);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  temp_bytes = s.temp_bytes;
  e = cub::DeviceScan::ExclusiveSum(temp, temp_bytes, pieces, piece_offsets, items, stream);
  if (e != cudaSuccess) return e;
  count_launch();

  const dim3 block(kColumns);
  const auto col_blocks = static_cast<unsigned>((h + kColumns - 1) / kColumns);
  const dim3 piece_grid(col_blocks, static_cast<unsigned>(std::min(max_pieces(n), kMaxGridY)));
  PB_LAUNCH(piece_grid, block, 0, stream, piece_sums_kernel)(rows_out, offsets, counts, pieces,
                                                             piece_offsets, num_runs, d, h, sums);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const int64_t max_runs = std::min<int64_t>(n, int64_t{limit} + 1);
  const dim3 run_grid(col_blocks, static_cast<unsigned>(std::min(max_runs, kMaxGridY)));
  PB_LAUNCH(run_grid, block, 0, stream, add_runs_kernel)(
      unique, rows_out, offsets, counts, pieces, piece_offsets, num_runs, d, sums, h, dword, dpos,
      dtype, static_cast<uint32_t>(vocab), static_cast<uint32_t>(positions), limit);
  return cudaGetLastError();
}

}  // namespace packbert::cuda
