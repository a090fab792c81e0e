// ShardReader: reads MLPerf/NVIDIA HDF5 shards (fixed or varlength) window by window and
// validates every sample it yields.
//
// A window is up to chunk_samples rows read with one hyperslab H5Dread per dataset, never the
// whole file. Values land in int32 buffers when the file's integer type fits int32, else in
// int64 buffers that are narrowed with a check: HDF5's conversion clips out-of-range values,
// so reading an int64 file straight into int32 would silently change them. Values that do not
// fit int32 are remembered with their true value and reported when their sample is decoded.
//
// libhdf5 1.10 crashes, hangs or overflows buffers on some damaged files instead of failing;
// the reader opens files through a bounds-checked driver (shard_vfd.h) and checks the other
// structures libhdf5 trusts before it reads them (shard_guard.h).
#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <limits>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include "data/shards/shard.h"
#include "data/shards/shard_common.h"
#include "data/shards/shard_guard.h"
#include "data/shards/shard_vfd.h"

namespace packbert {

namespace {

using h5::Handle;

// Widths beyond this are a damaged header, not a real shard (prepare allows L <= 65536);
// refusing them keeps a window's buffers bounded.
constexpr hsize_t kMaxWidth = hsize_t{1} << 20;
// A window holds at most this many values per dataset (64 MiB of int32).
constexpr int64_t kMaxWindowValues = int64_t{1} << 24;

bool fits_int32(hid_t int_type) {
  const size_t bytes = H5Tget_size(int_type);
  return H5Tget_sign(int_type) == H5T_SGN_2 ? bytes <= 4 : bytes <= 2;
}

// One dataset of the shard and the window of rows last read from it.
struct InColumn {
  const char* name = nullptr;
  Handle dataset;
  Handle file_space;  // the dataset's extent; its selection is reset for every window
  bool vlen = false;
  bool wide = false;  // integers may not fit int32: read as int64, then narrowed
  Handle vlen_mem_type;
  size_t vlen_base_bytes = 0;  // size of one element of a vlen row in the file
  int rank = 0;
  hsize_t rows = 0;
  hsize_t width = 0;  // second dimension of a 2-D dataset, else 1

  std::vector<int32_t> values;   // fixed: [window rows, width]; vlen: rows back to back
  std::vector<int64_t> offsets;  // vlen: row r is values[offsets[r], offsets[r + 1])
  std::vector<int64_t> wide_values;
  std::vector<hvl_t> vlen_rows;
  // (index into values, true value) of values outside int32, in index order.
  std::vector<std::pair<int64_t, int64_t>> overflows;
};

// Extracts the dataset name check_sample() puts first in its message ("input_ids[3] = ...").
std::string dataset_of(const std::string& what) {
  size_t n = 0;
  while (n < what.size() && (std::islower(static_cast<unsigned char>(what[n])) || what[n] == '_'))
    ++n;
  return what.substr(0, n);
}

}  // namespace

struct ShardReader::Impl {
  ShardInfo info;
  SampleRules rules;
  int64_t rows_per_window = 0;
  Handle file;                       // declared before the columns: they are closed first
  std::unique_ptr<h5::RawFile> raw;  // the same file, for checks libhdf5 does not make
  InColumn input_ids, input_mask, segment_ids, masked_positions, masked_ids, labels;
  std::unique_ptr<h5::VlenHeapCheck> heap_check;  // varlength shards only

  int64_t cursor = 0;
  int64_t window_begin = 0, window_end = 0;  // rows [begin, end) are in the buffers

  std::string where(const char* dataset) const {
    return fmt::format("shard {}: dataset '{}'", info.path, dataset);
  }
  [[noreturn]] void fail_sample(const std::string& dataset, int64_t row,
                                const std::string& what) const {
    throw BadSampleError(
        fmt::format("shard {}: dataset '{}', sample {}: {}", info.path, dataset, row, what));
  }

