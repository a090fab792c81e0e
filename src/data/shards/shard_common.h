// Internal to the shard reader and writer: RAII for HDF5 ids, the checked-call macro, the
// dataset names of the MLPerf/NVIDIA formats. Not part of the public interface (see shard.h).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>

#include "data/shards/shard.h"
#include "kernels/base/error.h"

namespace packbert::h5 {

// Dataset names as the MLPerf/NVIDIA BERT shards spell them.
inline constexpr const char* kInputIds = "input_ids";
inline constexpr const char* kInputMask = "input_mask";
inline constexpr const char* kSegmentIds = "segment_ids";
inline constexpr const char* kMaskedPositions = "masked_lm_positions";
inline constexpr const char* kMaskedIds = "masked_lm_ids";
inline constexpr const char* kNextSentenceLabels = "next_sentence_labels";

// Silences HDF5's automatic printing of its error stack for the calling thread (the
// thread-safe libhdf5 keeps that setting per thread); our checks report errors instead.
void init_thread();

// The innermost messages of the calling thread's current HDF5 error stack, e.g.
// "truncated file: eof = 1000, sblock->base_addr = 0, stored_eof = 4096".
std::string error_stack_summary();

[[noreturn]] void throw_call_failed(const std::string& context, const char* call, const char* file,
                                    int line);

// Owns one HDF5 id (file, dataset, dataspace, datatype, property list) and closes it on every
// path out of a scope. Never wrap predefined ids such as H5T_NATIVE_INT32.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes the id; returns the close call's status (negative on failure) so that close()
  // paths that must report failures (the writer's final flush) can check it.
  herr_t reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Returns r when the HDF5 call succeeded (r >= 0), else throws packbert::Error with the
// context (file / dataset), the call, HDF5's own message and file:line. The context is a
// callable so that its string is only built on failure.
template <typename T, typename Context>
T checked(T r, const char* call, const char* file, int line, const Context& context) {
  if (static_cast<int64_t>(r) < 0) throw_call_failed(context(), call, file, line);
  return r;
}

// ShardMeta as the root group's attributes (shard_meta.cpp): written when recorded; read back
// (recorded = false when the file has none), every attribute checked, errors naming it.
void write_shard_meta(hid_t file, const ShardMeta& meta, const std::string& path);
ShardMeta read_shard_meta(hid_t file, const std::string& path);

// A short human description of an HDF5 datatype: "int16", "uint32", "float32", "string",
// "vlen int16", "compound", ...
std::string describe_type(hid_t type);

}  // namespace packbert::h5

// PB_H5(H5Dread(...), "shard {}: dataset '{}'", path, name): checks an HDF5 call.
#define PB_H5(call, ...)                                                                           \
  ::packbert::h5::checked((call), #call, __FILE__, __LINE__,                                       \
                          [&]() { return ::fmt::format(__VA_ARGS__); })
