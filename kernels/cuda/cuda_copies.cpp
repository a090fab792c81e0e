// CudaBackend's memory ops and host copies: zero, write_floats, copy, and upload / prefetch /
// read through pinned staging buffers of the backend's own (cuda_backend_impl.h, UploadStaging).
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_backend_impl.h"

namespace packbert {

// ---- zero / copy -----------------------------------------------------------------------------
void CudaBackend::zero(const Tensor& t) {
  const trace::Range range("zero");
  const char* op = "zero";
  PB_REQUIRE(t.defined(), "zero: t is missing");
  check_device(op, "t", t, Device::cuda);
  check_pointer(op, "t", t);
  begin(op);
  if (t.bytes()) PB_CUDA_OP(op, cuda::memset_async(t.data, 0, t.bytes(), stream_));
  end(op);
}

void CudaBackend::write_floats(const Tensor& dst, const float* values, int n) {
  const trace::Range range("write_floats");
  const char* op = "write_floats";
  PB_REQUIRE(n >= 0 && n <= 8 && dst.dtype == DType::f32 && dst.numel() == n,
             "{}: {} values into {}", op, n, dst.str());
  check_device(op, "dst", dst, Device::cuda);
  check_pointer(op, "dst", dst);
  if (n == 0) return;
  cuda::FloatArgs a{};
  std::copy(values, values + n, a.v);
  begin(op);
  launched(op, op, cuda::write_floats(dst.ptr<float>(), a, n, stream_));
  end(op);
}

void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  const trace::Range range("copy");
  const char* op = "copy";
  PB_REQUIRE(dst.defined() && src.defined(), "copy: dst {} / src {} missing", dst.str(), src.str());
  PB_REQUIRE(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: dst {} and src {} differ",
             dst.str(), src.str());
  check_pointer(op, "dst", dst);
  check_pointer(op, "src", src);
  if (dst.device == src.device) {
    const auto* s = static_cast<const char*>(src.data);
    const auto* d = static_cast<const char*>(dst.data);
    PB_REQUIRE(d + dst.bytes() <= s || s + src.bytes() <= d, "copy: dst and src overlap");
  }
  if (src.bytes() == 0) return;
  if (dst.device == Device::cpu && src.device == Device::cpu) {
    std::memcpy(dst.data, src.data, src.bytes());
    return;
  }
  // Small copies with a host side (the per-step ones: scalars, loss sums) go through pinned
  // memory of the backend's: an upload is staged and asynchronous (upload()), a read-back one
  // copy into pinned memory and one wait. Large ones (weights, checkpoints) go directly: they
  // are rare, and pinned buffers of their size would be a waste.
  const size_t bytes = src.bytes();
  if (src.device == Device::cpu && dst.device == Device::cuda && bytes <= kStagedCopyBytes) {
    upload({{dst, src.data}});
    return;
  }
  if (dst.device == Device::cpu && src.device == Device::cuda && bytes <= kStagedCopyBytes) {
    read({{dst.data, src}});
    return;
  }
  begin(op);
  PB_CUDA_OP(op, cuda::memcpy_async(dst.data, src.data, bytes, cudaMemcpyDefault, stream_));
  // With host memory on either side the copy is complete when copy() returns: a read-back is
  // on the host, and the caller may reuse an uploaded host buffer at once.
  if (dst.device == Device::cpu || src.device == Device::cpu)
    PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
  end(op);
}

// The batch's arrays: each into the next staging buffer (pinned), then copied by the stream.
// The host waits only when that buffer's previous copies, issued two uploads ago, have not run
// yet (a query first: on a device that keeps up they have, and nothing waits).
void CudaBackend::upload(const std::vector<HostUpload>& copies) {
  const trace::Range range("upload");
  stage_and_copy("upload", copies, stream_);
  end("upload");
}

// The same staging, copied on copy_stream_: after the ops issued before the previous
// prefetch() (the event recorded then), before the ops issued after this one (stream_ waits for
// the copies' event). No host wait beyond the staging buffer's, as upload().
void CudaBackend::prefetch(const std::vector<HostUpload>& copies) {
  const trace::Range range("prefetch");
  const char* op = "prefetch";
  begin(op);
  if (prefetch_recorded_) PB_CUDA_OP(op, cudaStreamWaitEvent(copy_stream_, prefetch_issued_, 0));
  PB_CUDA_OP(op, cudaEventRecord(prefetch_issued_, stream_));
  prefetch_recorded_ = true;
  if (cudaEvent_t copied = stage_and_copy(op, copies, copy_stream_))
    PB_CUDA_OP(op, cudaStreamWaitEvent(stream_, copied, 0));
  end(op);
}