  void open(int chunk_samples);
  void open_column(InColumn& c, const char* name, bool vlen, int rank);
  void check_structure();
  void load_window(int64_t begin);
  void read_fixed(InColumn& c, int64_t begin, int64_t count);
  void read_vlen(InColumn& c, int64_t begin, int64_t count);
  void check_overflow(const InColumn& c, int64_t from, int64_t to, int64_t row) const;
  void decode(int64_t row, Sample& out);
  void decode_fixed(int64_t row, int64_t r, Sample& out);
  void decode_varlength(int64_t row, int64_t r, Sample& out);
};

void ShardReader::Impl::open(int chunk_samples) {
  namespace fs = std::filesystem;
  h5::init_thread();
  const std::string& path = info.path;
  PB_REQUIRE(chunk_samples > 0, "shard {}: chunk_samples must be positive, got {}", path,
             chunk_samples);
  // Plain checks first: they give clearer messages than HDF5's for the common mistakes.
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) PB_THROW("shard {}: the file does not exist", path);
  if (fs::is_directory(st))
    PB_THROW(
        "shard {}: is a directory, not a shard file (pass a .h5 file, or use "
        "list_shards for a directory)",
        path);
  const auto bytes = fs::file_size(path, ec);
  if (ec) PB_THROW("shard {}: cannot read the file size: {}", path, ec.message());
  if (bytes == 0) PB_THROW("shard {}: the file is empty (0 bytes)", path);
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 < 0) PB_THROW("shard {}: cannot read the file: {}", path, h5::error_stack_summary());
  if (is_hdf5 == 0)
    PB_THROW("shard {}: not an HDF5 file (no HDF5 signature in its {} bytes)", path, bytes);
  // Through the bounds-checked driver: without it, libhdf5 crashes on undefined addresses.
  const Handle fapl = h5::checked_read_fapl();
  file = Handle(PB_H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()),
                      "shard {}: cannot open the HDF5 file (truncated or damaged?)", path));
  raw = std::make_unique<h5::RawFile>(path, file.get());

  // The format follows from input_ids: integer [N, L] is fixed, vlen [N] is varlength.
  const htri_t has_ids =
      PB_H5(H5Lexists(file.get(), h5::kInputIds, H5P_DEFAULT), "{}", where(h5::kInputIds));
  if (has_ids <= 0)
    PB_THROW("shard {}: dataset 'input_ids' is missing (not a BERT pretraining shard?)", path);
  {
    h5::check_chunk_layout(*raw, path, file.get(), h5::kInputIds);
    Handle ds(PB_H5(H5Dopen2(file.get(), h5::kInputIds, H5P_DEFAULT), "{}", where(h5::kInputIds)));
    Handle type(PB_H5(H5Dget_type(ds.get()), "{}", where(h5::kInputIds)));
    const H5T_class_t cls = H5Tget_class(type.get());
    if (cls == H5T_VLEN) {
      info.format = ShardFormat::var_length;
    } else if (cls == H5T_INTEGER) {
      info.format = ShardFormat::fixed;
    } else {
      PB_THROW(
          "shard {}: dataset 'input_ids' has the wrong dtype {} (expected an integer type "
          "[N, L] or vlen integers [N])",
          path, h5::describe_type(type.get()));
    }
  }
  const bool fixed = info.format == ShardFormat::fixed;
  open_column(input_ids, h5::kInputIds, !fixed, fixed ? 2 : 1);
  if (fixed) open_column(input_mask, h5::kInputMask, false, 2);
  open_column(segment_ids, h5::kSegmentIds, !fixed, fixed ? 2 : 1);
  open_column(masked_positions, h5::kMaskedPositions, !fixed, fixed ? 2 : 1);
  open_column(masked_ids, h5::kMaskedIds, !fixed, fixed ? 2 : 1);
  open_column(labels, h5::kNextSentenceLabels, false, 1);
  check_structure();
  info.meta = h5::read_shard_meta(file.get(), path);
  const std::string disagrees = check_shard_meta(info.meta, rules);
  if (!disagrees.empty()) PB_THROW("shard {}: {}", path, disagrees);
  if (info.meta.recorded) {  // its own special ids and vocabulary
    rules.cls_id = info.meta.cls_id;
    rules.sep_id = info.meta.sep_id;
    rules.vocab_size = rules.vocab_size > 0 ? std::min(rules.vocab_size, info.meta.vocab_size)
                                            : info.meta.vocab_size;
  } else if (rules.vocab_size == 0) {
    rules.vocab_size = SampleRules().vocab_size;
  }
  if (!fixed) heap_check = std::make_unique<h5::VlenHeapCheck>(path, *raw);

  const int64_t widest = fixed ? std::max<int64_t>(1, static_cast<int64_t>(input_ids.width)) : 1;
  rows_per_window =
      std::max<int64_t>(1, std::min<int64_t>(chunk_samples, kMaxWindowValues / widest));
}

