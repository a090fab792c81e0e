// `packbert prepare`: raw text -> pretraining shards, with the semantics of Google's
// create_pretraining_data.py (NSP pairs, short_seq_prob, truncation, 80/10/10 MLM masking).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/prepare/jsonl_input.h"
#include "data/shards/shard.h"

namespace packbert {

// What a sample is: Google's NSP sentence pairs, or a chunk of one document (no B, no NSP).
enum class PrepareSamples { pairs, documents };
// The training shards' masks: drawn here (static), or none (the trainer's dynamic masking
// masks). The eval shard is masked either way: evaluation reads fixed masks.
enum class PrepareMasks { static_masks, none };

struct PrepareOptions {
  // Text files, optionally .gz: one sentence per line, documents separated by blank lines; or
  // JSONL (input_format); a directory or a glob names several (data/prepare/jsonl_input.h).
  std::vector<std::string> inputs;
  InputFormat input_format = InputFormat::auto_detect;  // auto: JSONL for *.jsonl[.gz]
  std::string text_field = "text";                      // JSONL: the document's field
  bool skip_bad_lines = false;  // JSONL: count and skip malformed lines instead of failing
  // pairs: [CLS] A [SEP] B [SEP] with a 50% random next B (Google's); documents: each
  // document's tokens in consecutive chunks of max_seq_len - 2, [CLS] chunk [SEP], the last
  // chunk the shorter tail (packing combines short samples; no chunk crosses documents).
  PrepareSamples samples = PrepareSamples::pairs;
  PrepareMasks masks = PrepareMasks::static_masks;
  std::string vocab;  // the tokenizer: a WordPiece vocab.txt or a tokenizer.json
  std::string output_dir;
  int max_seq_len = 128;
  int max_predictions_per_seq = 20;
  double masked_lm_prob = 0.15;
  int dupe_factor = 10;
  double short_seq_prob = 0.1;
  uint64_t seed = 12345;
  int num_shards = 1;
  int64_t eval_samples = 0;  // samples written to the eval shard
  ShardFormat format = ShardFormat::fixed;
  bool whole_word_masking = false;
  int threads = 0;  // 0: hardware concurrency; output does not depend on it
};

struct PrepareStats {
  int64_t input_bytes = 0;
  int64_t bad_lines = 0;  // JSONL lines skipped (skip_bad_lines)
  int64_t documents = 0;
  int64_t train_samples = 0;
  int64_t eval_samples = 0;
  int64_t masked_tokens = 0;
  double seconds = 0;
  std::vector<std::string> train_shards;
  std::string eval_shard;
};

// Writes output_dir/train/part-NNNNN-of-MMMMM.h5 (num_shards shards, samples dealt round-robin)
// and, when eval_samples > 0, output_dir/eval/eval.h5 (exactly eval_samples samples from
// held-out documents that no training sample uses). Refuses (packbert::Error) when train/ or
// eval/ already holds files; writes to *.incomplete directories renamed at the end, so a failed
// run leaves no shards behind. The output depends on the inputs (and their order), the seed and
// the options, never on `threads`. Unlike Google's script, the random next sentence comes from
// the same input file and samples are shuffled within their input file (memory stays near one
// tokenized file per thread); see prepare.cpp for the other, minor deviations.
// input_bytes counts uncompressed text.
PrepareStats run_prepare(const PrepareOptions& opts);

}  // namespace packbert
