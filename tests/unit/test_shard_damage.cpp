// Damage that makes libhdf5 1.10 itself crash, hang or overflow a buffer (found by
// tests/fuzz/test_shard_fuzz.cpp), one test per class: each must be a packbert::Error naming
// the file and dataset. Each read runs in a forked child, so a regression is a reported
// failure, not the end of this binary. The comment on each test says what libhdf5 does with
// the file when the reader's guards (src/data/shards/shard_guard.h, src/data/shards/shard_vfd.h)
// are off.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <fstream>
#include <random>

#include "data/shards/shard.h"
#include "shard_fork_read.h"
#include "shard_test_util.h"
#include "test_util.h"

namespace packbert {
namespace {

using test::Outcome;
using test::read_in_child;

constexpr int kLen = 32, kPred = 5, kRows = 40;

struct VlenReference {
  uint64_t file_offset = 0;  // where the 16-byte reference of the row is stored
  uint32_t length = 0;       // elements in the row
  uint64_t heap_address = 0;
  uint32_t object_index = 0;
};

uint64_t read_le(const std::string& bytes, uint64_t at, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; ++i)
    v |= uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  return v;
}

void write_le(std::string& bytes, uint64_t at, unsigned n, uint64_t v) {
  for (unsigned i = 0; i < n; ++i) bytes[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// The stored reference of row `row` of a chunked, unfiltered vlen dataset written by ShardWriter.
VlenReference reference_of(const std::string& path, const std::string& bytes, const char* name,
                           hsize_t row) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
  const hid_t dcpl = H5Dget_create_plist(ds);
  hsize_t chunk_rows = 0;
  H5Pget_chunk(dcpl, 1, &chunk_rows);
  const hsize_t chunk_start = row / chunk_rows * chunk_rows;
  unsigned filter_mask = 0;
  haddr_t chunk_address = 0;
  hsize_t chunk_bytes = 0;
  H5Dget_chunk_info_by_coord(ds, &chunk_start, &filter_mask, &chunk_address, &chunk_bytes);
  H5Pclose(dcpl);
  H5Dclose(ds);
  H5Fclose(file);
  VlenReference r;
  r.file_offset = chunk_address + (row - chunk_start) * 16;
  r.length = static_cast<uint32_t>(read_le(bytes, r.file_offset, 4));
  r.heap_address = read_le(bytes, r.file_offset + 4, 8);
  r.object_index = static_cast<uint32_t>(read_le(bytes, r.file_offset + 12, 4));
  return r;
}

// File offset of the header (index, refs, reserved, size) of object `index` in the collection
// at `address`, or of its free-space entry for index 0; 0 when there is none.
uint64_t object_header_at(const std::string& bytes, uint64_t address, uint32_t index) {
  const uint64_t size = read_le(bytes, address + 8, 8);
  for (uint64_t p = 16; p + 16 <= size;) {
    const uint64_t idx = read_le(bytes, address + p, 2);
    const uint64_t object_size = read_le(bytes, address + p + 8, 8);
    if (idx == index) return address + p;
    p += idx > 0 ? 16 + ((object_size + 7) & ~uint64_t{7}) : object_size;
  }
  return 0;
}

// File offset of the body of the first message of `type` in the version 1 object header at
// `header` (first header block only, which holds everything in the files ShardWriter writes);
// 0 when there is none.
uint64_t message_body(const std::string& bytes, uint64_t header, unsigned type) {
  const uint64_t messages = read_le(bytes, header + 2, 2), block = read_le(bytes, header + 8, 4);
  uint64_t p = header + 16;
  for (uint64_t m = 0; m < messages && p + 8 <= header + 16 + block; ++m) {
    const uint64_t size = read_le(bytes, p + 2, 2);
    if (read_le(bytes, p, 2) == type) return p + 8;
    p += 8 + size;
  }
  return 0;
}

// Object header address of `name` ("/" for the root group).
uint64_t header_of(const std::string& path, const char* name) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  H5O_info_t info{};
  const hid_t object = H5Oopen(file, name, H5P_DEFAULT);
  H5Oget_info2(object, &info, H5O_INFO_BASIC);
  H5Oclose(object);
  H5Fclose(file);
  return info.addr;
}

class ShardDamage : public ::testing::Test {
 protected:
  void write(ShardFormat format) {
    path_ = dir_.file(std::string(to_string(format)) + ".h5");
    ShardWriteOptions opts;
    opts.format = format;
    opts.max_seq_len = kLen;
    opts.max_predictions = kPred;
    opts.chunk_samples = 16;
    write_shard(path_, test::random_samples(rng_, kRows, kLen, kPred), opts);
    bytes_ = test::read_file(path_);
  }
  // Writes the damaged bytes and expects a packbert::Error mentioning every part.
  void expect_rejected(const std::vector<std::string>& parts) {
    const std::string damaged = dir_.file("damaged.h5");
    std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bytes_;
    std::string message;
    const Outcome outcome = read_in_child(damaged, &message);
    ASSERT_EQ(outcome, Outcome::rejected) << to_string(outcome) << ": " << message;
    for (const std::string& p : parts)
      EXPECT_NE(message.find(p), std::string::npos) << "lacks '" << p << "': " << message;
  }

