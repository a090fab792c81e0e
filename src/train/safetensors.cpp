#include "train/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp assumes a little-endian host (the format is little-endian)"
#endif

namespace packbert {

namespace {

struct DTypeRow {
  StDType t;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::F64, "F64", 8}, {StDType::F32, "F32", 4}, {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I64, "I64", 8}, {StDType::I32, "I32", 4},
    {StDType::I16, "I16", 2}, {StDType::I8, "I8", 1},   {StDType::U8, "U8", 1},
    {StDType::BOOL, "BOOL", 1},
};

// The reference refuses headers above 100 MB.
constexpr uint64_t kMaxHeader = 100'000'000;
// Linux moves at most 0x7ffff000 bytes per read/write call.
constexpr size_t kMaxIo = size_t{1} << 30;

std::string os_error(int err) { return std::strerror(err); }

// Element count with overflow detection; false on a negative dim or overflow.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    const auto ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > std::numeric_limits<uint64_t>::max() / ud) return false;
    n *= ud;
  }
  *out = n;
  return true;
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(fd, p, std::min(bytes, kMaxIo));
    if (w < 0) {
      if (errno == EINTR) continue;
      PB_THROW("{}: write failed: {}", path, os_error(errno));
    }
    if (w == 0) PB_THROW("{}: write failed: wrote 0 of {} bytes", path, bytes);
    p += w;
    bytes -= static_cast<size_t>(w);
  }
}

}  // namespace

const char* st_dtype_name(StDType t) {
  for (const DTypeRow& r : kDTypes)
    if (r.t == t) return r.name;
  return "?";
}

size_t st_dtype_size(StDType t) {
  for (const DTypeRow& r : kDTypes)
    if (r.t == t) return r.size;
  PB_CHECK(false, "unknown StDType {}", static_cast<int>(t));
  return 0;
}

bool st_parse_dtype(const std::string& name, StDType* out) {
  for (const DTypeRow& r : kDTypes)
    if (name == r.name) {
      *out = r.t;
      return true;
    }
  return false;
}