void ShardReader::Impl::open_column(InColumn& c, const char* name, bool vlen, int rank) {
  const std::string& path = info.path;
  c.name = name;
  c.vlen = vlen;
  const htri_t exists = PB_H5(H5Lexists(file.get(), name, H5P_DEFAULT), "{}", where(name));
  if (exists <= 0)
    PB_THROW("shard {}: dataset '{}' is missing (a {} shard has {})", path, name,
             to_string(info.format),
             info.format == ShardFormat::fixed
                 ? "input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids, "
                   "next_sentence_labels"
                 : "input_ids, segment_ids, masked_lm_positions, masked_lm_ids, "
                   "next_sentence_labels");
  h5::check_chunk_layout(*raw, path, file.get(), name);
  c.dataset = Handle(PB_H5(H5Dopen2(file.get(), name, H5P_DEFAULT), "{}", where(name)));
  c.file_space = Handle(PB_H5(H5Dget_space(c.dataset.get()), "{}", where(name)));
  Handle type(PB_H5(H5Dget_type(c.dataset.get()), "{}", where(name)));

  const char* expected = vlen ? "vlen integers" : "an integer type";
  const H5T_class_t cls = H5Tget_class(type.get());
  Handle base;
  hid_t int_type = type.get();
  if (vlen) {
    if (cls == H5T_VLEN) {
      base = Handle(PB_H5(H5Tget_super(type.get()), "{}", where(name)));
      int_type = base.get();
    } else {
      int_type = H5I_INVALID_HID;
    }
  }
  if (int_type < 0 || H5Tget_class(int_type) != H5T_INTEGER)
    PB_THROW("shard {}: dataset '{}' has the wrong dtype {} (expected {} in a {} shard)", path,
             name, h5::describe_type(type.get()), expected, to_string(info.format));
  c.wide = !fits_int32(int_type);
  c.vlen_base_bytes = H5Tget_size(int_type);
  if (vlen)
    c.vlen_mem_type = Handle(
        PB_H5(H5Tvlen_create(c.wide ? H5T_NATIVE_INT64 : H5T_NATIVE_INT32), "{}", where(name)));

  c.rank = PB_H5(H5Sget_simple_extent_ndims(c.file_space.get()), "{}", where(name));
  if (c.rank != rank)
    PB_THROW("shard {}: dataset '{}' has the wrong rank {} (expected {} in a {} shard)", path, name,
             c.rank, rank == 2 ? "2: [samples, width]" : "1: [samples]", to_string(info.format));
  std::array<hsize_t, 2> dims{0, 1};
  PB_H5(H5Sget_simple_extent_dims(c.file_space.get(), dims.data(), nullptr), "{}", where(name));
  c.rows = dims[0];
  c.width = rank == 2 ? dims[1] : 1;
  if (c.width > kMaxWidth)
    PB_THROW("shard {}: dataset '{}' has an implausible width {} (damaged file?)", path, name,
             c.width);
  const uint64_t element_bytes = vlen ? 8 + raw->address_size() : H5Tget_size(type.get());
  h5::check_storage(path, c.dataset.get(), c.file_space.get(), name, element_bytes);
}

void ShardReader::Impl::check_structure() {
  const std::string& path = info.path;
  const bool fixed = info.format == ShardFormat::fixed;
  const hsize_t n = input_ids.rows;
  for (const InColumn* c : {&input_mask, &segment_ids, &masked_positions, &masked_ids, &labels}) {
    if (!c->dataset.valid()) continue;  // input_mask of a varlength shard
    if (c->rows != n)
      PB_THROW("shard {}: dataset '{}' has {} samples but 'input_ids' has {}", path, c->name,
               c->rows, n);
  }
  info.num_samples = static_cast<int64_t>(n);
  if (!fixed) return;
  for (const InColumn* c : {&input_mask, &segment_ids}) {
    if (c->width != input_ids.width)
      PB_THROW("shard {}: dataset '{}' has sequence length {} but 'input_ids' has {}", path,
               c->name, c->width, input_ids.width);
  }
  if (masked_ids.width != masked_positions.width)
    PB_THROW(
        "shard {}: dataset 'masked_lm_ids' has {} prediction slots but "
        "'masked_lm_positions' has {}",
        path, masked_ids.width, masked_positions.width);
  info.max_seq_len = static_cast<int>(input_ids.width);
  info.max_predictions = static_cast<int>(masked_positions.width);
}

