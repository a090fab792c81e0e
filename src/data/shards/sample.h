// One pretraining sample as the shards hold it, and the rules every sample obeys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/error.h"

namespace packbert {

// A BERT pretraining sample: [CLS] A [SEP] B [SEP], unpadded (length = input_ids.size()).
struct Sample {
  int64_t id = -1;                           // row index in its shard (readers set it)
  std::vector<int32_t> input_ids;            // [len]
  std::vector<int8_t> segment_ids;           // [len], 0 for [CLS] A [SEP], 1 for B [SEP]
  std::vector<int32_t> masked_lm_positions;  // [P], strictly inside the sequence, ascending
  std::vector<int32_t> masked_lm_ids;        // [P], the original token at each position
  int8_t next_sentence_label = 0;            // 0: B follows A, 1: B is random (Google's convention)

  int length() const { return static_cast<int>(input_ids.size()); }
  int num_masked() const { return static_cast<int>(masked_lm_positions.size()); }
  bool operator==(const Sample& o) const {
    return input_ids == o.input_ids && segment_ids == o.segment_ids &&
           masked_lm_positions == o.masked_lm_positions && masked_lm_ids == o.masked_lm_ids &&
           next_sentence_label == o.next_sentence_label;
  }
};

// A sample that breaks a rule (as opposed to a file that cannot be read). Readers throw it after
// moving past the sample, so that --skip-bad-samples can count it and go on.
class BadSampleError : public Error {
 public:
  using Error::Error;
};

// What a valid sample must satisfy; checked by the shard reader on every sample it yields.
struct SampleRules {
  int64_t vocab_size = 30522;  // token ids and masked ids must be < vocab_size (and >= 0);
                               //   0: a shard's recorded size (ShardMeta), else 30522
  int max_seq_len = 0;         // 0: no limit beyond the file's own shape
  int32_t cls_id = 101;        // position 0 must not be masked; masked positions never hold
  int32_t sep_id = 102;        //   [CLS]/[SEP] (checked against input_ids at that position)
  // What a shard that records its making (ShardMeta) must agree with; unset: not checked.
  std::string tokenizer;         // the configured tokenizer file, named in errors
  std::string tokenizer_sha256;  // its SHA-256; "" = any tokenizer
  int64_t model_vocab_size = 0;  // the shard's vocabulary must be this size; 0 = any
  bool needs_masks = false;      // refuse shards written without masks (static masking, eval)
  bool needs_pairs = false;      // refuse document-chunk shards (a model with an NSP head)
};

// Returns "" when the sample obeys the rules, else what is wrong (dataset name first, e.g.
// "masked_lm_positions[3] = 140 is outside the sequence (length 128)").
std::string check_sample(const Sample& s, const SampleRules& rules);

}  // namespace packbert