  std::mt19937_64 rng_{test::test_seed()};
  test::TempDir dir_;
  std::string path_, bytes_;
};

// ---- variable-length rows: references and global heap collections ------------------------

class ShardHeapDamage : public ShardDamage {
 protected:
  ShardHeapDamage() {
    write(ShardFormat::var_length);
    row_ = std::uniform_int_distribution<hsize_t>(0, kRows - 1)(rng_);
    ref_ = reference_of(path_, bytes_, "input_ids", row_);
  }
  hsize_t row_ = 0;
  VlenReference ref_;
};

// libhdf5: reads the collection's object table past its end in H5HG_read: SIGSEGV, or whatever
// lies there comes back as the row (what this test's file does without the check).
TEST_F(ShardHeapDamage, ObjectIndexBeyondTheCollection) {
  write_le(bytes_, ref_.file_offset + 12, 4, 60000);
  expect_rejected({"dataset 'input_ids', sample " + std::to_string(row_) + ":",
                   "object 60000 is not in the heap collection"});
}

// libhdf5: SIGSEGV in memcpy from H5HG_read (copies past the collection).
TEST_F(ShardHeapDamage, ObjectSizeBeyondTheCollection) {
  const uint64_t header = object_header_at(bytes_, ref_.heap_address, ref_.object_index);
  ASSERT_NE(header, 0u);
  write_le(bytes_, header + 8, 8, uint64_t{1} << 40);
  // Collections are shared by the datasets' rows in write order, so the first row to reach
  // this one may belong to another dataset, in an earlier window.
  expect_rejected({"damaged variable-length data",
                   "has size 1099511627776, which does not fit "
                   "the collection's"});
}

// libhdf5: endless loop while parsing the collection (a free-space entry of size 0).
TEST_F(ShardHeapDamage, FreeSpaceOfSizeZero) {
  // Some collection referenced by a row has free space; the last one written always does.
  uint64_t free_entry = 0;
  for (int64_t row = kRows - 1; row >= 0 && free_entry == 0; --row) {
    for (const char* name : {"masked_lm_ids", "masked_lm_positions", "segment_ids", "input_ids"}) {
      const VlenReference r = reference_of(path_, bytes_, name, static_cast<hsize_t>(row));
      if (r.heap_address == 0) continue;
      if ((free_entry = object_header_at(bytes_, r.heap_address, 0)) != 0) break;
    }
  }
  ASSERT_NE(free_entry, 0u) << "no collection with free space";
  write_le(bytes_, free_entry + 8, 8, 0);
  expect_rejected({"damaged variable-length data", "object 0", "has size 0"});
}

// libhdf5: copies the whole object into a conversion buffer sized from the claimed length
// (rounded up to 4 KiB): a longer object overflows the heap, a shorter one comes back as a
// silently truncated row (here the sample rules happen to notice; the check says why).
TEST_F(ShardHeapDamage, RowShorterThanItsObject) {
  write_le(bytes_, ref_.file_offset, 4, ref_.length - 1);
  expect_rejected({"dataset 'input_ids', sample " + std::to_string(row_) + ":",
                   fmt::format("claims {} elements of 2 bytes but its heap object holds {} bytes",
                               ref_.length - 1, 2 * ref_.length)});
}

// ---- object headers and the root group --------------------------------------------------

constexpr unsigned kLayoutMessage = 0x0008, kSymbolTableMessage = 0x0011;

// libhdf5: divides by zero in H5Dopen2 (SIGFPE in H5D__chunk_set_info): it sizes its chunk
// arithmetic by the dataspace's rank and takes the chunk dimensions from the layout.
TEST_F(ShardDamage, ChunkLayoutRankBelowTheDataspace) {
  for (const ShardFormat format : {ShardFormat::fixed, ShardFormat::var_length}) {
    SCOPED_TRACE(to_string(format));
    write(format);
    const uint64_t layout = message_body(bytes_, header_of(path_, "segment_ids"), kLayoutMessage);
    ASSERT_NE(layout, 0u);
    ASSERT_EQ(bytes_[layout], 3) << "layout message version";
    bytes_[layout + 2] = 0;  // version, class, rank: no dimensions at all
    expect_rejected({"dataset 'segment_ids'", "its chunked layout has 0 dimensions"});
  }
}

// libhdf5: a version 1 layout message is decoded without its check for zero dimensions, so a
// flipped version byte (3 -> 1) reinterprets the message and divides by zero (SIGFPE).
TEST_F(ShardDamage, ChunkLayoutVersionFlipped) {
  write(ShardFormat::var_length);
  const uint64_t layout =
      message_body(bytes_, header_of(path_, "masked_lm_positions"), kLayoutMessage);
  ASSERT_NE(layout, 0u);
  bytes_[layout] = 1;
  expect_rejected({"dataset 'masked_lm_positions'"});
}

// libhdf5: reads past the chunk it allocated (SIGSEGV in H5VM_memcpyvv).
TEST_F(ShardDamage, ChunkDimensionBeyondTheDataset) {
  write(ShardFormat::fixed);
  const uint64_t layout = message_body(bytes_, header_of(path_, "input_mask"), kLayoutMessage);
  ASSERT_NE(layout, 0u);
  write_le(bytes_, layout + 3 + 8 + 4, 4, 57888);
  expect_rejected({"dataset 'input_mask'", "chunk dimension 1 is 57888, outside 1 .. 32"});
}

// libhdf5: an all-ones (undefined) address of the root group's local heap or B-tree passes its
// end-of-file check and crashes its metadata accumulator (SIGSEGV in H5F__accum_read).
TEST_F(ShardDamage, UndefinedRootGroupAddresses) {
  for (const ShardFormat format : {ShardFormat::fixed, ShardFormat::var_length}) {
    for (const int which : {0, 1}) {  // the B-tree address, then the local heap address
      SCOPED_TRACE(std::string(to_string(format)) + (which ? " heap" : " B-tree"));
      write(format);
      const uint64_t table = message_body(bytes_, header_of(path_, "/"), kSymbolTableMessage);
      ASSERT_NE(table, 0u);
      write_le(bytes_, table + 8 * which, 8, ~uint64_t{0});
      expect_rejected({"undefined address"});
    }
  }
}

}  // namespace
}  // namespace packbert