void ShardReader::Impl::read_fixed(InColumn& c, int64_t begin, int64_t count) {
  const std::array<hsize_t, 2> start{static_cast<hsize_t>(begin), 0};
  const std::array<hsize_t, 2> shape{static_cast<hsize_t>(count), c.width};
  const size_t n = static_cast<size_t>(count) * c.width;
  c.overflows.clear();
  c.values.resize(n);
  if (n == 0) return;  // a [N, 0] dataset (no prediction slots) has nothing to read
  PB_H5(H5Sselect_hyperslab(c.file_space.get(), H5S_SELECT_SET, start.data(), nullptr, shape.data(),
                            nullptr),
        "{}", where(c.name));
  Handle mem_space(PB_H5(H5Screate_simple(c.rank, shape.data(), nullptr), "{}", where(c.name)));
  if (!c.wide) {
    PB_H5(H5Dread(c.dataset.get(), H5T_NATIVE_INT32, mem_space.get(), c.file_space.get(),
                  H5P_DEFAULT, c.values.data()),
          "{}, samples {} .. {}", where(c.name), begin, begin + count - 1);
    return;
  }
  c.wide_values.resize(n);
  PB_H5(H5Dread(c.dataset.get(), H5T_NATIVE_INT64, mem_space.get(), c.file_space.get(), H5P_DEFAULT,
                c.wide_values.data()),
        "{}, samples {} .. {}", where(c.name), begin, begin + count - 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = c.wide_values[i];
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
      c.overflows.emplace_back(static_cast<int64_t>(i), v);
      c.values[i] = std::numeric_limits<int32_t>::min();
    } else {
      c.values[i] = static_cast<int32_t>(v);
    }
  }
}

void ShardReader::Impl::read_vlen(InColumn& c, int64_t begin, int64_t count) {
  const hsize_t start = static_cast<hsize_t>(begin);
  const hsize_t shape = static_cast<hsize_t>(count);
  c.overflows.clear();
  // Zeroed so that a failed read leaves nothing for the reclaim below to free but what HDF5
  // actually allocated.
  c.vlen_rows.assign(static_cast<size_t>(count), hvl_t{0, nullptr});
  PB_H5(H5Sselect_hyperslab(c.file_space.get(), H5S_SELECT_SET, &start, nullptr, &shape, nullptr),
        "{}", where(c.name));
  Handle mem_space(PB_H5(H5Screate_simple(1, &shape, nullptr), "{}", where(c.name)));
  // HDF5 mallocs every row; give it all back on every path out of here.
  struct Reclaim {
    InColumn& c;
    hid_t space;
    ~Reclaim() { H5Dvlen_reclaim(c.vlen_mem_type.get(), space, H5P_DEFAULT, c.vlen_rows.data()); }
  } reclaim{c, mem_space.get()};
  // libhdf5 1.10 crashes or hangs on damaged references instead of failing: check them first.
  heap_check->check_rows(c.dataset.get(), c.file_space.get(), mem_space.get(), c.name,
                         c.vlen_base_bytes, begin, count);
  PB_H5(H5Dread(c.dataset.get(), c.vlen_mem_type.get(), mem_space.get(), c.file_space.get(),
                H5P_DEFAULT, c.vlen_rows.data()),
        "{}, samples {} .. {}", where(c.name), begin, begin + count - 1);

  c.offsets.resize(static_cast<size_t>(count) + 1);
  c.offsets[0] = 0;
  for (int64_t r = 0; r < count; ++r)
    c.offsets[r + 1] = c.offsets[r] + static_cast<int64_t>(c.vlen_rows[r].len);
  c.values.resize(static_cast<size_t>(c.offsets[count]));
  for (int64_t r = 0; r < count; ++r) {
    const hvl_t& row = c.vlen_rows[r];
    int32_t* dst = c.values.data() + c.offsets[r];
    if (!c.wide) {
      if (row.len > 0) std::copy_n(static_cast<const int32_t*>(row.p), row.len, dst);
      continue;
    }
    const auto* src = static_cast<const int64_t*>(row.p);
    for (size_t i = 0; i < row.len; ++i) {
      const int64_t v = src[i];
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        c.overflows.emplace_back(c.offsets[r] + static_cast<int64_t>(i), v);
        dst[i] = std::numeric_limits<int32_t>::min();
      } else {
        dst[i] = static_cast<int32_t>(v);
      }
    }
  }
}

