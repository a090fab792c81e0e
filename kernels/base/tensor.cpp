#include "kernels/base/tensor.h"

namespace packbert {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::f64: return 8;
    case DType::e4m3: return 1;
    case DType::e5m2: return 1;
  }
  PB_CHECK(false, "unknown dtype {}", static_cast<int>(t));
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::f64: return "f64";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

Tensor::Tensor(void* data_, DType dtype_, std::initializer_list<int64_t> dims, Device device_)
    : data(data_), dtype(dtype_), device(device_) {
  PB_REQUIRE(static_cast<int>(dims.size()) <= kMaxDims, "tensor view with {} dims (at most {})",
             dims.size(), kMaxDims);
  for (int64_t d : dims) {
    PB_REQUIRE(d >= 0, "tensor view with negative extent {}", d);
    shape[ndim++] = d;
  }
}

int64_t Tensor::dim(int i) const {
  PB_REQUIRE(i >= 0 && i < ndim, "dim {} of {}", i, str());
  return shape[i];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

std::string Tensor::str() const {
  if (!defined()) return "none";
  std::string s = fmt::format("{}[", dtype_name(dtype));
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "] " + device_name(device);
}

namespace {

std::string expected_str(DType dtype, std::initializer_list<int64_t> dims) {
  std::string s = fmt::format("{}[", dtype_name(dtype));
  int i = 0;
  for (int64_t d : dims)
    s += fmt::format("{}{}", i++ ? ", " : "", d == kAnyDim ? "*" : fmt::format("{}", d));
  return s + "]";
}

bool matches(const Tensor& t, DType dtype, std::initializer_list<int64_t> dims) {
  if (t.dtype != dtype || t.ndim != static_cast<int>(dims.size())) return false;
  int i = 0;
  for (int64_t d : dims) {
    if (d != kAnyDim && t.shape[i] != d) return false;
    ++i;
  }
  return true;
}

}  // namespace

void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> dims) {
  PB_REQUIRE(t.defined(), "{}: {} is missing, expected {}", op, name, expected_str(dtype, dims));
  PB_REQUIRE(matches(t, dtype, dims), "{}: {} is {}, expected {}", op, name, t.str(),
             expected_str(dtype, dims));
}

void check_optional(const char* op, const char* name, const Tensor& t, DType dtype,
                    std::initializer_list<int64_t> dims) {
  if (t.defined()) check_tensor(op, name, t, dtype, dims);
}

void check_device(const char* op, const char* name, const Tensor& t, Device device) {
  PB_REQUIRE(!t.defined() || t.device == device, "{}: {} is on {}, the backend runs on {}", op,
             name, device_name(t.device), device_name(device));
}

Tensor slice(const Tensor& flat, int64_t offset, int64_t size) {
  if (!flat.defined()) return flat;
  const auto elem = static_cast<int64_t>(dtype_size(flat.dtype));
  return Tensor(static_cast<char*>(flat.data) + offset * elem, flat.dtype, {size}, flat.device);
}

}  // namespace packbert
