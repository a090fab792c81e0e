// Internal to the shard reader: checks of file structures that libhdf5 1.10 trusts, made before
// libhdf5 reads them, so that a damaged shard is a packbert::Error instead of a crash or hang.
//
// Fuzzing (tests/fuzz/test_shard_fuzz.cpp) found these libhdf5 failures on damaged files:
//  - vlen rows (varlength shards): a damaged reference (sequence length, heap collection
//    address, object index) or global heap collection makes H5Dread segfault in H5HG_read
//    (object index past the collection's table, object size past the collection), loop forever
//    parsing the collection (a free-space entry of size 0), or copy an object larger than the
//    row into a buffer sized for the row (a heap overflow once the object exceeds the buffer's
//    4 KiB rounding). VlenHeapCheck covers these.
//  - a chunked layout message with fewer dimensions than the dataspace needs, or (message
//    versions 1-2, which libhdf5 does not check) a chunk dimension of 0, makes H5Dopen2 divide
//    by zero (SIGFPE in H5D__chunk_set_info); one whose element size differs from the
//    datatype's makes H5Dread copy past its buffers. check_chunk_layout covers these.
//  - a compact layout message whose stored data is smaller than the dataset, or chunk
//    dimensions beyond the dataset's fixed maximum dimensions, make H5Dread copy past its
//    buffers (SIGSEGV in H5VM_memcpyvv). check_storage covers these.
//  - a metadata address of all ones (HADDR_UNDEF) crashes libhdf5's metadata accumulator;
//    the reader's file driver (shard_vfd.h) covers that.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/shards/shard_common.h"

namespace packbert::h5 {

// The shard file read directly (POSIX pread), with the HDF5 file's address/length sizes and
// base address, for parsing structures before libhdf5 does.
class RawFile {
 public:
  RawFile(const std::string& path, hid_t file);
  ~RawFile();
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;

  // Reads bytes at an HDF5 address; false when they are not all inside the file.
  bool read(uint64_t address, void* dst, size_t bytes) const;
  // Bytes from address to the end of the file (0 when the address is past it).
  uint64_t bytes_after(uint64_t address) const;
  unsigned address_size() const { return address_size_; }
  unsigned length_size() const { return length_size_; }
  uint64_t file_size() const { return file_size_; }

 private:
  int fd_ = -1;        // our own descriptor: reading through libhdf5 is what we guard
  uint64_t base_ = 0;  // file offset of address 0 (the user block size)
  uint64_t file_size_ = 0;
  unsigned address_size_ = 8, length_size_ = 8;
};

// Little-endian unsigned integer of `bytes` bytes (HDF5's on-disk byte order for metadata).
uint64_t decode_le(const unsigned char* p, unsigned bytes);

// Throws packbert::Error (naming the file and dataset) when the chunked layout message of the
// dataset `name` does not fit its dataspace and datatype messages: dimension count, a 0
// dimension, element size. Call before H5Dopen2. Object headers other than version 1 (the
// format every BERT shard tool writes) are left to libhdf5.
void check_chunk_layout(const RawFile& raw, const std::string& path, hid_t file, const char* name);

// Throws packbert::Error when an open dataset's storage does not fit its extent in ways
// libhdf5 1.10 does not check on read: compact storage smaller than the data (SIGSEGV in
// H5VM_memcpyvv), a chunk dimension of 0 or beyond a fixed maximum dimension (reads past the
// chunk). element_bytes: size of one element in the file.
void check_storage(const std::string& path, hid_t dataset, hid_t file_space, const char* name,
                   uint64_t element_bytes);

// Checks the references of variable-length rows before libhdf5 follows them: fetches them
// raw (a no-op HDF5 conversion to an opaque type exposes them for any storage layout, filters
// included), parses every referenced heap collection from the file with bounds checks, and
// compares each object's size with its row's length.
class VlenHeapCheck {
 public:
  VlenHeapCheck(const std::string& path, const RawFile& raw);

  // Checks the rows selected in file_space (first_row .. first_row + count - 1 of dataset,
  // laid out in mem_space); base_bytes: size of one element in the file. Throws
  // packbert::Error naming the file, the dataset and the sample of a damaged reference.
  void check_rows(hid_t dataset, hid_t file_space, hid_t mem_space, const char* name,
                  size_t base_bytes, int64_t first_row, int64_t count);

 private:
  // Object sizes of one parsed collection, by object index (-1: no such object).
  using Collection = std::vector<int64_t>;
  const Collection& collection_at(uint64_t address, const char* name, int64_t row);
  [[noreturn]] void fail(const char* name, int64_t row, const std::string& what) const;

  std::string path_;
  const RawFile& raw_;
  Handle reference_type_;  // opaque, the size of one reference on disk
  std::vector<unsigned char> references_;
  std::unordered_map<uint64_t, Collection> collections_;
  std::vector<unsigned char> collection_bytes_;
};

}  // namespace packbert::h5
