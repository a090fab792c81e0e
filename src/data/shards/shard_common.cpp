// Shared pieces of the shard reader and writer: HDF5 error handling, handle closing, type
// descriptions, format names and list_shards.
#include "data/shards/shard_common.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <vector>

#include "data/shards/shard.h"

namespace packbert {

namespace h5 {

void init_thread() {
  // Thread-safe libhdf5 builds (Debian's is one) keep the auto-print setting per thread.
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

namespace {

herr_t collect_error(unsigned /*depth*/, const H5E_error2_t* err, void* data) {
  auto* messages = static_cast<std::vector<std::string>*>(data);
  // The stack is walked from the innermost (the cause) outwards; the first few messages are
  // the useful ones ("truncated file: ...", "unable to open file", ...); repeats say nothing.
  if (messages->size() < 3 && err->desc && *err->desc &&
      (messages->empty() || messages->back() != err->desc))
    messages->emplace_back(err->desc);
  return 0;
}

const char* basename_of(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

}  // namespace

std::string error_stack_summary() {
  const hid_t stack = H5Eget_current_stack();
  if (stack < 0) return "no HDF5 error details";
  std::vector<std::string> messages;
  H5Ewalk2(stack, H5E_WALK_UPWARD, collect_error, &messages);
  H5Eclose_stack(stack);
  if (messages.empty()) return "no HDF5 error details";
  std::string out;
  for (const std::string& m : messages) {
    if (!out.empty()) out += "; ";
    out += m;
  }
  return out;
}

void throw_call_failed(const std::string& context, const char* call, const char* file, int line) {
  const std::string details = error_stack_summary();
  // Keep only the function name of the call: the arguments are noise for a user.
  std::string fn(call);
  if (const size_t paren = fn.find('('); paren != std::string::npos) fn.resize(paren);
  throw Error(
      fmt::format("{}: HDF5 {} failed: {} [{}:{}]", context, fn, details, basename_of(file), line));
}

herr_t Handle::reset() {
  if (id_ < 0) return 0;
  const hid_t id = std::exchange(id_, H5I_INVALID_HID);
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    case H5I_GROUP: return H5Gclose(id);
    case H5I_ATTR: return H5Aclose(id);
    default: return H5Idec_ref(id) < 0 ? -1 : 0;
  }
}

std::string describe_type(hid_t type) {
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      const size_t bytes = H5Tget_size(type);
      const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
      return fmt::format("{}int{}", is_signed ? "" : "u", bytes * 8);
    }
    case H5T_FLOAT: return fmt::format("float{}", H5Tget_size(type) * 8);
    case H5T_STRING: return "string";
    case H5T_VLEN: {
      Handle base(H5Tget_super(type));
      return base.valid() ? "vlen " + describe_type(base.get()) : "vlen";
    }
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_OPAQUE: return "opaque";
    case H5T_BITFIELD: return "bitfield";
    case H5T_REFERENCE: return "reference";
    case H5T_TIME: return "time";
    default: return "unknown type";
  }
}

}  // namespace h5

const char* to_string(ShardFormat f) {
  switch (f) {
    case ShardFormat::fixed: return "fixed";
    case ShardFormat::var_length: return "varlength";
  }
  return "unknown";
}

ShardFormat parse_shard_format(const std::string& s) {
  if (s == "fixed") return ShardFormat::fixed;
  if (s == "varlength") return ShardFormat::var_length;
  PB_THROW("unknown shard format '{}' (expected 'fixed' or 'varlength')", s);
}

namespace {

bool has_shard_extension(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".h5" || ext == ".hdf5" || ext == ".hdf";
}

}  // namespace

std::vector<std::string> list_shards(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) PB_THROW("shard path '{}' does not exist", path);
  if (fs::is_regular_file(st)) return {path};
  if (!fs::is_directory(st)) PB_THROW("shard path '{}' is neither a file nor a directory", path);
  std::vector<std::string> shards;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    std::error_code entry_ec;
    if (e.is_regular_file(entry_ec) && has_shard_extension(e.path()))
      shards.push_back(e.path().string());
  }
  if (ec) PB_THROW("cannot list shard directory '{}': {}", path, ec.message());
  if (shards.empty())
    PB_THROW("shard directory '{}' has no shard files (*.h5, *.hdf5, *.hdf)", path);
  std::sort(shards.begin(), shards.end());
  return shards;
}

}  // namespace packbert
