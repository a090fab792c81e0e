// The backend-independent parts of backend.h: BackendBuffer and Backend::alloc.
#include "kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "kernels/base/error.h"

namespace packbert {

BackendBuffer::BackendBuffer(Backend* owner, void* data, size_t bytes, const Tensor& view)
    : owner_(owner), bytes_(bytes), view_(view) {
  if (!view_.defined() && data)
    view_ = Tensor(data, DType::u8, {static_cast<int64_t>(bytes)},
                   owner ? owner->device() : Device::cpu);
  PB_CHECK(view_.data == data && view_.bytes() <= bytes, "buffer view {} of {} bytes", view_.str(),
           bytes);
}

BackendBuffer& BackendBuffer::operator=(BackendBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    view_ = std::exchange(o.view_, Tensor());
  }
  return *this;
}

void BackendBuffer::reset() {
  if (owner_ && view_.data) {
    owner_->free_memory(view_.data);
    owner_->allocated_bytes_ -= std::min(owner_->allocated_bytes_, bytes_);
  }
  owner_ = nullptr;
  bytes_ = 0;
  view_ = Tensor();
}

BackendGraph& BackendGraph::operator=(BackendGraph&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

void BackendGraph::reset() {
  if (owner_ && handle_) owner_->destroy_graph(handle_);
  owner_ = nullptr;
  handle_ = nullptr;
}

void Backend::begin_capture() { PB_THROW("{}: this backend records no graphs", name()); }
BackendGraph Backend::end_capture() { PB_THROW("{}: this backend records no graphs", name()); }
void Backend::replay(const BackendGraph&) {
  PB_THROW("{}: this backend records no graphs", name());
}
void Backend::destroy_graph(void*) noexcept {}

BackendGraph Backend::record_and_replay(const std::function<void()>& ops) {
  begin_capture();
  try {
    ops();
  } catch (...) {
    (void)end_capture();  // ends the capture; the graph is discarded
    throw;
  }
  BackendGraph graph = end_capture();
  replay(graph);
  return graph;
}

void Backend::write_floats(const Tensor& dst, const float* values, int n) {
  PB_REQUIRE(n >= 0 && n <= 8 && dst.dtype == DType::f32 && dst.numel() == n,
             "write_floats: {} values into {}", n, dst.str());
  copy(dst, Tensor(const_cast<float*>(values), DType::f32, {n}, Device::cpu));
}

LambStepScalars lamb_step_scalars(const LambConfig& c) {
  LambStepScalars s;
  s.lr = c.lr;
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), c.step));
  s.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), c.step));
  s.grad_scale = c.grad_scale;
  return s;
}

Tensor BackendBuffer::tensor(DType dtype, std::initializer_list<int64_t> dims) const {
  const Tensor t(view_.data, dtype, dims, view_.device);
  PB_REQUIRE(t.bytes() <= bytes_, "buffer of {} bytes viewed as {}", bytes_, t.str());
  return t;
}

void Backend::upload(const std::vector<HostUpload>& copies) {
  for (const HostUpload& c : copies) {
    PB_REQUIRE(c.src != nullptr || c.dst.bytes() == 0, "upload: no host source for {}",
               c.dst.str());
    if (c.dst.bytes() == 0) continue;
    copy(c.dst, Tensor(const_cast<void*>(c.src), c.dst.dtype, {c.dst.numel()}, Device::cpu));
  }
}

void Backend::read(const std::vector<HostRead>& reads) {
  for (const HostRead& r : reads) {
    PB_REQUIRE(r.dst != nullptr || r.src.bytes() == 0, "read: no host destination for {}",
               r.src.str());
    if (r.src.bytes() == 0) continue;
    copy(Tensor(r.dst, r.src.dtype, {r.src.numel()}, Device::cpu), r.src);
  }
}

Backend::MemoryInfo Backend::memory_info() const {
  MemoryInfo m;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") m.total = static_cast<size_t>(kib) << 10;
    if (key == "MemAvailable:") m.free = static_cast<size_t>(kib) << 10;
  }
  return m;
}

std::string Backend::planned_note() const {
  if (planned_bytes_ == 0) return {};
  return fmt::format(" (the plan: {:.1f} MiB; packbert plan)",
                     static_cast<double>(planned_bytes_) / (1 << 20));
}

void* Backend::allocate_named(size_t bytes, const char* what) {
  void* p = nullptr;
  try {
    p = allocate_memory(bytes);
  } catch (const Error& e) {
    const MemoryInfo m = memory_info();
    PB_THROW(
        "out of {} memory: {} asked {} bytes ({:.1f} MiB), {:.1f} MiB free of {:.1f} MiB, "
        "{:.1f} MiB held by this process's buffers{} ({})",
        device_name(device()), what, bytes, static_cast<double>(bytes) / (1 << 20),
        static_cast<double>(m.free) / (1 << 20), static_cast<double>(m.total) / (1 << 20),
        static_cast<double>(allocated_bytes_) / (1 << 20), planned_note(), e.what());
  }
  allocated_bytes_ += bytes;
  return p;
}

BackendBuffer Backend::alloc(size_t bytes, const char* what) {
  // At least one byte, so that even an empty buffer's view is defined (not "none").
  const size_t n = std::max<size_t>(bytes, 1);
  return BackendBuffer(this, allocate_named(n, what), n);
}

BackendBuffer Backend::alloc(DType dtype, std::initializer_list<int64_t> dims, const char* what) {
  const Tensor shape(nullptr, dtype, dims, device());
  const size_t n = std::max<size_t>(shape.bytes(), 1);
  void* p = allocate_named(n, what);
  return BackendBuffer(this, p, n, Tensor(p, dtype, dims, device()));
}

void Backend::lamb_step(const Tensor& table, const LambConfig& config,
                        const Tensor& global_grad_norm, const Tensor& params, const Tensor& grads,
                        const Tensor& m, const Tensor& v, const Tensor& norms_ws,
                        const Tensor& params_lowp, const Tensor& record) {
  PB_REQUIRE(table.defined() && table.ndim == 2, "lamb_step: table is {}, expected i64 [T, 3]",
             table.str());
  const BackendBuffer sums = alloc(DType::f64, {table.dim(0), 2});
  lamb_update(table, config, global_grad_norm, params, grads, m, v, sums.tensor(), record);
  lamb_apply(table, config, global_grad_norm, sums.tensor(), params, grads, params_lowp, norms_ws);
  synchronize();  // nothing in flight may read the sums when they go
}

}  // namespace packbert
