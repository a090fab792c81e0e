// TensorBoard event files, the few parts the trainer writes (docs/tensorboard.md): TFRecord
// framing with masked CRC32C, and the Event protocol buffers encoded field by field.
//
// A record is: uint64 length (little-endian), uint32 masked_crc32c(length bytes), the data,
// uint32 masked_crc32c(data). The data is an Event (tensorboard/compat/proto/event.proto):
//   wall_time (1, double), step (2, int64), file_version (3, string), summary (5),
//   session_log (7: status (1) = START).
// A scalar is a Summary.Value's simple_value, a float: TensorBoard's scalars are float32 (its
// default loader drops double tensors), so each is the given double rounded to the nearest
// float. A text is a DT_STRING scalar tensor with the "text" plugin's metadata.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace packbert {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), and TFRecord's mask of it:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// The framed record of `data`.
std::string tfrecord(const std::string& data);

// Event messages, encoded.
std::string event_file_version(double wall_time);  // file_version "brain.Event:2"
std::string event_session_start(double wall_time, int64_t step);
std::string event_scalars(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars);
std::string event_text(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text);

// The complete records at the start of `bytes` (a file's contents): for each, its end offset
// and its Event's step (0 where the event has none). Stops at the first record that is cut
// short or fails a CRC, and says where in `complete_bytes` (the end of the last good one).
struct TfRecordScan {
  std::vector<std::pair<size_t, int64_t>> records;  // (end offset, step)
  size_t complete_bytes = 0;
};
TfRecordScan scan_tfrecords(const std::string& bytes);

}  // namespace packbert