int64_t st_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string st_shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---- writer -------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header["__metadata__"] = md;
  }
  std::vector<uint64_t> bytes(tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const StTensor& t = tensors[i];
    PB_REQUIRE(!t.name.empty() && t.name != "__metadata__", "{}: invalid tensor name '{}'", path,
               t.name);
    PB_REQUIRE(!header.contains(t.name), "{}: tensor '{}' given twice", path, t.name);
    uint64_t n = 0;
    PB_REQUIRE(checked_numel(t.shape, &n), "{}: tensor '{}': invalid shape {}", path, t.name,
               st_shape_str(t.shape));
    bytes[i] = n * st_dtype_size(t.dtype);
    PB_REQUIRE(bytes[i] == 0 || t.data != nullptr, "{}: tensor '{}' has no data", path, t.name);
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes[i]}}};
    offset += bytes[i];
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(n >> (8 * i));

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PB_REQUIRE(fd >= 0, "{}: cannot create: {}", path, os_error(errno));
  try {
    write_all(fd, prefix, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (size_t i = 0; i < tensors.size(); ++i) write_all(fd, tensors[i].data, bytes[i], path);
    PB_REQUIRE(::fsync(fd) == 0, "{}: fsync failed: {}", path, os_error(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    PB_THROW("{}: close failed: {}", path, os_error(err));
  }
}

// ---- reader -------------------------------------------------------------------------------

SafetensorsFile::~SafetensorsFile() { close(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

void SafetensorsFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

void pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset, const std::string& path,
               const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t r = ::pread(fd, p, std::min<uint64_t>(bytes, kMaxIo), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      PB_THROW("{}: reading {} failed: {}", path, what, os_error(errno));
    }
    PB_REQUIRE(r > 0, "{}: reading {}: unexpected end of file at byte {}", path, what, offset);
    p += r;
    bytes -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

}  // namespace

void SafetensorsFile::open(const std::string& path) {
  close();
  path_ = path;
  tensors_.clear();
  index_.clear();
  metadata_.clear();
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PB_REQUIRE(fd_ >= 0, "{}: cannot open: {}", path, os_error(errno));
  struct stat st {};
  PB_REQUIRE(::fstat(fd_, &st) == 0, "{}: stat failed: {}", path, os_error(errno));
  PB_REQUIRE(S_ISREG(st.st_mode), "{}: not a regular file", path);
  const auto file_size = static_cast<uint64_t>(st.st_size);
  PB_REQUIRE(file_size >= 8, "{}: not a safetensors file: {} bytes, shorter than the 8-byte "
             "header length", path, file_size);
  unsigned char prefix[8];
  pread_all(fd_, prefix, 8, 0, path, "the header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  PB_REQUIRE(n <= kMaxHeader, "{}: header length {} is larger than the limit of {} bytes", path,
             n, kMaxHeader);
  PB_REQUIRE(n <= file_size - 8, "{}: header length {} runs past the end of the file ({} bytes)",
             path, n, file_size);
  std::string text(n, '\0');
  pread_all(fd_, text.data(), n, 8, path, "the header");
  data_start_ = 8 + n;
  const uint64_t data_size = file_size - data_start_;

  nlohmann::ordered_json header;  // header order breaks ties between empty tensors
  try {
    header = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PB_THROW("{}: header is not valid JSON: {}", path, e.what());
  }
  PB_REQUIRE(header.is_object(), "{}: header is not a JSON object", path);
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::ordered_json& v = it.value();
    if (name == "__metadata__") {
      PB_REQUIRE(v.is_object(), "{}: __metadata__ is not an object", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        PB_REQUIRE(m.value().is_string(), "{}: __metadata__ key '{}' is not a string", path,
                   m.key());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    PB_REQUIRE(v.is_object(), "{}: tensor '{}': entry is not an object", path, name);
    StTensorInfo t;
    t.name = name;
    PB_REQUIRE(v.contains("dtype") && v["dtype"].is_string(), "{}: tensor '{}': no dtype", path,
               name);
    const std::string dtype = v["dtype"].get<std::string>();
    PB_REQUIRE(st_parse_dtype(dtype, &t.dtype), "{}: tensor '{}': unknown dtype '{}'", path,
               name, dtype);
    PB_REQUIRE(v.contains("shape") && v["shape"].is_array(), "{}: tensor '{}': no shape", path,
               name);
    for (const auto& d : v["shape"]) {
      PB_REQUIRE(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                 "{}: tensor '{}': invalid shape {}", path, name, v["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& off = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::ordered_json();
    PB_REQUIRE(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               "{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    PB_REQUIRE(t.begin <= t.end, "{}: tensor '{}': data_offsets [{}, {}] end before they begin",
               path, name, t.begin, t.end);
    uint64_t numel = 0;
    PB_REQUIRE(checked_numel(t.shape, &numel) &&
                   numel <= std::numeric_limits<uint64_t>::max() / st_dtype_size(t.dtype),
               "{}: tensor '{}': shape {} overflows", path, name, st_shape_str(t.shape));
    const uint64_t bytes = numel * st_dtype_size(t.dtype);
    PB_REQUIRE(bytes == t.end - t.begin,
               "{}: tensor '{}': shape {} of {} is {} bytes but data_offsets [{}, {}] hold {}",
               path, name, st_shape_str(t.shape), dtype, bytes, t.begin, t.end,
               t.end - t.begin);
    PB_REQUIRE(t.end <= data_size,
               "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section "
               "({} bytes; file truncated?)",
               path, name, t.begin, t.end, data_size);
    tensors_.push_back(std::move(t));
  }
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StTensorInfo& t = tensors_[i];
    PB_REQUIRE(t.begin >= pos, "{}: tensor '{}' (bytes [{}, {}]) overlaps tensor '{}'", path,
               t.name, t.begin, t.end, tensors_[i - 1].name);
    PB_REQUIRE(t.begin == pos, "{}: tensor '{}' begins at byte {}, leaving a gap after byte {}",
               path, t.name, t.begin, pos);
    pos = t.end;
    index_[t.name] = i;
  }
  PB_REQUIRE(pos == data_size, "{}: the data section has {} bytes but the tensors cover {}",
             path, data_size, pos);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const StTensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

const StTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  PB_REQUIRE(it != index_.end(), "{}: no tensor '{}'", path_, name);
  return tensors_[it->second];
}

void SafetensorsFile::read(const std::string& name, void* dst, StDType expected,
                           const std::vector<int64_t>& expected_shape) const {
  const StTensorInfo& t = info(name);
  PB_REQUIRE(t.dtype == expected && t.shape == expected_shape,
             "{}: tensor '{}' is {} {}, expected {} {}", path_, name, st_dtype_name(t.dtype),
             st_shape_str(t.shape), st_dtype_name(expected), st_shape_str(expected_shape));
  read_raw(name, dst);
}

void SafetensorsFile::read_raw(const std::string& name, void* dst) const {
  const StTensorInfo& t = info(name);
  PB_REQUIRE(fd_ >= 0, "{}: file is closed", path_);
  pread_all(fd_, dst, t.end - t.begin, data_start_ + t.begin, path_,
            fmt::format("tensor '{}'", name));
}

}  // namespace packbert
