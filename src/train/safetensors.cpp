#include "train/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <thread>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "kernels/base/error.h"

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
    {StDType::f64, "F64", 8},      {StDType::f32, "F32", 4}, {StDType::f16, "F16", 2},
    {StDType::bf16, "BF16", 2},    {StDType::i64, "I64", 8}, {StDType::i32, "I32", 4},
    {StDType::i16, "I16", 2},      {StDType::i8, "I8", 1},   {StDType::u8, "U8", 1},
    {StDType::boolean, "BOOL", 1},
};

// The reference refuses headers above 100 MB.
constexpr uint64_t kMaxHeader = 100'000'000;
// Linux moves at most 0x7ffff000 bytes per read/write call.
constexpr size_t kMaxIo = size_t{1} << 30;

// Tensors are read (and hashed) in pieces of this size, so each piece is hashed while it is
// still in the cache the read brought it into.
constexpr uint64_t kReadPiece = uint64_t{1} << 20;

// The checksum keys of __metadata__ (safetensors.h).
constexpr const char* kChecksumKey = "checksum";
const std::string kChecksumPrefix = "checksum.";
const std::string kHeaderName = "__header__";
constexpr size_t kHexDigits = 16;

std::string os_error(int err) { return std::strerror(err); }

// Throws DamagedFileError with the formatted message unless cond holds.
#define PB_DAMAGED(cond, ...)                                                                      \
  do {                                                                                             \
    if (!(cond)) throw ::packbert::DamagedFileError(::fmt::format(__VA_ARGS__));                   \
  } while (0)

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }

