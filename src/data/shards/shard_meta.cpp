// ShardMeta as attributes of a shard's root group (written by ShardWriter, read by ShardReader),
// and the check of a recorded shard against what the trainer expects.
#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "data/shards/shard.h"
#include "data/shards/shard_common.h"

namespace packbert {

namespace {

using h5::Handle;

// The attribute whose presence marks a recorded shard.
constexpr const char* kSha256 = "tokenizer_sha256";

void write_string(hid_t file, const char* name, const std::string& value, const std::string& path) {
  Handle type(PB_H5(H5Tcopy(H5T_C_S1), "shard {}: attribute '{}'", path, name));
  PB_H5(H5Tset_size(type.get(), std::max<size_t>(1, value.size())), "shard {}: attribute '{}'",
        path, name);
  PB_H5(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "shard {}: attribute '{}'", path, name);
  Handle space(PB_H5(H5Screate(H5S_SCALAR), "shard {}: attribute '{}'", path, name));
  Handle attr(PB_H5(H5Acreate2(file, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    "shard {}: attribute '{}'", path, name));
  std::vector<char> bytes(std::max<size_t>(1, value.size()), '\0');
  std::memcpy(bytes.data(), value.data(), value.size());
  PB_H5(H5Awrite(attr.get(), type.get(), bytes.data()), "shard {}: attribute '{}'", path, name);
}

void write_int(hid_t file, const char* name, int64_t value, const std::string& path) {
  Handle space(PB_H5(H5Screate(H5S_SCALAR), "shard {}: attribute '{}'", path, name));
  Handle attr(PB_H5(H5Acreate2(file, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    "shard {}: attribute '{}'", path, name));
  PB_H5(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), "shard {}: attribute '{}'", path, name);
}

Handle open_attribute(hid_t file, const char* name, const std::string& path) {
  const htri_t exists = H5Aexists(file, name);
  PB_REQUIRE(exists > 0,
             "shard {}: attribute '{}' is missing (a shard that records its tokenizer has "
             "tokenizer_sha256, vocab_size, cls_id, sep_id, mask_id, pad_id, masks and samples)",
             path, name);
  return Handle(PB_H5(H5Aopen(file, name, H5P_DEFAULT), "shard {}: attribute '{}'", path, name));
}

std::string read_string(hid_t file, const char* name, const std::string& path) {
  Handle attr = open_attribute(file, name, path);
  Handle type(PB_H5(H5Aget_type(attr.get()), "shard {}: attribute '{}'", path, name));
  PB_REQUIRE(H5Tget_class(type.get()) == H5T_STRING, "shard {}: attribute '{}' is {}, not a string",
             path, name, h5::describe_type(type.get()));
  if (H5Tis_variable_str(type.get()) > 0) {  // as h5py writes a str
    char* value = nullptr;
    PB_H5(H5Aread(attr.get(), type.get(), &value), "shard {}: attribute '{}'", path, name);
    std::string s = value ? value : "";
    H5free_memory(value);
    return s;
  }
  const size_t size = H5Tget_size(type.get());
  std::vector<char> bytes(size + 1, '\0');
  PB_H5(H5Aread(attr.get(), type.get(), bytes.data()), "shard {}: attribute '{}'", path, name);
  return std::string(bytes.data(), strnlen(bytes.data(), size));
}

int64_t read_int(hid_t file, const char* name, const std::string& path) {
  Handle attr = open_attribute(file, name, path);
  Handle type(PB_H5(H5Aget_type(attr.get()), "shard {}: attribute '{}'", path, name));
  PB_REQUIRE(H5Tget_class(type.get()) == H5T_INTEGER,
             "shard {}: attribute '{}' is {}, not an integer", path, name,
             h5::describe_type(type.get()));
  int64_t v = 0;
  PB_H5(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), "shard {}: attribute '{}'", path, name);
  return v;
}

int32_t read_id(hid_t file, const char* name, const std::string& path, int64_t vocab_size) {
  const int64_t v = read_int(file, name, path);
  PB_REQUIRE(v >= 0 && v < vocab_size, "shard {}: attribute '{}' = {} is outside [0, {})", path,
             name, v, vocab_size);
  return static_cast<int32_t>(v);
}

}  // namespace

namespace h5 {

void write_shard_meta(hid_t file, const ShardMeta& m, const std::string& path) {
  if (!m.recorded) return;
  write_string(file, "tokenizer", m.tokenizer, path);
  write_string(file, kSha256, m.tokenizer_sha256, path);
  write_int(file, "vocab_size", m.vocab_size, path);
  write_int(file, "cls_id", m.cls_id, path);
  write_int(file, "sep_id", m.sep_id, path);
  write_int(file, "mask_id", m.mask_id, path);
  write_int(file, "pad_id", m.pad_id, path);
  write_string(file, "masks", m.masks, path);
  write_string(file, "samples", m.samples, path);
}

ShardMeta read_shard_meta(hid_t file, const std::string& path) {
  ShardMeta m;
  const htri_t recorded = H5Aexists(file, kSha256);
  PB_REQUIRE(recorded >= 0, "shard {}: cannot read the root group's attributes", path);
  if (recorded == 0) return m;
  m.recorded = true;
  m.tokenizer = read_string(file, "tokenizer", path);
  m.tokenizer_sha256 = read_string(file, kSha256, path);
  m.vocab_size = read_int(file, "vocab_size", path);
  PB_REQUIRE(m.vocab_size >= 1, "shard {}: attribute 'vocab_size' = {} must be >= 1", path,
             m.vocab_size);
  m.cls_id = read_id(file, "cls_id", path, m.vocab_size);
  m.sep_id = read_id(file, "sep_id", path, m.vocab_size);
  m.mask_id = read_id(file, "mask_id", path, m.vocab_size);
  m.pad_id = read_id(file, "pad_id", path, m.vocab_size);
  m.masks = read_string(file, "masks", path);
  PB_REQUIRE(m.masks == "static" || m.masks == "none",
             "shard {}: attribute 'masks' = \"{}\" is not \"static\" or \"none\"", path, m.masks);
  m.samples = read_string(file, "samples", path);
  PB_REQUIRE(m.samples == "pairs" || m.samples == "documents",
             "shard {}: attribute 'samples' = \"{}\" is not \"pairs\" or \"documents\"", path,
             m.samples);
  return m;
}

}  // namespace h5

std::string check_shard_meta(const ShardMeta& m, const SampleRules& r) {
  if (!m.recorded) return {};
  if (!r.tokenizer_sha256.empty() && r.tokenizer_sha256 != m.tokenizer_sha256)
    return fmt::format(
        "made with tokenizer {} (sha256 {}), but the configured tokenizer is {} (sha256 {})",
        m.tokenizer, m.tokenizer_sha256, r.tokenizer, r.tokenizer_sha256);
  if (r.model_vocab_size > 0 && m.vocab_size != r.model_vocab_size)
    return fmt::format(
        "its tokenizer {} has {} tokens, but the model's vocabulary has {} (set model.vocab_size "
        "= {})",
        m.tokenizer, m.vocab_size, r.model_vocab_size, m.vocab_size);
  if (r.needs_masks && m.masks == "none")
    return "holds no masks (prepare --masks none): only training with data.masking = "
           "\"dynamic\" reads it (evaluation reads the eval shard, which prepare masks)";
  if (r.needs_pairs && m.samples == "documents")
    return "holds document chunks without NSP pairs (prepare --samples documents): train a model "
           "without the NSP head (model.nsp_head = false)";
  return {};
}

}  // namespace packbert
