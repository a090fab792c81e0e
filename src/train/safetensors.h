// A hand-written reader and writer of the safetensors format (Hugging Face's tensor file):
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a JSON object, UTF-8, padded with spaces to a multiple of 8 (as the reference
//              writer does):
//                { "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//                  ...,
//                  "__metadata__": {"<key>": "<string value>", ...} }   (optional)
//   [rest]     the data section: each tensor's bytes, row-major, little-endian, at
//              [begin, end) relative to the start of the data section
//
// The reader validates like the reference implementation: the header fits in the file, is a
// JSON object, every dtype is known, shape product * dtype size == end - begin, and the tensors'
// byte ranges tile the data section exactly (no overlap, no gap, no truncation, no trailing
// bytes). Every Error names the file and, where one is at fault, the tensor.
//
// Checksums. The writer adds, by default, these keys to "__metadata__" (other readers, Hugging
// Face's included, ignore metadata they do not know):
//   "checksum": "xxh3_64"                     the algorithm: XXH3, 64-bit, seed 0 (xxHash)
//   "checksum.<tensor name>": "<16 hex>"      of the tensor's data bytes, one per tensor
//   "checksum.__header__": "<16 hex>"         of the file's first 8 + N bytes (the length and
//                                             the header) with these 16 digits read as '0's
// Each value is the 64-bit hash as 16 lower-case hex digits, most significant first (xxHash's
// canonical form, Python's xxhash.xxh3_64().hexdigest()). The reader checks the header's when it
// opens the file and each tensor's as it reads it, so a changed bit anywhere is an Error naming
// the file and the header or the tensor. A file without "checksum" keys (written before they
// existed, or by another writer) reads as before, unverified: has_checksums() says which.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/base/error.h"

namespace packbert {

// The bytes of a file are not what was written: a checksum that does not match, a file cut
// short or not in the format. Thrown by the reader (and by checkpoints for their other files);
// the message names the file and, where one is at fault, the tensor. Other errors (a file that
// cannot be opened for lack of permission, an I/O error, a tensor of another shape than the
// caller expects) are plain Errors.
class DamagedFileError : public Error {
 public:
  using Error::Error;
};

// The checksum of the format above: XXH3-64 (seed 0) of `bytes` bytes, as 16 hex digits.
std::string st_checksum_hex(const void* data, size_t bytes);
inline constexpr const char* kStChecksumAlgorithm = "xxh3_64";

enum class StDType { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean };

const char* st_dtype_name(StDType t);  // "F32", "BF16", ...
size_t st_dtype_size(StDType t);       // bytes per element
// False when `name` is not a dtype this reader knows.
bool st_parse_dtype(const std::string& name, StDType* out);

// Elements of a shape (1 for a scalar, shape {}).
int64_t st_numel(const std::vector<int64_t>& shape);
std::string st_shape_str(const std::vector<int64_t>& shape);  // "[2, 3]"

// Tensors are hashed (by the writer) and read and hashed (by read_many) on up to this many
// threads at once, one tensor per thread: one core hashes at about memory speed, which is not
// small beside a write or a read from the page cache.
inline constexpr int kStMaxThreads = 8;

// One tensor to write: `data` holds numel(shape) elements of `dtype` (may be null when empty).
struct StTensor {
  std::string name;
  StDType dtype = StDType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `path` (created or truncated): the tensors' data in the given order, the metadata as
// "__metadata__" (omitted when empty and without checksums), with the checksums above unless
// `checksums` is false: other threads (up to kStMaxThreads) hash the tensors while the data is
// written, and the header is written again in place with them at the end. Every write is
// checked; the file is fsynced before it is closed. A failure (short write, ENOSPC, EFBIG, ...)
// is an Error naming the path and the OS reason, and the partial file is removed. Names must be
// unique, non-empty and neither "__metadata__" nor "__header__"; metadata keys must not be
// "checksum" or begin with "checksum.".
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       bool checksums = true);

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range within the data section
  uint64_t end = 0;
  int64_t numel() const { return st_numel(shape); }
};

// A safetensors file opened for reading: the header is parsed and validated by open(); data is
// read on demand with read() (the file stays open while the object lives).
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  explicit SafetensorsFile(const std::string& path) { open(path); }
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;

  // Opens and validates `path` (see the top of this file), the header checksum included;
  // DamagedFileError naming the path (and tensor) when the file is not what was written, Error
  // when it cannot be opened.
  void open(const std::string& path);
  void close();

  const std::string& path() const { return path_; }
  // Tensor names in the order of their data (ascending offsets).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Error naming the file and tensor when absent.
  const StTensorInfo& info(const std::string& name) const;
  // The "__metadata__" entries, less the checksum keys (has_checksums() tells of those).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Whether the file carries checksums (then the header's has been checked by open()).
  bool has_checksums() const { return has_checksums_; }
  // Bytes of the tensors' data (the file's size less 8 + N).
  uint64_t data_bytes() const { return data_bytes_; }

  // Reads tensor `name` into dst (numel * dtype size bytes). Error naming the path, the tensor
  // and both dtypes / shapes when the stored ones differ from the expected ones, or on a read
  // failure; DamagedFileError when its checksum does not match (dst then holds the bytes read).
  void read(const std::string& name, void* dst, StDType expected,
            const std::vector<int64_t>& expected_shape) const;
  // Reads whatever is stored (as info(name) describes it) into dst, checksum checked as read().
  void read_raw(const std::string& name, void* dst) const;
  // Several read()s at once, on up to kStMaxThreads threads; the Error is the one of the first
  // failing tensor in `reads`' order (all the others were read, or failed, by then).
  struct Read {
    std::string name;
    void* dst = nullptr;
    StDType dtype = StDType::f32;
    std::vector<int64_t> shape;
  };
  void read_many(const std::vector<Read>& reads) const;
  // Reads tensor `name` and checks its checksum without keeping the data; DamagedFileError on a
  // mismatch. Nothing to check (and no read) when the file has no checksums.
  void verify(const std::string& name) const;

 private:
  // Reads tensor t's data into dst (null: into a scratch piece, kept nowhere) in pieces, hashing
  // each piece as it comes (while it is in the cache), and checks the checksum when the file
  // has them.
  void read_checked(const StTensorInfo& t, void* dst) const;

  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // 8 + N
  uint64_t data_bytes_ = 0;
  std::vector<StTensorInfo> tensors_;  // ascending begin
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  bool has_checksums_ = false;
  std::map<std::string, uint64_t> checksums_;  // tensor name -> XXH3-64 of its bytes
};

}  // namespace packbert
