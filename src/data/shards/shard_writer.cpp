// ShardWriter: streams samples into the MLPerf/NVIDIA HDF5 layouts (fixed or varlength).
//
// Rows are buffered chunk_samples at a time in the file's own types (int16 or int32 ids, int16
// positions, int8 masks, segments and labels), then appended to extendible chunked datasets with
// one H5Dwrite per dataset, so memory does not grow with the shard and no type conversion runs
// on write. The file holds the six (fixed) or five (varlength) datasets real shards hold, no
// extra groups, and the root group's ShardMeta attributes when opts.meta is recorded.
#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include "data/shards/shard.h"
#include "data/shards/shard_common.h"

namespace packbert {

namespace {

using h5::Handle;

// Which row buffer of the writer feeds a dataset.
enum class Buffer { input_ids, input_mask, segment_ids, masked_positions, masked_ids, labels };

// One output dataset: its HDF5 dataset and what a row of it is.
struct OutColumn {
  const char* name = nullptr;
  Buffer buffer = Buffer::labels;
  Handle dataset;
  hid_t file_type = H5I_INVALID_HID;  // predefined little-endian type (never closed)
  hid_t mem_type = H5I_INVALID_HID;   // predefined native type of the row buffer
  hsize_t width = 0;                  // fixed: values per row; 0 for 1-D and vlen datasets
  bool vlen = false;
};

}  // namespace

struct ShardWriter::Impl {
  std::string path;
  ShardWriteOptions opts;
  Handle file;
  // fixed: input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids, labels;
  // varlength: input_ids, segment_ids, masked_lm_positions, masked_lm_ids, labels.
  std::vector<OutColumn> columns;
  Handle vlen_int16_mem, vlen_int32_mem, vlen_int8_mem;  // memory types of vlen rows
  bool wide = false;  // int32 ids (input_ids, masked_lm_ids): meta.vocab_size > 32768

  // Row buffers. fixed: [rows, width] zero padded; varlength: values back to back with
  // per-row offsets (row r = values[offsets[r], offsets[r + 1])).
  std::vector<int16_t> input_ids, masked_positions, masked_ids;
  std::vector<int32_t> wide_input_ids, wide_masked_ids;  // in their place when wide
  std::vector<int8_t> input_mask, segment_ids, labels;
  std::vector<int64_t> token_offsets{0}, masked_offsets{0};

  int64_t buffered = 0;  // rows in the buffers
  int64_t written = 0;   // rows already in the file
  bool closed = false;

  std::string where(const char* dataset) const {
    return fmt::format("shard {}: dataset '{}'", path, dataset);
  }

