// How the sharded optimizer (optim.sharded, optim/distributed_lamb.h) cuts the flat parameter
// buffer between ranks: into one contiguous range per rank, of equal length to within
// kShardAlign elements, cut anywhere, inside a tensor too. A tensor cut between ranks gets its
// LAMB norms from the sums of squares of its pieces added over the ranks (Backend::lamb_update
// and lamb_apply), so the balance does not depend on the tensors: the largest range exceeds
// the mean by less than kShardAlign elements at any rank count.
#pragma once

#include <cstdint>
#include <vector>

namespace packbert {

// Every inner bound is a multiple of this many elements: 256 bytes of f32, 128 of bf16/fp16,
// so each rank's part of a buffer starts on a 128-byte line (NCCL moves and the copies stay
// aligned; the LAMB kernels themselves take any cut).
inline constexpr int64_t kShardAlign = 64;

// ranks + 1 ascending values from 0 to num_elems: rank r owns [bounds[r], bounds[r + 1]).
// The aligned units are dealt out as evenly as they go (floor(units * r / ranks)); a rank owns
// nothing only where there are fewer units than ranks.
std::vector<int64_t> plan_shards(int64_t num_elems, int ranks, int64_t align = kShardAlign);

// The largest range over the mean range (1: perfect balance).
double shard_imbalance(const std::vector<int64_t>& bounds);

}  // namespace packbert
