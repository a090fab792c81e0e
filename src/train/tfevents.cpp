#include "train/tfevents.h"

#include <array>
#include <cstring>

namespace packbert {
namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protocol buffer wire format: a varint is 7 bits a byte, low first, the high bit saying
// "more"; a field is varint(number << 3 | wire type) then its value (0: varint, 1: 8 bytes
// little-endian, 2: varint length then the bytes, 5: 4 bytes little-endian).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, int field, int wire) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}

void put_fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_double(std::string& out, int field, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 1);
  put_fixed(out, bits, 8);
}

void put_int(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  put_int(e, 2, step);
  return e;
}

// SummaryMetadata{plugin_data{plugin_name}}.
std::string plugin_metadata(const char* plugin) {
  std::string plugin_data, metadata;
  put_bytes(plugin_data, 1, plugin);
  put_bytes(metadata, 1, plugin_data);
  return metadata;
}

constexpr int kDtString = 7;  // tensorflow DataType

// Summary.Value{tag, metadata of `plugin`, tensor}.
std::string summary_value(const std::string& tag, const char* plugin, const std::string& tensor) {
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 9, plugin_metadata(plugin));
  put_bytes(v, 8, tensor);
  return v;
}

std::string summary_event(double wall_time, int64_t step, const std::string& summary) {
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

bool get_varint(const std::string& s, size_t& pos, size_t end, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && pos < end; shift += 7) {
    const auto b = static_cast<unsigned char>(s[pos++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// The step (field 2) of the Event in s[begin, end); 0 where it has none or does not parse.
int64_t event_step(const std::string& s, size_t begin, size_t end) {
  size_t pos = begin;
  while (pos < end) {
    uint64_t key = 0, v = 0;
    if (!get_varint(s, pos, end, key)) return 0;
    const uint64_t wire = key & 7;
    if (wire == 0) {
      if (!get_varint(s, pos, end, v)) return 0;
      if ((key >> 3) == 2) return static_cast<int64_t>(v);
    } else if (wire == 1 || wire == 5) {
      pos += wire == 1 ? 8 : 4;
    } else if (wire == 2) {
      if (!get_varint(s, pos, end, v) || v > end - pos) return 0;
      pos += v;
    } else {
      return 0;
    }
  }
  return 0;
}

uint64_t read_le(const std::string& s, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[pos + i])) << (8 * i);
  return v;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& data) {
  std::string r, length;
  put_fixed(length, data.size(), 8);
  r += length;
  put_fixed(r, masked_crc32c(length.data(), length.size()), 4);
  r += data;
  put_fixed(r, masked_crc32c(data.data(), data.size()), 4);
  return r;
}

std::string event_file_version(double wall_time) {
  std::string e = event_header(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string event_session_start(double wall_time, int64_t step) {
  std::string log, e = event_header(wall_time, step);
  put_int(log, 1, 1);  // SessionLog.status = START
  put_bytes(e, 7, log);
  return e;
}

std::string event_scalars(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    // Summary.Value{tag, simple_value (2, float)}.
    std::string v;
    put_bytes(v, 1, tag);
    const float f = static_cast<float>(value);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    put_key(v, 2, 5);
    put_fixed(v, bits, 4);
    put_bytes(summary, 1, v);
  }
  return summary_event(wall_time, step, summary);
}

std::string event_text(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text) {
  std::string tensor, shape, summary;
  put_int(tensor, 1, kDtString);
  put_bytes(tensor, 2, shape);
  put_bytes(tensor, 8, text);
  put_bytes(summary, 1, summary_value(tag, "text", tensor));
  return summary_event(wall_time, step, summary);
}

TfRecordScan scan_tfrecords(const std::string& bytes) {
  TfRecordScan scan;
  size_t pos = 0;
  while (bytes.size() - pos >= 12) {
    const uint64_t length = read_le(bytes, pos, 8);
    if (static_cast<uint32_t>(read_le(bytes, pos + 8, 4)) != masked_crc32c(&bytes[pos], 8)) break;
    if (length > bytes.size() - pos - 12 || bytes.size() - pos - 12 - length < 4) break;
    const size_t data = pos + 12;
    if (static_cast<uint32_t>(read_le(bytes, data + length, 4)) !=
        masked_crc32c(&bytes[data], length))
      break;
    pos = data + length + 4;
    scan.records.emplace_back(pos, event_step(bytes, data, data + length));
  }
  scan.complete_bytes = pos;
  return scan;
}

}  // namespace packbert