// 16 lower-case hex digits (exactly: "ABC..." is refused, so that no flipped case bit reads as
// the same value) -> the value; false otherwise.
bool parse_hex64(const std::string& s, uint64_t* out) {
  if (s.size() != kHexDigits) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d = 0;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

bool is_checksum_key(const std::string& key) {
  return key == kChecksumKey || key.compare(0, kChecksumPrefix.size(), kChecksumPrefix) == 0;
}

// XXH3-64 of the 8 length bytes and the header text, the header checksum's 16 digits (at
// digits_at in text) read as '0's.
uint64_t header_hash(const unsigned char prefix[8], std::string text, size_t digits_at) {
  text.replace(digits_at, kHexDigits, kHexDigits, '0');
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> st(XXH3_createState(),
                                                                     XXH3_freeState);
  PB_CHECK(st != nullptr, "XXH3_createState failed");
  XXH3_64bits_reset(st.get());
  XXH3_64bits_update(st.get(), prefix, 8);
  XXH3_64bits_update(st.get(), text.data(), text.size());
  return XXH3_64bits_digest(st.get());
}

// Where the value of "checksum.__header__" begins in the raw header text: after the key (which
// must occur once), optional blanks, ':', optional blanks and '"'; npos when not so.
size_t header_digits_at(const std::string& text) {
  const std::string key = "\"" + kChecksumPrefix + kHeaderName + "\"";
  const size_t k = text.find(key);
  if (k == std::string::npos || text.find(key, k + 1) != std::string::npos)
    return std::string::npos;
  size_t p = k + key.size();
  auto blanks = [&] {
    while (p < text.size() &&
           (text[p] == ' ' || text[p] == '\t' || text[p] == '\n' || text[p] == '\r'))
      ++p;
  };
  blanks();
  if (p >= text.size() || text[p] != ':') return std::string::npos;
  ++p;
  blanks();
  if (p >= text.size() || text[p] != '"') return std::string::npos;
  ++p;
  if (p + kHexDigits >= text.size() || text[p + kHexDigits] != '"') return std::string::npos;
  return p;
}

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

// f(i) for every i in [0, n), on up to kStMaxThreads threads taking the next i as they finish;
// then rethrows the exception of the lowest i that threw.
void parallel_for(size_t n, const std::function<void(size_t)>& f) {
  const size_t threads =
      std::min<size_t>({n, static_cast<size_t>(kStMaxThreads),
                        static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency()))});
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        f(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
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

std::string st_checksum_hex(const void* data, size_t bytes) {
  return hex64(XXH3_64bits(data, bytes));
}

// ---- writer -------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, bool checksums) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json md = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) {
    PB_REQUIRE(!is_checksum_key(k), "{}: metadata key '{}' is reserved for checksums", path, k);
    md[k] = v;
  }
  if (checksums) md[kChecksumKey] = kStChecksumAlgorithm;
  if (!md.empty()) header["__metadata__"] = md;
  std::vector<uint64_t> bytes(tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const StTensor& t = tensors[i];
    PB_REQUIRE(!t.name.empty() && t.name != "__metadata__" && t.name != kHeaderName,
               "{}: invalid tensor name '{}'", path, t.name);
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
  // Checksums as 16 '0's for now: their length is fixed, so the header's is known before they
  // are. The data is written while other threads hash it; the real values go into the header,
  // written again in place, at the end.
  if (checksums) {
    for (const StTensor& t : tensors)
      header["__metadata__"][kChecksumPrefix + t.name] = std::string(kHexDigits, '0');
    header["__metadata__"][kChecksumPrefix + kHeaderName] = std::string(kHexDigits, '0');
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(n >> (8 * i));
  std::vector<size_t> digits_at;  // where each tensor's checksum goes in text
  if (checksums)
    for (const StTensor& t : tensors) {
      const std::string key = nlohmann::ordered_json(kChecksumPrefix + t.name).dump() + ":\"";
      const size_t at = text.find(key);
      PB_CHECK(at != std::string::npos, "{}: the checksum place of '{}' was not found", path,
               t.name);
      digits_at.push_back(at + key.size());
    }

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PB_REQUIRE(fd >= 0, "{}: cannot create: {}", path, os_error(errno));
  std::vector<uint64_t> sums(tensors.size());
  std::thread hasher;
  if (checksums)
    hasher = std::thread([&] {
      parallel_for(tensors.size(),
                   [&](size_t i) { sums[i] = XXH3_64bits(tensors[i].data, bytes[i]); });
    });
  auto join_hasher = [&] {
    if (hasher.joinable()) hasher.join();
  };
  try {
    write_all(fd, prefix, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (size_t i = 0; i < tensors.size(); ++i) write_all(fd, tensors[i].data, bytes[i], path);
    join_hasher();
    if (checksums) {
      for (size_t i = 0; i < tensors.size(); ++i)
        text.replace(digits_at[i], kHexDigits, hex64(sums[i]));
      const size_t at = header_digits_at(text);
      PB_CHECK(at != std::string::npos, "{}: the header checksum's place was not found", path);
      text.replace(at, kHexDigits, hex64(header_hash(prefix, text, at)));
      PB_REQUIRE(::lseek(fd, 8, SEEK_SET) == 8, "{}: seek failed: {}", path, os_error(errno));
      write_all(fd, text.data(), text.size(), path);
    }
    PB_REQUIRE(::fsync(fd) == 0, "{}: fsync failed: {}", path, os_error(errno));
  } catch (...) {
    join_hasher();
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
    data_bytes_ = o.data_bytes_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
    has_checksums_ = o.has_checksums_;
    checksums_ = std::move(o.checksums_);
  }
  return *this;
}

void SafetensorsFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

// An end of file before `bytes` is a damaged (cut short) file; an OS error is a plain Error.
void pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset, const std::string& path,
               const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t r = ::pread(fd, p, std::min<uint64_t>(bytes, kMaxIo), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      PB_THROW("{}: reading {} failed: {}", path, what, os_error(errno));
    }
    PB_DAMAGED(r > 0, "{}: reading {}: unexpected end of file at byte {}", path, what, offset);
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
  checksums_.clear();
  has_checksums_ = false;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PB_REQUIRE(fd_ >= 0, "{}: cannot open: {}", path, os_error(errno));
  struct stat st {};
  PB_REQUIRE(::fstat(fd_, &st) == 0, "{}: stat failed: {}", path, os_error(errno));
  PB_REQUIRE(S_ISREG(st.st_mode), "{}: not a regular file", path);
  const auto file_size = static_cast<uint64_t>(st.st_size);
  PB_DAMAGED(file_size >= 8,
             "{}: not a safetensors file: {} bytes, shorter than the 8-byte "
             "header length",
             path, file_size);
  unsigned char prefix[8];
  pread_all(fd_, prefix, 8, 0, path, "the header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  PB_DAMAGED(n <= kMaxHeader, "{}: header length {} is larger than the limit of {} bytes", path, n,
             kMaxHeader);
  PB_DAMAGED(n <= file_size - 8, "{}: header length {} runs past the end of the file ({} bytes)",
             path, n, file_size);
  std::string text(n, '\0');
  pread_all(fd_, text.data(), n, 8, path, "the header");
  data_start_ = 8 + n;
  const uint64_t data_size = file_size - data_start_;
  data_bytes_ = data_size;

  nlohmann::ordered_json header;  // header order breaks ties between empty tensors
  try {
    header = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DamagedFileError(fmt::format("{}: header is not valid JSON: {}", path, e.what()));
  }
  PB_DAMAGED(header.is_object(), "{}: header is not a JSON object", path);
  // The header's own checksum first: a changed bit anywhere in it is reported as such, not as
  // whatever the changed header would then seem to say. A file has checksums when its metadata
  // has checksum keys or its text names the header's (so that a changed bit in the name
  // "__metadata__" does not pass for a file without checksums).
  std::map<std::string, std::string> sums;  // the checksum keys of __metadata__
  const bool metadata_ok = !header.contains("__metadata__") || header["__metadata__"].is_object();
  if (metadata_ok && header.contains("__metadata__"))
    for (auto m = header["__metadata__"].begin(); m != header["__metadata__"].end(); ++m)
      if (is_checksum_key(m.key()) && m.value().is_string())
        sums[m.key()] = m.value().get<std::string>();
  has_checksums_ =
      !sums.empty() || text.find("\"" + kChecksumPrefix + kHeaderName + "\"") != std::string::npos;
  if (has_checksums_) {
    auto algo = sums.find(kChecksumKey);
    PB_DAMAGED(algo != sums.end() && algo->second == kStChecksumAlgorithm,
               "{}: header: checksum algorithm {} (expected \"{}\"): the header is damaged or "
               "written by an unknown writer",
               path, algo == sums.end() ? std::string("missing") : "\"" + algo->second + "\"",
               kStChecksumAlgorithm);
    auto own = sums.find(kChecksumPrefix + kHeaderName);
    uint64_t stored = 0;
    const size_t at = header_digits_at(text);
    PB_DAMAGED(own != sums.end() && parse_hex64(own->second, &stored) && at != std::string::npos &&
                   text.compare(at, kHexDigits, own->second) == 0,
               "{}: header is damaged: its checksum ({}{}) is missing or malformed", path,
               kChecksumPrefix, kHeaderName);
    const uint64_t got = header_hash(prefix, text, at);
    PB_DAMAGED(got == stored, "{}: header is damaged: its checksum is {}, the header says {} ({})",
               path, hex64(got), own->second, kStChecksumAlgorithm);
    sums.erase(algo);
    sums.erase(own);
  }
  PB_DAMAGED(metadata_ok, "{}: __metadata__ is not an object", path);
  if (header.contains("__metadata__"))
    for (auto m = header["__metadata__"].begin(); m != header["__metadata__"].end(); ++m) {
      PB_DAMAGED(m.value().is_string(), "{}: __metadata__ key '{}' is not a string", path, m.key());
      if (!is_checksum_key(m.key())) metadata_[m.key()] = m.value().get<std::string>();
    }
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::ordered_json& v = it.value();
    if (name == "__metadata__") continue;
    PB_DAMAGED(v.is_object(), "{}: tensor '{}': entry is not an object", path, name);
    StTensorInfo t;
    t.name = name;
    PB_DAMAGED(v.contains("dtype") && v["dtype"].is_string(), "{}: tensor '{}': no dtype", path,
               name);
    const std::string dtype = v["dtype"].get<std::string>();
    PB_DAMAGED(st_parse_dtype(dtype, &t.dtype), "{}: tensor '{}': unknown dtype '{}'", path, name,
               dtype);
    PB_DAMAGED(v.contains("shape") && v["shape"].is_array(), "{}: tensor '{}': no shape", path,
               name);
    for (const auto& d : v["shape"]) {
      PB_DAMAGED(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                 "{}: tensor '{}': invalid shape {}", path, name, v["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& off = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::ordered_json();
    PB_DAMAGED(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               "{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    PB_DAMAGED(t.begin <= t.end, "{}: tensor '{}': data_offsets [{}, {}] end before they begin",
               path, name, t.begin, t.end);
    uint64_t numel = 0;
    PB_DAMAGED(checked_numel(t.shape, &numel) &&
                   numel <= std::numeric_limits<uint64_t>::max() / st_dtype_size(t.dtype),
               "{}: tensor '{}': shape {} overflows", path, name, st_shape_str(t.shape));
    const uint64_t bytes = numel * st_dtype_size(t.dtype);
    PB_DAMAGED(bytes == t.end - t.begin,
               "{}: tensor '{}': shape {} of {} is {} bytes but data_offsets [{}, {}] hold {}",
               path, name, st_shape_str(t.shape), dtype, bytes, t.begin, t.end, t.end - t.begin);
    PB_DAMAGED(t.end <= data_size,
               "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section "
               "({} bytes; file truncated?)",
               path, name, t.begin, t.end, data_size);
    if (has_checksums_) {
      auto sum = sums.find(kChecksumPrefix + name);
      uint64_t value = 0;
      PB_DAMAGED(sum != sums.end() && parse_hex64(sum->second, &value),
                 "{}: tensor '{}': its checksum is missing or malformed", path, name);
      checksums_[name] = value;
      sums.erase(sum);
    }
    tensors_.push_back(std::move(t));
  }
  PB_DAMAGED(sums.empty(), "{}: header: checksum '{}' names no tensor", path,
             sums.empty() ? std::string() : sums.begin()->first);
  std::stable_sort(tensors_.begin(), tensors_.end(),
                   [](const StTensorInfo& a, const StTensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t pos = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StTensorInfo& t = tensors_[i];
    PB_DAMAGED(t.begin >= pos, "{}: tensor '{}' (bytes [{}, {}]) overlaps tensor '{}'", path,
               t.name, t.begin, t.end, tensors_[i - 1].name);
    PB_DAMAGED(t.begin == pos, "{}: tensor '{}' begins at byte {}, leaving a gap after byte {}",
               path, t.name, t.begin, pos);
    pos = t.end;
    index_[t.name] = i;
  }
  PB_DAMAGED(pos == data_size, "{}: the data section has {} bytes but the tensors cover {}", path,
             data_size, pos);
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
  read_checked(t, dst);
}

void SafetensorsFile::read_raw(const std::string& name, void* dst) const {
  read_checked(info(name), dst);
}

void SafetensorsFile::read_many(const std::vector<Read>& reads) const {
  parallel_for(reads.size(), [&](size_t i) {
    read(reads[i].name, reads[i].dst, reads[i].dtype, reads[i].shape);
  });
}

void SafetensorsFile::verify(const std::string& name) const {
  const StTensorInfo& t = info(name);
  if (has_checksums_) read_checked(t, nullptr);
}

void SafetensorsFile::read_checked(const StTensorInfo& t, void* dst) const {
  PB_REQUIRE(fd_ >= 0, "{}: file is closed", path_);
  const std::string what = fmt::format("tensor '{}'", t.name);
  const uint64_t bytes = t.end - t.begin;
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> st(XXH3_createState(),
                                                                     XXH3_freeState);
  PB_CHECK(st != nullptr, "XXH3_createState failed");
  XXH3_64bits_reset(st.get());
  std::vector<char> scratch(dst ? 0 : static_cast<size_t>(std::min(bytes, kReadPiece)));
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t piece = std::min(kReadPiece, bytes - done);
    char* p = dst ? static_cast<char*>(dst) + done : scratch.data();
    pread_all(fd_, p, piece, data_start_ + t.begin + done, path_, what);
    if (has_checksums_) XXH3_64bits_update(st.get(), p, piece);
    done += piece;
  }
  if (!has_checksums_) return;
  const uint64_t got = XXH3_64bits_digest(st.get());
  const uint64_t want = checksums_.at(t.name);
  PB_DAMAGED(got == want,
             "{}: tensor '{}' is damaged: its data's checksum is {}, the header says {} ({})",
             path_, t.name, hex64(got), hex64(want), kStChecksumAlgorithm);
}

}  // namespace packbert