cudaEvent_t CudaBackend::stage_and_copy(const char* op, const std::vector<HostUpload>& copies,
                                        cudaStream_t on) {
  constexpr size_t kAlign = 256;
  size_t total = 0;
  for (const HostUpload& c : copies) {
    PB_REQUIRE(c.dst.defined(), "{}: a destination is missing", op);
    PB_REQUIRE(c.src != nullptr || c.dst.bytes() == 0, "{}: no host source for {}", op,
               c.dst.str());
    check_device(op, "dst", c.dst, Device::cuda);
    check_pointer(op, "dst", c.dst);
    total += (c.dst.bytes() + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return nullptr;
  begin(op);
  UploadStaging& s = upload_staging_[static_cast<size_t>(next_upload_)];
  next_upload_ = 1 - next_upload_;
  if (s.pending) {
    const cudaError_t q = cudaEventQuery(s.done);
    if (q == cudaErrorNotReady)
      PB_CUDA_OP(op, cuda::event_synchronize(s.done));
    else
      PB_CUDA_OP(op, q);
    s.pending = false;
  }
  if (total > s.bytes) {  // the first uploads, and a batch larger than any before
    PB_CUDA_OP(op, cuda::host_free(s.data));
    s.data = nullptr;
    s.bytes = 0;
    const size_t bytes = total + total / 4;
    PB_CUDA_OP(op, cudaMallocHost(&s.data, bytes));
    s.bytes = bytes;
  }
  if (!s.done) PB_CUDA_OP(op, cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  auto* staged = static_cast<char*>(s.data);
  for (const HostUpload& c : copies) {
    const size_t n = c.dst.bytes();
    if (n == 0) continue;
    std::memcpy(staged, c.src, n);
    PB_CUDA_OP(op, cuda::memcpy_async(c.dst.data, staged, n, cudaMemcpyHostToDevice, on));
    staged += (n + kAlign - 1) / kAlign * kAlign;
  }
  PB_CUDA_OP(op, cudaEventRecord(s.done, on));
  s.pending = true;
  return s.done;
}

// Every source into the pinned read-back buffer, one wait, then out to the destinations. More
// than the buffer holds: copy() each (large read-backs are rare: weights, checkpoints).
void CudaBackend::read(const std::vector<HostRead>& reads) {
  const trace::Range range("read");
  const char* op = "read";
  constexpr size_t kAlign = 256;
  size_t total = 0;
  for (const HostRead& r : reads) {
    PB_REQUIRE(r.src.defined() && (r.dst != nullptr || r.src.bytes() == 0),
               "{}: a source or a host destination is missing", op);
    check_device(op, "src", r.src, Device::cuda);
    check_pointer(op, "src", r.src);
    total += (r.src.bytes() + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return;
  if (total > kStagedCopyBytes) {
    for (const HostRead& r : reads) {
      if (r.src.bytes() == 0) continue;
      begin(op);
      PB_CUDA_OP(op, cuda::memcpy_async(r.dst, r.src.data, r.src.bytes(), cudaMemcpyDeviceToHost,
                                        stream_));
      PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
    }
    end(op);
    return;
  }
  begin(op);
  if (!download_) {
    PB_CUDA_OP(op, cudaMallocHost(&download_, kStagedCopyBytes));
  }
  auto* staged = static_cast<char*>(download_);
  for (const HostRead& r : reads) {
    const size_t n = r.src.bytes();
    if (n == 0) continue;
    PB_CUDA_OP(op, cuda::memcpy_async(staged, r.src.data, n, cudaMemcpyDeviceToHost, stream_));
    staged += (n + kAlign - 1) / kAlign * kAlign;
  }
  PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
  staged = static_cast<char*>(download_);
  for (const HostRead& r : reads) {
    const size_t n = r.src.bytes();
    if (n == 0) continue;
    std::memcpy(r.dst, staged, n);
    staged += (n + kAlign - 1) / kAlign * kAlign;
  }
  end(op);
}

}  // namespace packbert