  void create();
  void add_column(const char* name, Buffer buffer, hid_t file_type, hid_t mem_type, hsize_t width,
                  bool vlen);
  void check_sample(const Sample& s, int64_t index) const;
  void append(const Sample& s);
  void flush();
  void write_column(OutColumn& c, const void* fixed_rows);
  void write_vlen_column(OutColumn& c, const void* values, size_t value_bytes,
                         const std::vector<int64_t>& offsets);
  void close();
};

void ShardWriter::Impl::add_column(const char* name, Buffer buffer, hid_t file_type, hid_t mem_type,
                                   hsize_t width, bool vlen) {
  OutColumn c;
  c.name = name;
  c.buffer = buffer;
  c.file_type = file_type;
  c.mem_type = mem_type;
  c.width = width;
  c.vlen = vlen;
  const int rank = width > 0 ? 2 : 1;
  const std::array<hsize_t, 2> dims{0, width};
  const std::array<hsize_t, 2> max_dims{H5S_UNLIMITED, width};
  const std::array<hsize_t, 2> chunk{static_cast<hsize_t>(opts.chunk_samples), width};
  Handle space(PB_H5(H5Screate_simple(rank, dims.data(), max_dims.data()), "{}", where(name)));
  Handle dcpl(PB_H5(H5Pcreate(H5P_DATASET_CREATE), "{}", where(name)));
  PB_H5(H5Pset_chunk(dcpl.get(), rank, chunk.data()), "{}", where(name));
  Handle vlen_file_type;
  hid_t type = file_type;
  if (vlen) {
    vlen_file_type = Handle(PB_H5(H5Tvlen_create(file_type), "{}", where(name)));
    type = vlen_file_type.get();
  }
  c.dataset = Handle(
      PB_H5(H5Dcreate2(file.get(), name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
            "{}", where(name)));
  columns.push_back(std::move(c));
}

void ShardWriter::Impl::create() {
  h5::init_thread();
  const bool fixed = opts.format == ShardFormat::fixed;
  PB_REQUIRE(opts.chunk_samples > 0, "shard {}: chunk_samples must be positive, got {}", path,
             opts.chunk_samples);
  if (fixed) {
    PB_REQUIRE(opts.max_seq_len >= 2 && opts.max_predictions >= 1,
               "shard {}: the fixed format needs max_seq_len >= 2 and max_predictions >= 1 "
               "(got {} and {})",
               path, opts.max_seq_len, opts.max_predictions);
  } else {
    PB_REQUIRE(opts.max_seq_len >= 0 && opts.max_predictions >= 0,
               "shard {}: max_seq_len and max_predictions must not be negative", path);
  }
  file = Handle(PB_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                      "shard {}: cannot create the file", path));
  h5::write_shard_meta(file.get(), opts.meta, path);
  wide = opts.meta.recorded && opts.meta.vocab_size > 32768;
  const hid_t id_file = wide ? H5T_STD_I32LE : H5T_STD_I16LE;
  const hid_t id_mem = wide ? H5T_NATIVE_INT32 : H5T_NATIVE_INT16;
  const auto L = static_cast<hsize_t>(opts.max_seq_len);
  const auto P = static_cast<hsize_t>(opts.max_predictions);
  if (fixed) {
    add_column(h5::kInputIds, Buffer::input_ids, id_file, id_mem, L, false);
    add_column(h5::kInputMask, Buffer::input_mask, H5T_STD_I8LE, H5T_NATIVE_INT8, L, false);
    add_column(h5::kSegmentIds, Buffer::segment_ids, H5T_STD_I8LE, H5T_NATIVE_INT8, L, false);
    add_column(h5::kMaskedPositions, Buffer::masked_positions, H5T_STD_I16LE, H5T_NATIVE_INT16, P,
               false);
    add_column(h5::kMaskedIds, Buffer::masked_ids, id_file, id_mem, P, false);
    const size_t rows = static_cast<size_t>(opts.chunk_samples);
    (wide ? wide_input_ids.assign(rows * L, 0) : input_ids.assign(rows * L, 0));
    input_mask.assign(rows * L, 0);
    segment_ids.assign(rows * L, 0);
    masked_positions.assign(rows * P, 0);
    (wide ? wide_masked_ids.assign(rows * P, 0) : masked_ids.assign(rows * P, 0));
  } else {
    vlen_int16_mem = Handle(PB_H5(H5Tvlen_create(H5T_NATIVE_INT16), "shard {}", path));
    vlen_int32_mem = Handle(PB_H5(H5Tvlen_create(H5T_NATIVE_INT32), "shard {}", path));
    vlen_int8_mem = Handle(PB_H5(H5Tvlen_create(H5T_NATIVE_INT8), "shard {}", path));
    const hid_t v16 = vlen_int16_mem.get(), v8 = vlen_int8_mem.get();
    const hid_t vid = wide ? vlen_int32_mem.get() : v16;
    add_column(h5::kInputIds, Buffer::input_ids, id_file, vid, 0, true);
    add_column(h5::kSegmentIds, Buffer::segment_ids, H5T_STD_I8LE, v8, 0, true);
    add_column(h5::kMaskedPositions, Buffer::masked_positions, H5T_STD_I16LE, v16, 0, true);
    add_column(h5::kMaskedIds, Buffer::masked_ids, id_file, vid, 0, true);
  }
  add_column(h5::kNextSentenceLabels, Buffer::labels, H5T_STD_I8LE, H5T_NATIVE_INT8, 0, false);
  labels.reserve(static_cast<size_t>(opts.chunk_samples));
}

// Only what the file format itself needs: a sample must fit the shapes and the int16/int32/int8
// types, or what is read back would differ from what was written. Vocabulary rules are the
// reader's job (the writer does not know the vocabulary).
void ShardWriter::Impl::check_sample(const Sample& s, int64_t index) const {
  auto fail = [&](const char* dataset, const std::string& what) {
    PB_THROW("shard {}: dataset '{}', sample {}: {}", path, dataset, index, what);
  };
  const int len = s.length();
  if (len < 1) fail(h5::kInputIds, "the sample is empty");
  if (opts.max_seq_len > 0 && len > opts.max_seq_len)
    fail(h5::kInputIds, fmt::format("length {} exceeds max_seq_len {}", len, opts.max_seq_len));
  if (s.segment_ids.size() != s.input_ids.size())
    fail(h5::kSegmentIds,
         fmt::format("length {} differs from input_ids length {}", s.segment_ids.size(), len));
  const int np = s.num_masked();
  if (opts.max_predictions > 0 && np > opts.max_predictions)
    fail(h5::kMaskedPositions,
         fmt::format("{} masked positions exceed max_predictions {}", np, opts.max_predictions));
  if (s.masked_lm_ids.size() != s.masked_lm_positions.size())
    fail(h5::kMaskedIds,
         fmt::format("{} entries but masked_lm_positions has {}", s.masked_lm_ids.size(), np));
  constexpr int32_t kMax16 = std::numeric_limits<int16_t>::max();
  const int32_t max_id = wide ? std::numeric_limits<int32_t>::max() : kMax16;
  const char* id_type = wide ? "int32" : "int16";
  for (int i = 0; i < len; ++i) {
    if (s.input_ids[i] < 0 || s.input_ids[i] > max_id)
      fail(h5::kInputIds, fmt::format("input_ids[{}] = {} does not fit the {} dataset", i,
                                      s.input_ids[i], id_type));
  }
  for (int j = 0; j < np; ++j) {
    // Position 0 would read back as an unused slot in the fixed format, so it is refused in
    // both formats ([CLS] is never masked anyway).
    if (s.masked_lm_positions[j] < 1 || s.masked_lm_positions[j] > kMax16)
      fail(h5::kMaskedPositions,
           fmt::format("masked_lm_positions[{}] = {} cannot be stored (must be 1 .. {})", j,
                       s.masked_lm_positions[j], kMax16));
    if (s.masked_lm_ids[j] < 0 || s.masked_lm_ids[j] > max_id)
      fail(h5::kMaskedIds, fmt::format("masked_lm_ids[{}] = {} does not fit the {} dataset", j,
                                       s.masked_lm_ids[j], id_type));
  }
}

void ShardWriter::Impl::append(const Sample& s) {
  PB_REQUIRE(!closed, "shard {}: append after close()", path);
  const int64_t index = written + buffered;
  check_sample(s, index);
  const int len = s.length();
  const int np = s.num_masked();
  if (opts.format == ShardFormat::fixed) {
    // Buffers are zeroed after each flush, so padding and unused slots are already 0.
    const size_t L = static_cast<size_t>(opts.max_seq_len);
    const size_t P = static_cast<size_t>(opts.max_predictions);
    int8_t* mask = &input_mask[buffered * L];
    int8_t* seg = &segment_ids[buffered * L];
    for (int i = 0; i < len; ++i) {
      if (wide)
        wide_input_ids[buffered * L + i] = s.input_ids[i];
      else
        input_ids[buffered * L + i] = static_cast<int16_t>(s.input_ids[i]);
      mask[i] = 1;
      seg[i] = s.segment_ids[i];
    }
    for (int j = 0; j < np; ++j) {
      masked_positions[buffered * P + j] = static_cast<int16_t>(s.masked_lm_positions[j]);
      if (wide)
        wide_masked_ids[buffered * P + j] = s.masked_lm_ids[j];
      else
        masked_ids[buffered * P + j] = static_cast<int16_t>(s.masked_lm_ids[j]);
    }
  } else {
    for (int i = 0; i < len; ++i) {
      if (wide)
        wide_input_ids.push_back(s.input_ids[i]);
      else
        input_ids.push_back(static_cast<int16_t>(s.input_ids[i]));
    }
    segment_ids.insert(segment_ids.end(), s.segment_ids.begin(), s.segment_ids.end());
    for (int j = 0; j < np; ++j) {
      masked_positions.push_back(static_cast<int16_t>(s.masked_lm_positions[j]));
      if (wide)
        wide_masked_ids.push_back(s.masked_lm_ids[j]);
      else
        masked_ids.push_back(static_cast<int16_t>(s.masked_lm_ids[j]));
    }
    token_offsets.push_back(token_offsets.back() + len);
    masked_offsets.push_back(static_cast<int64_t>(masked_positions.size()));
  }
  labels.push_back(s.next_sentence_label);
  ++buffered;
  if (buffered == opts.chunk_samples) flush();
}

// Grows the dataset by the buffered rows and writes them as one hyperslab.
void ShardWriter::Impl::write_column(OutColumn& c, const void* rows) {
  const int rank = c.width > 0 ? 2 : 1;
  const std::array<hsize_t, 2> new_dims{static_cast<hsize_t>(written + buffered), c.width};
  const std::array<hsize_t, 2> start{static_cast<hsize_t>(written), 0};
  const std::array<hsize_t, 2> count{static_cast<hsize_t>(buffered), c.width};
  PB_H5(H5Dset_extent(c.dataset.get(), new_dims.data()), "{}", where(c.name));
  Handle file_space(PB_H5(H5Dget_space(c.dataset.get()), "{}", where(c.name)));
  PB_H5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                            nullptr),
        "{}", where(c.name));
  Handle mem_space(PB_H5(H5Screate_simple(rank, count.data(), nullptr), "{}", where(c.name)));
  PB_H5(H5Dwrite(c.dataset.get(), c.mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, rows),
        "{}", where(c.name));
}

