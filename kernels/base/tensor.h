// Tensor views: a pointer, a dtype, a row-major shape of up to 4 dims and the device the memory
// lives on. A view never allocates or frees; buffers belong to arenas and flat parameter
// buffers (DESIGN.md, Memory), so the ops of kernels/backend.h take views only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/base/error.h"

namespace packbert {

// e4m3 / e5m2: the two FP8 formats (kernels/common/fp8_convert.h), storage of FP8 training only.
enum class DType : uint8_t { f32, bf16, f16, i32, i64, i8, u8, f64, e4m3, e5m2 };
inline bool is_fp8(DType t) { return t == DType::e4m3 || t == DType::e5m2; }
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* device_name(Device d);

// The dtype of a C++ element type (bf16/f16 have no portable C++ type and are named directly).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::i8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};

// A non-owning view of a dense row-major buffer. The default view (data == nullptr) means
// "none": ops use it for optional arguments.
struct Tensor {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};

  Tensor() = default;
  // Throws Error on more than kMaxDims dims or a negative extent.
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> dims, Device device = Device::cpu);

  bool defined() const { return data != nullptr; }
  int64_t dim(int i) const;  // throws Error when i is out of range
  int64_t numel() const;     // 1 for ndim == 0
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string str() const;  // "f32[4096, 768] cpu", or "none"

  // Typed pointer; PB_CHECK that T matches the dtype (a mismatch is a bug in the backend).
  template <typename T>
  T* ptr() const {
    PB_CHECK(dtype == DTypeOf<T>::value, "tensor {} read as {}", str(),
             dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(data);
  }
};

// A view of typed host or device memory: view(p, {rows, hidden}).
template <typename T>
Tensor view(T* data, std::initializer_list<int64_t> dims, Device device = Device::cpu) {
  return Tensor(static_cast<void*>(data), DTypeOf<T>::value, dims, device);
}
template <typename T>
Tensor view(const T* data, std::initializer_list<int64_t> dims, Device device = Device::cpu) {
  return view(const_cast<T*>(data), dims, device);
}

// Elements [offset, offset + size) of a flat (1-D or contiguous) view, as a 1-D view of the same
// dtype and device; the "none" view stays "none".
Tensor slice(const Tensor& flat, int64_t offset, int64_t size);

// Contract checks for ops. Each throws packbert::Error naming the op and the argument:
//   "linear_forward: w is f32[768, 512] cpu, expected f32[3072, 768]".
// In `dims`, -1 matches any extent.
constexpr int64_t kAnyDim = -1;
void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> dims);
// Same, but a "none" view passes (optional arguments).
void check_optional(const char* op, const char* name, const Tensor& t, DType dtype,
                    std::initializer_list<int64_t> dims);
void check_device(const char* op, const char* name, const Tensor& t, Device device);

}  // namespace packbert
