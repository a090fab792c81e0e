// Helpers of the shard tests (header-only): random sample sets, reading shards back, catching
// packbert::Error, and
// raw_*/write_raw_h5, which write shard-like HDF5 files directly with the C API, bypassing
// ShardWriter, so tests can produce what the writer never would: wider integer types, float
// dtypes, broken masks, mismatched shapes, missing datasets.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/base/error.h"
#include "data/shards/sample.h"
#include "data/shards/shard.h"
#include "test_util.h"

namespace packbert::test {

// n valid random samples: lengths 5 .. max_len, 0 .. max_predictions masked tokens.
inline std::vector<Sample> random_samples(std::mt19937_64& rng, size_t n, int max_len,
                                          int max_predictions) {
  std::vector<Sample> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(random_sample(rng, 5, max_len, max_predictions));
  return out;
}

// Every sample of the shards, in order, each validated by the reader against `rules`.
inline std::vector<Sample> read_shards(const std::vector<std::string>& paths,
                                       const SampleRules& rules) {
  std::vector<Sample> out;
  Sample s;
  for (const std::string& path : paths) {
    ShardReader reader(path, rules);
    while (reader.next(s)) out.push_back(s);
  }
  return out;
}

// The message of the packbert::Error that f throws, "" when it throws nothing (callers assert
// on the message). Any other exception type propagates and fails the test.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One dataset to write: fixed (dims + row-major values) or vlen (one vector per row).
struct RawDataset {
  std::string name;
  hid_t file_type = H5T_STD_I16LE;  // for vlen: the base type
  bool vlen = false;
  std::vector<hsize_t> dims;               // fixed only
  std::vector<int64_t> values;             // fixed only, row-major
  std::vector<std::vector<int64_t>> rows;  // vlen only
};

inline RawDataset& find_dataset(std::vector<RawDataset>& ds, const std::string& name) {
  for (RawDataset& d : ds)
    if (d.name == name) return d;
  throw std::runtime_error("no raw dataset " + name);
}

inline void remove_dataset(std::vector<RawDataset>& ds, const std::string& name) {
  for (auto it = ds.begin(); it != ds.end(); ++it)
    if (it->name == name) {
      ds.erase(it);
      return;
    }
  throw std::runtime_error("no raw dataset " + name);
}

// Writes the datasets (contiguous layout, values converted by HDF5 from int64 memory); a
// user_block > 0 (a power of two >= 512) reserves that many bytes before the HDF5 data.
inline void write_raw_h5(const std::string& path, const std::vector<RawDataset>& datasets,
                         hsize_t user_block = 0) {
  auto check = [&](int64_t status, const std::string& what) {
    if (status < 0) throw std::runtime_error("write_raw_h5 " + path + ": " + what + " failed");
    return status;
  };
  const hid_t fcpl = check(H5Pcreate(H5P_FILE_CREATE), "H5Pcreate");
  if (user_block > 0) check(H5Pset_userblock(fcpl, user_block), "H5Pset_userblock");
  const hid_t file = check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT), "H5Fcreate");
  H5Pclose(fcpl);
  for (const RawDataset& d : datasets) {
    if (!d.vlen) {
      const hid_t space =
          check(H5Screate_simple(static_cast<int>(d.dims.size()), d.dims.data(), nullptr), d.name);
      const hid_t ds = check(H5Dcreate2(file, d.name.c_str(), d.file_type, space, H5P_DEFAULT,
                                        H5P_DEFAULT, H5P_DEFAULT),
                             d.name);
      if (!d.values.empty())
        check(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.values.data()),
              d.name);
      H5Dclose(ds);
      H5Sclose(space);
      continue;
    }
    const hsize_t n = d.rows.size();
    const hid_t space = check(H5Screate_simple(1, &n, nullptr), d.name);
    const hid_t file_type = check(H5Tvlen_create(d.file_type), d.name);
    const hid_t mem_type = check(H5Tvlen_create(H5T_NATIVE_INT64), d.name);
    std::vector<hvl_t> rows(n);
    for (size_t r = 0; r < n; ++r) {
      rows[r].len = d.rows[r].size();
      rows[r].p = const_cast<int64_t*>(d.rows[r].data());
    }
    const hid_t ds = check(
        H5Dcreate2(file, d.name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
        d.name);
    if (n > 0) check(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()), d.name);
    H5Dclose(ds);
    H5Tclose(mem_type);
    H5Tclose(file_type);
    H5Sclose(space);
  }
  check(H5Fclose(file), "H5Fclose");
}

// The fixed-format datasets of samples, every dataset stored as int_type (labels too).
inline std::vector<RawDataset> raw_fixed(const std::vector<Sample>& samples, int L, int P,
                                         hid_t int_type) {
  const hsize_t n = samples.size(), l = static_cast<hsize_t>(L), p = static_cast<hsize_t>(P);
  auto make = [&](const char* name, hsize_t width) {
    RawDataset d;
    d.name = name;
    d.file_type = int_type;
    d.dims = width > 0 ? std::vector<hsize_t>{n, width} : std::vector<hsize_t>{n};
    d.values.assign(n * (width > 0 ? width : 1), 0);
    return d;
  };
  RawDataset ids = make("input_ids", l), mask = make("input_mask", l), seg = make("segment_ids", l),
             pos = make("masked_lm_positions", p), mids = make("masked_lm_ids", p),
             labels = make("next_sentence_labels", 0);
  for (size_t r = 0; r < n; ++r) {
    const Sample& s = samples[r];
    for (int i = 0; i < s.length(); ++i) {
      ids.values[r * l + i] = s.input_ids[i];
      mask.values[r * l + i] = 1;
      seg.values[r * l + i] = s.segment_ids[i];
    }
    for (int j = 0; j < s.num_masked(); ++j) {
      pos.values[r * p + j] = s.masked_lm_positions[j];
      mids.values[r * p + j] = s.masked_lm_ids[j];
    }
    labels.values[r] = s.next_sentence_label;
  }
  return {ids, mask, seg, pos, mids, labels};
}

// The varlength datasets of samples, vlen of int_type (labels plain int_type).
inline std::vector<RawDataset> raw_varlength(const std::vector<Sample>& samples, hid_t int_type) {
  auto make = [&](const char* name) {
    RawDataset d;
    d.name = name;
    d.file_type = int_type;
    d.vlen = true;
    return d;
  };
  RawDataset ids = make("input_ids"), seg = make("segment_ids"), pos = make("masked_lm_positions"),
             mids = make("masked_lm_ids");
  RawDataset labels;
  labels.name = "next_sentence_labels";
  labels.file_type = int_type;
  labels.dims = {samples.size()};
  for (const Sample& s : samples) {
    ids.rows.emplace_back(s.input_ids.begin(), s.input_ids.end());
    seg.rows.emplace_back(s.segment_ids.begin(), s.segment_ids.end());
    pos.rows.emplace_back(s.masked_lm_positions.begin(), s.masked_lm_positions.end());
    mids.rows.emplace_back(s.masked_lm_ids.begin(), s.masked_lm_ids.end());
    labels.values.push_back(s.next_sentence_label);
  }
  return {ids, seg, pos, mids, labels};
}

}  // namespace packbert::test
