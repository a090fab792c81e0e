// MLPerf/NVIDIA BERT HDF5 shards: the fixed-length and the variable-length format.
//
// fixed:     input_ids [N,L] int16, input_mask [N,L] int8, segment_ids [N,L] int8,
//            masked_lm_positions [N,P] int16, masked_lm_ids [N,P] int16,
//            next_sentence_labels [N] int8. Unused masked slots are 0; padding is 0.
// varlength: input_ids vlen int16, segment_ids vlen int8, masked_lm_positions vlen int16,
//            masked_lm_ids vlen int16 (each [N]), next_sentence_labels [N] int8; no input_mask.
// Readers accept any integer type up to int64 in place of the narrow ones. Shards `packbert
// prepare` writes also record their tokenizer and masks (ShardMeta) as attributes of the root
// group, and hold ids in int32 where the vocabulary passes int16.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/shards/sample.h"

namespace packbert {

enum class ShardFormat { fixed, var_length };
const char* to_string(ShardFormat f);
ShardFormat parse_shard_format(const std::string& s);  // "fixed" | "varlength"; throws on other

// What a shard records of how it was made: attributes of the file's root group, written by
// `packbert prepare`. MLPerf's and NVIDIA's shards have none (recorded = false), and nothing is
// checked against them.
struct ShardMeta {
  bool recorded = false;
  std::string tokenizer;         // the tokenizer file's name (vocab.txt or tokenizer.json)
  std::string tokenizer_sha256;  // of the file's bytes, lower-case hex (what sha256sum prints)
  int64_t vocab_size = 0;        // ids are below it
  int32_t cls_id = -1, sep_id = -1, mask_id = -1, pad_id = -1;
  std::string masks;    // "static": masked_lm_* hold the masks; "none": no masks (dynamic only)
  std::string samples;  // "pairs" (NSP sentence pairs) or "documents" (chunks, no NSP)

  bool operator==(const ShardMeta& o) const {
    return recorded == o.recorded && tokenizer == o.tokenizer &&
           tokenizer_sha256 == o.tokenizer_sha256 && vocab_size == o.vocab_size &&
           cls_id == o.cls_id && sep_id == o.sep_id && mask_id == o.mask_id && pad_id == o.pad_id &&
           masks == o.masks && samples == o.samples;
  }
};

struct ShardWriteOptions {
  ShardFormat format = ShardFormat::fixed;
  int max_seq_len = 128;     // L of the fixed format (samples longer than L are an error;
                             //   varlength: the same limit, 0 for none)
  int max_predictions = 20;  // P of the fixed format (more masked positions are an error;
                             //   varlength: the same limit, 0 for none)
  int chunk_samples = 4096;  // HDF5 chunk size along N
  // Written as the root group's attributes when recorded; ids (input_ids, masked_lm_ids) are
  // int32 datasets when meta.vocab_size > 32768, else int16.
  ShardMeta meta;
};

// Streams samples into a new shard file (created or truncated). Buffers chunk_samples rows,
// writes them to extendible chunked datasets, so memory does not grow with the shard.
// close() (or the destructor) flushes; after close() the file is complete. append() throws
// packbert::Error (naming the sample index) for a sample the format cannot hold: too long, too
// many masked positions, ids beyond int16, a masked position < 1; the sample is not appended.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, const ShardWriteOptions& opts);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void append(const Sample& s);
  void close();
  int64_t size() const;  // samples appended so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Convenience: writes all samples at once.
void write_shard(const std::string& path, const std::vector<Sample>& samples,
                 const ShardWriteOptions& opts);

struct ShardInfo {
  std::string path;
  ShardFormat format = ShardFormat::fixed;
  int64_t num_samples = 0;
  int max_seq_len = 0;      // fixed: L; varlength: 0 (unknown without a scan)
  int max_predictions = 0;  // fixed: P; varlength: 0
  ShardMeta meta;           // recorded = false for shards without packbert's attributes
};

// Reads a shard in chunks of chunk_samples rows; every sample is validated against the rules
// and the file's structure. Any violation throws packbert::Error naming the file, the dataset
// and the sample index. Opening validates structure (datasets present, same N, ranks, dtypes)
// and a recorded ShardMeta against the rules (check_shard_meta); a recorded shard's samples are
// checked with its own [CLS]/[SEP] ids.
class ShardReader {
 public:
  ShardReader(const std::string& path, const SampleRules& rules, int chunk_samples = 4096);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const ShardInfo& info() const;
  // Next sample in row order; false at the end. out.id = row index. After a sample's
  // validation error the cursor is past that sample, so a caller that skips bad samples
  // (--skip-bad-samples) catches the error and calls next() again. An error reading the file
  // itself (HDF5, damaged structures) leaves the cursor in place.
  bool next(Sample& out);
  // Position the cursor at row (0 <= row <= num_samples).
  void seek(int64_t row);
  // Rows [begin, end) appended to out (validated like next()); the cursor ends at `end`.
  void read_range(int64_t begin, int64_t end, std::vector<Sample>& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "" when a shard's recorded meta agrees with what the rules expect (SampleRules' tokenizer,
// vocabulary, masks and NSP pairs), else what differs, naming both sides. Unrecorded: "".
std::string check_shard_meta(const ShardMeta& meta, const SampleRules& rules);

// A path that is a shard file gives itself; a directory gives its *.h5/*.hdf5/*.hdf files,
// sorted by name. Throws when the path is missing or the directory has no shard.
std::vector<std::string> list_shards(const std::string& path);

}  // namespace packbert