void ShardReader::Impl::load_window(int64_t begin) {
  const int64_t end = std::min(begin + rows_per_window, info.num_samples);
  window_begin = window_end = 0;  // nothing valid if a read below throws
  const bool fixed = info.format == ShardFormat::fixed;
  for (InColumn* c : {&input_ids, &input_mask, &segment_ids, &masked_positions, &masked_ids}) {
    if (!c->dataset.valid()) continue;
    if (fixed)
      read_fixed(*c, begin, end - begin);
    else
      read_vlen(*c, begin, end - begin);
  }
  read_fixed(labels, begin, end - begin);
  window_begin = begin;
  window_end = end;
}

// Reports the first value of values[from, to) that did not fit int32, with its true value.
void ShardReader::Impl::check_overflow(const InColumn& c, int64_t from, int64_t to,
                                       int64_t row) const {
  auto it = std::lower_bound(c.overflows.begin(), c.overflows.end(),
                             std::make_pair(from, std::numeric_limits<int64_t>::min()));
  if (it == c.overflows.end() || it->first >= to) return;
  if (c.rank == 1 && !c.vlen)
    fail_sample(c.name, row, fmt::format("{} = {} is out of range", c.name, it->second));
  fail_sample(c.name, row,
              fmt::format("{}[{}] = {} is out of range", c.name, it->first - from, it->second));
}

void ShardReader::Impl::decode_fixed(int64_t row, int64_t r, Sample& out) {
  const int64_t L = static_cast<int64_t>(input_ids.width);
  const int64_t P = static_cast<int64_t>(masked_positions.width);
  for (const InColumn* c : {&input_ids, &input_mask, &segment_ids})
    if (!c->overflows.empty()) check_overflow(*c, r * L, (r + 1) * L, row);
  for (const InColumn* c : {&masked_positions, &masked_ids})
    if (!c->overflows.empty()) check_overflow(*c, r * P, (r + 1) * P, row);

  const int32_t* ids = input_ids.values.data() + r * L;
  const int32_t* mask = input_mask.values.data() + r * L;
  const int32_t* seg = segment_ids.values.data() + r * L;
  // The length is the run of 1s the mask starts with; the rest of the mask must be 0 (checked
  // first: a broken mask explains the padding checks that would fail next), and so must the
  // padding of input_ids and segment_ids.
  int64_t len = 0;
  while (len < L && mask[len] == 1) ++len;
  for (int64_t i = len; i < L; ++i) {
    if (mask[i] == 0) continue;
    if (mask[i] == 1)
      fail_sample(h5::kInputMask, row,
                  fmt::format("input_mask[{}] = 1 after padding began at {} (the mask must be "
                              "1...1 0...0)",
                              i, len));
    fail_sample(h5::kInputMask, row, fmt::format("input_mask[{}] = {} is not 0 or 1", i, mask[i]));
  }
  for (int64_t i = len; i < L; ++i) {
    if (ids[i] != 0)
      fail_sample(h5::kInputIds, row,
                  fmt::format("input_ids[{}] = {} is in the padding (input_mask is 0 from {}) "
                              "but not 0",
                              i, ids[i], len));
    if (seg[i] != 0)
      fail_sample(h5::kSegmentIds, row,
                  fmt::format("segment_ids[{}] = {} is in the padding (input_mask is 0 from "
                              "{}) but not 0",
                              i, seg[i], len));
  }
  out.input_ids.assign(ids, ids + len);
  out.segment_ids.resize(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    // Checked here, before narrowing to int8 could change the value shown in the message.
    if (seg[i] != 0 && seg[i] != 1)
      fail_sample(h5::kSegmentIds, row,
                  fmt::format("segment_ids[{}] = {} is not 0 or 1", i, seg[i]));
    out.segment_ids[i] = static_cast<int8_t>(seg[i]);
  }

  // Used prediction slots come first; the first position 0 ([CLS], never masked) marks the
  // start of the unused slots, which must all be 0.
  const int32_t* pos = masked_positions.values.data() + r * P;
  const int32_t* mids = masked_ids.values.data() + r * P;
  int64_t np = 0;
  while (np < P && pos[np] != 0) ++np;
  for (int64_t j = np; j < P; ++j) {
    if (pos[j] != 0)
      fail_sample(h5::kMaskedPositions, row,
                  fmt::format("masked_lm_positions[{}] = {} follows the unused slot {} "
                              "(position 0); unused slots must be 0",
                              j, pos[j], np));
    if (mids[j] != 0)
      fail_sample(h5::kMaskedIds, row,
                  fmt::format("masked_lm_ids[{}] = {} is in an unused slot "
                              "(masked_lm_positions[{}] = 0) but not 0",
                              j, mids[j], j));
  }
  out.masked_lm_positions.assign(pos, pos + np);
  out.masked_lm_ids.assign(mids, mids + np);
}

