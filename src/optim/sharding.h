// How the sharded optimizer cuts the flat parameter buffer between ranks (optim.sharded): at
// tensor boundaries, so that every tensor lives whole on one rank and its trust ratio, its norms
// and the fused lamb_step stay exactly those of the unsharded optimizer. Each rank owns one
// contiguous range [bounds[r], bounds[r + 1]), the cut nearest to r / N of the elements that
// keeps the ranges ascending. The price is balance: a tensor larger than total / N (BERT-Large's
// word embeddings are 9% of its 335M parameters) makes its owner's range larger than the mean
// beyond 11 ranks; shard_imbalance() says by how much.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/lamb.h"

namespace packbert {

// bounds: ranks + 1 values from 0 to num_elems, each inner one a tensor boundary. The table may
// be in any order; it must not overlap (Error naming the tensors, as Lamb's check).
std::vector<int64_t> plan_tensor_shards(std::vector<LambParam> params, int64_t num_elems,
                                        int ranks);

// The largest range over the mean range (1: perfect balance).
double shard_imbalance(const std::vector<int64_t>& bounds);

}  // namespace packbert