void ShardWriter::Impl::write_vlen_column(OutColumn& c, const void* values, size_t value_bytes,
                                          const std::vector<int64_t>& offsets) {
  std::vector<hvl_t> rows(static_cast<size_t>(buffered));
  const auto* base = static_cast<const char*>(values);
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].len = static_cast<size_t>(offsets[r + 1] - offsets[r]);
    // HDF5 only reads through p on write; the cast drops const for the C struct.
    rows[r].p = const_cast<char*>(base + offsets[r] * value_bytes);
  }
  write_column(c, rows.data());
}

void ShardWriter::Impl::flush() {
  if (buffered == 0) return;
  const bool fixed = opts.format == ShardFormat::fixed;
  for (OutColumn& c : columns) {
    switch (c.buffer) {
      case Buffer::input_ids:
        if (fixed)
          write_column(c,
                       wide ? static_cast<const void*>(wide_input_ids.data()) : input_ids.data());
        else if (wide)
          write_vlen_column(c, wide_input_ids.data(), sizeof(int32_t), token_offsets);
        else
          write_vlen_column(c, input_ids.data(), sizeof(int16_t), token_offsets);
        break;
      case Buffer::input_mask:  // fixed only
        write_column(c, input_mask.data());
        break;
      case Buffer::segment_ids:
        if (fixed)
          write_column(c, segment_ids.data());
        else
          write_vlen_column(c, segment_ids.data(), sizeof(int8_t), token_offsets);
        break;
      case Buffer::masked_positions:
        if (fixed)
          write_column(c, masked_positions.data());
        else
          write_vlen_column(c, masked_positions.data(), sizeof(int16_t), masked_offsets);
        break;
      case Buffer::masked_ids:
        if (fixed)
          write_column(c,
                       wide ? static_cast<const void*>(wide_masked_ids.data()) : masked_ids.data());
        else if (wide)
          write_vlen_column(c, wide_masked_ids.data(), sizeof(int32_t), masked_offsets);
        else
          write_vlen_column(c, masked_ids.data(), sizeof(int16_t), masked_offsets);
        break;
      case Buffer::labels: write_column(c, labels.data()); break;
    }
  }
  written += buffered;
  buffered = 0;
  labels.clear();
  if (fixed) {
    std::fill(input_ids.begin(), input_ids.end(), int16_t{0});
    std::fill(wide_input_ids.begin(), wide_input_ids.end(), 0);
    std::fill(wide_masked_ids.begin(), wide_masked_ids.end(), 0);
    std::fill(input_mask.begin(), input_mask.end(), int8_t{0});
    std::fill(segment_ids.begin(), segment_ids.end(), int8_t{0});
    std::fill(masked_positions.begin(), masked_positions.end(), int16_t{0});
    std::fill(masked_ids.begin(), masked_ids.end(), int16_t{0});
  } else {
    input_ids.clear();
    wide_input_ids.clear();
    wide_masked_ids.clear();
    segment_ids.clear();
    masked_positions.clear();
    masked_ids.clear();
    token_offsets.assign(1, 0);
    masked_offsets.assign(1, 0);
  }
}

void ShardWriter::Impl::close() {
  if (closed) return;
  closed = true;  // even if the flush fails: a second close() must not write again
  flush();
  for (OutColumn& c : columns) PB_H5(c.dataset.reset(), "{}", where(c.name));
  vlen_int16_mem.reset();
  vlen_int32_mem.reset();
  vlen_int8_mem.reset();
  PB_H5(file.reset(), "shard {}: closing the file", path);
}

ShardWriter::ShardWriter(const std::string& path, const ShardWriteOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->opts = opts;
  impl_->create();
}

ShardWriter::~ShardWriter() {
  // A destructor must not throw; callers that need to know the file is complete call close().
  try {
    if (impl_) impl_->close();
  } catch (const std::exception&) {
  }
}

void ShardWriter::append(const Sample& s) { impl_->append(s); }

void ShardWriter::close() { impl_->close(); }

int64_t ShardWriter::size() const { return impl_->written + impl_->buffered; }

void write_shard(const std::string& path, const std::vector<Sample>& samples,
                 const ShardWriteOptions& opts) {
  ShardWriter w(path, opts);
  for (const Sample& s : samples) w.append(s);
  w.close();
}

}  // namespace packbert
