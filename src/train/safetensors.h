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
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace packbert {

enum class StDType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

const char* st_dtype_name(StDType t);  // "F32", "BF16", ...
size_t st_dtype_size(StDType t);       // bytes per element
// False when `name` is not a dtype this reader knows.
bool st_parse_dtype(const std::string& name, StDType* out);

// Elements of a shape (1 for a scalar, shape {}).
int64_t st_numel(const std::vector<int64_t>& shape);
std::string st_shape_str(const std::vector<int64_t>& shape);  // "[2, 3]"

// One tensor to write: `data` holds numel(shape) elements of `dtype` (may be null when empty).
struct StTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `path` (created or truncated): the tensors' data in the given order, the metadata as
// "__metadata__" (omitted when empty). Every write is checked; the file is fsynced before it is
// closed. A failure (short write, ENOSPC, EFBIG, ...) is an Error naming the path and the OS
// reason, and the partial file is removed. Names must be unique, non-empty and not
// "__metadata__".
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
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

  // Opens and validates `path` (see the top of this file); Error naming the path (and tensor).
  void open(const std::string& path);
  void close();

  const std::string& path() const { return path_; }
  // Tensor names in the order of their data (ascending offsets).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Error naming the file and tensor when absent.
  const StTensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads tensor `name` into dst (numel * dtype size bytes). Error naming the path, the tensor
  // and both dtypes / shapes when the stored ones differ from the expected ones, or on a read
  // failure.
  void read(const std::string& name, void* dst, StDType expected,
            const std::vector<int64_t>& expected_shape) const;
  // Reads whatever is stored (as info(name) describes it) into dst.
  void read_raw(const std::string& name, void* dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // 8 + N
  std::vector<StTensorInfo> tensors_;  // ascending begin
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace packbert
