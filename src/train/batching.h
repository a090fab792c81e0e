// Where the data meets the model: the loader's samples of one micro-batch laid out as the Batch
// the model consumes (model/batch.h). Packing is the planner's (data/packing/planner.h), never done
// here.
#pragma once

#include <cstdint>
#include <vector>

#include "data/shards/sample.h"
#include "model/batch.h"

namespace packbert {

// The batch of `samples` in `layout`. For the packed layout, `packs` lists indices into
// samples per pack, as the loader hands them (LoaderMicroBatch::packs); other layouts ignore
// packs. Throws Error naming the sample (by index and id) on a length outside 1..max_seq_len, a
// masked position outside the sequence or not ascending, mismatched array sizes, an NSP label
// other than 0/1, a sample id outside the dropout key's [0, 2^44) or repeated, on packs that do
// not hold every sample exactly once within max_seq_len tokens, and on the packed layout given
// samples but no packs.
Batch make_batch(const std::vector<Sample>& samples, BatchLayout layout, int max_seq_len,
                 const std::vector<std::vector<int32_t>>& packs = {});

}  // namespace packbert
