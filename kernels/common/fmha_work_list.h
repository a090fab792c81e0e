// The host-side work list of the CUDA attention kernels: which sequences each launch covers.
//
// Attention launches one block per (query tile, head) of every sequence. With one grid sized by
// the longest sequence, a batch of mostly short sequences (the Wikipedia length histogram peaks
// near 512 but has a long tail of short documents) spends most of its blocks on tiles past a
// short sequence's end, which exit at once but still occupy the scheduler. So the sequences are
// sorted by length and cut into length buckets (<= 128, <= 256, <= 384, <= 512, longer); each
// bucket is its own grid, sized by the longest sequence in it, on one of a few streams.
//
// Plain C++ without CUDA, so the unit tests (label unit, tests/unit/test_fmha_host.cpp) check it
// on every commit: every sequence in exactly one bucket, buckets ordered by bound, lengths
// descending inside a bucket, each bucket's max_len its longest member.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace packbert {

// Upper bounds (inclusive) of the length buckets; lengths above the last form one more bucket.
// Multiples of 64 and 16 (the query tiles of the tensor-core and fp32 kernels), so a bucket's
// grid never rounds past its bound.
constexpr int32_t kFmhaBucketBounds[] = {128, 256, 384, 512};
constexpr int kFmhaNumBounds = static_cast<int>(sizeof(kFmhaBucketBounds) / sizeof(int32_t));

// The bucket of a length: 0 .. kFmhaNumBounds (the last one: longer than every bound).
inline int fmha_bucket_of(int32_t len) {
  int b = 0;
  while (b < kFmhaNumBounds && len > kFmhaBucketBounds[b]) ++b;
  return b;
}

struct FmhaBucket {
  int32_t index = 0;    // which bucket (fmha_bucket_of)
  int32_t max_len = 0;  // the longest sequence in it: sizes the grid
  int64_t first = 0;    // its sequences are order[first, first + count)
  int64_t count = 0;
};

struct FmhaPlan {
  // Sequence indices, bucket by bucket (ascending bounds), longest first inside a bucket (ties
  // by index, so the plan is a pure function of the lengths): a grid's first blocks are its
  // longest sequences, which then do not start last.
  std::vector<int32_t> order;
  std::vector<FmhaBucket> buckets;  // non-empty buckets only, ascending bounds
  int64_t tokens = 0;               // sum of the lengths
  int64_t work = 0;                 // sum of len^2 (key-query pairs per head)
};

// The plan of num_seqs sequences with these lengths (host memory). A length below 1 (which a
// validated layout never has) goes to the first bucket: its blocks exit at once.
inline FmhaPlan plan_fmha(const int32_t* seq_len, int64_t num_seqs) {
  FmhaPlan plan;
  plan.order.resize(static_cast<size_t>(num_seqs));
  std::iota(plan.order.begin(), plan.order.end(), 0);
  std::sort(plan.order.begin(), plan.order.end(), [&](int32_t a, int32_t b) {
    const int ba = fmha_bucket_of(seq_len[a]), bb = fmha_bucket_of(seq_len[b]);
    if (ba != bb) return ba < bb;
    if (seq_len[a] != seq_len[b]) return seq_len[a] > seq_len[b];
    return a < b;
  });
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int32_t s = plan.order[static_cast<size_t>(i)];
    const int32_t len = seq_len[s];
    const int b = fmha_bucket_of(len);
    if (plan.buckets.empty() || plan.buckets.back().index != b) {
      FmhaBucket nb;
      nb.index = b;
      nb.first = i;
      plan.buckets.push_back(nb);
    }
    FmhaBucket& cur = plan.buckets.back();
    ++cur.count;
    cur.max_len = std::max(cur.max_len, len);
    if (len > 0) {
      plan.tokens += len;
      plan.work += int64_t{len} * len;
    }
  }
  return plan;
}

// The plan of a fixed launch (SeqLayout::fixed_launch): every sequence in one grid sized by the
// bound max_len, in layout order (an empty order: the kernels then take sequences 0 .. count-1),
// so it depends on num_seqs and max_len alone. tokens and work are left 0: the lengths are not
// known on the host.
inline FmhaPlan plan_fmha_fixed(int64_t num_seqs, int32_t max_len) {
  FmhaPlan plan;
  if (num_seqs == 0) return plan;
  FmhaBucket b;
  b.index = fmha_bucket_of(max_len);
  b.max_len = max_len;
  b.count = num_seqs;
  plan.buckets.push_back(b);
  return plan;
}

}  // namespace packbert