void ShardReader::Impl::decode_varlength(int64_t row, int64_t r, Sample& out) {
  for (const InColumn* c : {&input_ids, &segment_ids, &masked_positions, &masked_ids})
    if (!c->overflows.empty()) check_overflow(*c, c->offsets[r], c->offsets[r + 1], row);
  const int32_t* ids = input_ids.values.data();
  out.input_ids.assign(ids + input_ids.offsets[r], ids + input_ids.offsets[r + 1]);
  const int64_t seg_begin = segment_ids.offsets[r], seg_end = segment_ids.offsets[r + 1];
  out.segment_ids.resize(static_cast<size_t>(seg_end - seg_begin));
  for (int64_t i = seg_begin; i < seg_end; ++i) {
    const int32_t v = segment_ids.values[i];
    if (v != 0 && v != 1)
      fail_sample(h5::kSegmentIds, row,
                  fmt::format("segment_ids[{}] = {} is not 0 or 1", i - seg_begin, v));
    out.segment_ids[i - seg_begin] = static_cast<int8_t>(v);
  }
  const int32_t* pos = masked_positions.values.data();
  out.masked_lm_positions.assign(pos + masked_positions.offsets[r],
                                 pos + masked_positions.offsets[r + 1]);
  const int32_t* mids = masked_ids.values.data();
  out.masked_lm_ids.assign(mids + masked_ids.offsets[r], mids + masked_ids.offsets[r + 1]);
}

void ShardReader::Impl::decode(int64_t row, Sample& out) {
  const int64_t r = row - window_begin;
  if (info.format == ShardFormat::fixed)
    decode_fixed(row, r, out);
  else
    decode_varlength(row, r, out);
  if (!labels.overflows.empty()) check_overflow(labels, r, r + 1, row);
  const int32_t label = labels.values[r];
  if (label != 0 && label != 1)
    fail_sample(h5::kNextSentenceLabels, row,
                fmt::format("next_sentence_labels = {} is not 0 or 1", label));
  out.next_sentence_label = static_cast<int8_t>(label);
  out.id = row;
  const std::string problem = check_sample(out, rules);
  if (!problem.empty()) fail_sample(dataset_of(problem), row, problem);
}

ShardReader::ShardReader(const std::string& path, const SampleRules& rules, int chunk_samples)
    : impl_(std::make_unique<Impl>()) {
  impl_->info.path = path;
  impl_->rules = rules;
  impl_->open(chunk_samples);
}

ShardReader::~ShardReader() = default;

const ShardInfo& ShardReader::info() const { return impl_->info; }

bool ShardReader::next(Sample& out) {
  Impl& m = *impl_;
  if (m.cursor >= m.info.num_samples) return false;
  h5::init_thread();  // a reader may be handed to another thread after construction
  if (m.cursor < m.window_begin || m.cursor >= m.window_end) m.load_window(m.cursor);
  // The cursor moves past a sample before it is validated, so a caller that skips bad
  // samples (--skip-bad-samples) continues with the next one after catching the error.
  const int64_t row = m.cursor++;
  m.decode(row, out);
  return true;
}

void ShardReader::seek(int64_t row) {
  PB_REQUIRE(row >= 0 && row <= impl_->info.num_samples,
             "shard {}: cannot seek to sample {} (the shard has {} samples)", impl_->info.path, row,
             impl_->info.num_samples);
  impl_->cursor = row;
}

void ShardReader::read_range(int64_t begin, int64_t end, std::vector<Sample>& out) {
  const int64_t n = impl_->info.num_samples;
  PB_REQUIRE(0 <= begin && begin <= end && end <= n,
             "shard {}: cannot read samples [{}, {}) (the shard has {} samples)", impl_->info.path,
             begin, end, n);
  seek(begin);
  out.reserve(out.size() + static_cast<size_t>(end - begin));
  for (int64_t row = begin; row < end; ++row) {
    out.emplace_back();
    try {
      next(out.back());
    } catch (...) {
      out.pop_back();  // out holds only valid samples
      throw;
    }
  }
}

}  // namespace packbert
