// Checks of structures libhdf5 1.10 trusts (see shard_guard.h). The on-disk layouts parsed
// here follow the HDF5 file format specification: version 1 object headers, layout messages
// versions 1-3, version 1 global heap collections, vlen references (4-byte length, heap
// address, 4-byte object index); little-endian, with the file's own address/length sizes.
#include "data/shards/shard_guard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <mutex>

namespace packbert::h5 {

uint64_t decode_le(const unsigned char* p, unsigned bytes) {
  uint64_t v = 0;
  for (unsigned i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// ---- RawFile ------------------------------------------------------------------------------

RawFile::RawFile(const std::string& path, hid_t file) {
  Handle fcpl(PB_H5(H5Fget_create_plist(file), "shard {}", path));
  size_t address_size = 0, length_size = 0;
  PB_H5(H5Pget_sizes(fcpl.get(), &address_size, &length_size), "shard {}", path);
  hsize_t user_block = 0;
  PB_H5(H5Pget_userblock(fcpl.get(), &user_block), "shard {}", path);
  auto valid_width = [](size_t w) { return w == 2 || w == 4 || w == 8; };
  PB_REQUIRE(valid_width(address_size) && valid_width(length_size),
             "shard {}: unsupported address/length sizes {}/{} bytes", path, address_size,
             length_size);
  address_size_ = static_cast<unsigned>(address_size);
  length_size_ = static_cast<unsigned>(length_size);
  base_ = user_block;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) PB_THROW("shard {}: cannot open the file: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    PB_THROW("shard {}: cannot stat the file: {}", path, std::strerror(err));
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
}

RawFile::~RawFile() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t RawFile::bytes_after(uint64_t address) const {
  if (base_ > file_size_ || address >= file_size_ - base_) return 0;
  return file_size_ - base_ - address;
}

bool RawFile::read(uint64_t address, void* dst, size_t bytes) const {
  if (bytes > bytes_after(address)) return false;
  auto* out = static_cast<unsigned char*>(dst);
  uint64_t offset = base_ + address;
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, out, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
  return true;
}

// ---- layout messages ----------------------------------------------------------------------

namespace {

constexpr unsigned kDataspaceMessage = 0x0001;
constexpr unsigned kDatatypeMessage = 0x0003;
constexpr unsigned kLayoutMessage = 0x0008;
constexpr unsigned kContinuationMessage = 0x0010;
constexpr unsigned kSharedMessageFlag = 0x02;
constexpr size_t kMaxHeaderBlocks = 64;             // continuation blocks followed
constexpr uint64_t kMaxHeaderBlockBytes = 1 << 20;  // beyond: damaged, libhdf5 will say so

// What the object header says about the dataset, as far as the layout check needs it.
struct HeaderFacts {
  int space_rank = -1;  // from the dataspace message; -1: not seen
  int type_class = -1;  // from an unshared datatype message; 0 is integer
  uint64_t type_bytes = 0;
  std::vector<unsigned char> layout;  // body of the first layout message
  bool has_layout = false;
};

// What is wrong with a chunked layout, "" when nothing (or when the message is not one we
// parse: libhdf5 reports those itself). libhdf5 sizes its chunk arithmetic by the dataspace
// rank but takes the chunk dimensions from here, and (in versions 1 and 2 of the message)
// does not check them for 0: a missing or zero dimension is a division by zero in H5Dopen2.
std::string chunk_layout_problem(const HeaderFacts& h, unsigned address_size) {
  const unsigned char* body = h.layout.data();
  const uint64_t size = h.layout.size();
  if (size < 3) return {};
  unsigned rank = 0;
  uint64_t dims_at = 0;
  if (body[0] == 3) {
    if (body[1] != 2) return {};  // compact or contiguous
    rank = body[2];
    dims_at = 3 + address_size;
  } else if (body[0] == 1 || body[0] == 2) {
    if (body[2] != 2) return {};
    rank = body[1];
    dims_at = 8 + address_size;
  } else {
    return {};
  }
  // The layout has one dimension per dataspace dimension, plus the element size.
  if (rank < 2 || (h.space_rank >= 0 && rank != static_cast<unsigned>(h.space_rank) + 1))
    return fmt::format("its chunked layout has {} dimensions for a dataspace of rank {}", rank,
                       h.space_rank);
  if (dims_at + 4 * uint64_t{rank} > size) return {};
  for (unsigned i = 0; i < rank; ++i)
    if (decode_le(body + dims_at + 4 * i, 4) == 0)
      return fmt::format("chunk dimension {} of its layout is 0", i);
  const uint64_t element_bytes = decode_le(body + dims_at + 4 * (rank - 1), 4);
  if (h.type_class == 0 && h.type_bytes > 0 && element_bytes != h.type_bytes)
    return fmt::format("its chunked layout has {}-byte elements but its datatype has {} bytes",
                       element_bytes, h.type_bytes);
  return {};
}

// Walks a version 1 object header (and its continuation blocks) for the messages the layout
// check needs.
std::string layout_problem(const RawFile& raw, uint64_t header) {
  unsigned char prefix[16] = {};
  if (!raw.read(header, prefix, sizeof prefix) || prefix[0] != 1) return {};
  const uint64_t total_messages = decode_le(prefix + 2, 2);
  struct Block {
    uint64_t address, bytes;
  };
  std::vector<Block> blocks{{header + sizeof prefix, decode_le(prefix + 8, 4)}};
  std::vector<unsigned char> buf;
  HeaderFacts facts;
  const unsigned as = raw.address_size(), ls = raw.length_size();
  uint64_t seen = 0;
  for (size_t b = 0; b < blocks.size() && b < kMaxHeaderBlocks; ++b) {
    const Block block = blocks[b];
    if (block.bytes > kMaxHeaderBlockBytes) return {};
    buf.resize(static_cast<size_t>(block.bytes));
    if (!raw.read(block.address, buf.data(), buf.size())) return {};
    for (uint64_t p = 0; p + 8 <= block.bytes && seen < total_messages;) {
      const uint64_t type = decode_le(&buf[p], 2);
      const uint64_t size = decode_le(&buf[p + 2], 2);
      const unsigned flags = buf[p + 4];
      const unsigned char* body = &buf[p + 8];
      if (size > block.bytes - p - 8) break;
      ++seen;
      if (type == kContinuationMessage && size >= as + ls) {
        blocks.push_back({decode_le(body, as), decode_le(body + as, ls)});
      } else if (type == kDataspaceMessage && size >= 2 && facts.space_rank < 0) {
        facts.space_rank = body[1];
      } else if (type == kDatatypeMessage && size >= 8 && !(flags & kSharedMessageFlag) &&
                 facts.type_class < 0) {
        facts.type_class = body[0] & 0x0f;
        facts.type_bytes = decode_le(body + 4, 4);
      } else if (type == kLayoutMessage && !facts.has_layout) {
        facts.layout.assign(body, body + size);
        facts.has_layout = true;
      }
      p += 8 + size;
    }
  }
  return facts.has_layout ? chunk_layout_problem(facts, as) : std::string();
}

}  // namespace

void check_chunk_layout(const RawFile& raw, const std::string& path, hid_t file, const char* name) {
  H5L_info_t link;
  // A failed lookup or a soft link: H5Dopen2 will report it.
  if (H5Lget_info(file, name, &link, H5P_DEFAULT) < 0 || link.type != H5L_TYPE_HARD) {
    H5Eclear2(H5E_DEFAULT);
    return;
  }
  const std::string problem = layout_problem(raw, link.u.address);
  if (!problem.empty()) PB_THROW("shard {}: dataset '{}': {} (damaged file)", path, name, problem);
}

void check_storage(const std::string& path, hid_t dataset, hid_t file_space, const char* name,
                   uint64_t element_bytes) {
  Handle dcpl(PB_H5(H5Dget_create_plist(dataset), "shard {}: dataset '{}'", path, name));
  const int rank =
      PB_H5(H5Sget_simple_extent_ndims(file_space), "shard {}: dataset '{}'", path, name);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 1))), max_dims(dims.size());
  PB_H5(H5Sget_simple_extent_dims(file_space, dims.data(), max_dims.data()),
        "shard {}: dataset '{}'", path, name);
  uint64_t elements = 1;  // saturates: a damaged extent must not wrap around
  for (int i = 0; i < rank; ++i)
    if (__builtin_mul_overflow(elements, dims[i], &elements)) elements = UINT64_MAX;
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_COMPACT && element_bytes > 0) {
    const uint64_t stored = H5Dget_storage_size(dataset);
    if (stored / element_bytes < elements)
      PB_THROW(
          "shard {}: dataset '{}': its compact storage holds {} bytes but its {} elements "
          "of {} bytes need more (damaged file)",
          path, name, stored, elements, element_bytes);
  } else if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(dims.size(), 0);
    if (H5Pget_chunk(dcpl.get(), rank, chunk.data()) != rank)
      PB_THROW(
          "shard {}: dataset '{}': its chunk shape does not match its rank {} (damaged "
          "file)",
          path, name, rank);
    for (int i = 0; i < rank; ++i) {
      // libhdf5 refuses such shapes when a dataset is created; reading one it trusts.
      if (chunk[i] == 0 || (max_dims[i] != H5S_UNLIMITED && chunk[i] > max_dims[i]))
        PB_THROW(
            "shard {}: dataset '{}': chunk dimension {} is {}, outside 1 .. {} (damaged "
            "file)",
            path, name, i, chunk[i], max_dims[i]);
    }
  }
}

// ---- VlenHeapCheck ------------------------------------------------------------------------

namespace {

constexpr const char* kReferenceTag = "packbert: raw vlen heap reference";
constexpr uint64_t kMinCollectionBytes = 4096;  // the format's minimum collection size
// Collections hold many small rows, or one large row (its own collection); a size beyond this
// (a row of 8 M int64) is a damaged size field, not data.
constexpr uint64_t kMaxCollectionBytes = uint64_t{1} << 26;
constexpr size_t kMaxCachedCollections = 4096;

// Conversion from any vlen file type to our tagged opaque type of the same size that does
// nothing: libhdf5 has already put the references, as stored, into the conversion buffer.
herr_t expose_references(hid_t src, hid_t dst, H5T_cdata_t* cdata, size_t, size_t, size_t, void*,
                         void*, hid_t) {
  if (cdata->command != H5T_CONV_INIT) return 0;  // H5T_CONV_CONV / H5T_CONV_FREE: no work
  if (H5Tget_class(src) != H5T_VLEN || H5Tget_class(dst) != H5T_OPAQUE ||
      H5Tget_size(src) != H5Tget_size(dst))
    return -1;
  char* tag = H5Tget_tag(dst);
  const bool ours = tag && std::strcmp(tag, kReferenceTag) == 0;
  if (tag) H5free_memory(tag);
  if (!ours) return -1;  // someone else's opaque type: not a conversion we provide
  cdata->need_bkg = H5T_BKG_NO;
  return 0;
}

void register_reference_conversion() {
  static std::once_flag once;
  static bool registered = false;
  std::call_once(once, [] {
    Handle vlen(H5Tvlen_create(H5T_NATIVE_INT));
    Handle opaque(H5Tcreate(H5T_OPAQUE, 16));
    registered = vlen.valid() && opaque.valid() && H5Tset_tag(opaque.get(), kReferenceTag) >= 0 &&
                 H5Tregister(H5T_PERS_SOFT, "packbert vlen references", vlen.get(), opaque.get(),
                             expose_references) >= 0;
  });
  PB_CHECK(registered, "cannot register the vlen reference conversion with libhdf5: {}",
           error_stack_summary());
}

uint64_t align8(uint64_t v) { return (v + 7) & ~uint64_t{7}; }

}  // namespace

VlenHeapCheck::VlenHeapCheck(const std::string& path, const RawFile& raw) : path_(path), raw_(raw) {
  register_reference_conversion();
  reference_type_ = Handle(PB_H5(H5Tcreate(H5T_OPAQUE, 8 + raw.address_size()), "shard {}", path));
  PB_H5(H5Tset_tag(reference_type_.get(), kReferenceTag), "shard {}", path);
}

void VlenHeapCheck::fail(const char* name, int64_t row, const std::string& what) const {
  PB_THROW("shard {}: dataset '{}', sample {}: damaged variable-length data: {}", path_, name, row,
           what);
}

// Parses the collection the way libhdf5 does, but refuses what would make libhdf5 read out of
// bounds or loop: a size field beyond the file, an object beyond the collection, a free-space
// entry of size 0.
const VlenHeapCheck::Collection& VlenHeapCheck::collection_at(uint64_t address, const char* name,
                                                              int64_t row) {
  if (auto it = collections_.find(address); it != collections_.end()) return it->second;
  const unsigned length_size = raw_.length_size();
  const uint64_t header_bytes = align8(8 + length_size);         // signature .. size
  const uint64_t object_header_bytes = align8(8 + length_size);  // index .. size
  unsigned char header[32] = {};
  if (!raw_.read(address, header, header_bytes))
    fail(name, row,
         fmt::format("heap collection address {} is beyond the end of the file "
                     "({} bytes)",
                     address, raw_.file_size()));
  if (std::memcmp(header, "GCOL", 4) != 0)
    fail(name, row, fmt::format("no heap collection at address {} (bad signature)", address));
  if (header[4] != 1)
    fail(name, row,
         fmt::format("heap collection at address {} has unknown version {}", address,
                     int{header[4]}));
  const uint64_t size = decode_le(header + 8, length_size);
  if (size < kMinCollectionBytes || size > kMaxCollectionBytes || size > raw_.bytes_after(address))
    fail(name, row,
         fmt::format("heap collection at address {} claims an impossible size of {} "
                     "bytes",
                     address, size));
  collection_bytes_.resize(static_cast<size_t>(size));
  if (!raw_.read(address, collection_bytes_.data(), collection_bytes_.size()))
    fail(name, row, fmt::format("cannot read the heap collection at address {}", address));

  Collection objects;
  uint64_t p = header_bytes;
  while (p < size) {
    if (size - p < object_header_bytes) break;  // a tail too small for an object: free space
    const unsigned char* object = &collection_bytes_[p];
    const uint64_t index = decode_le(object, 2);
    const uint64_t object_size = decode_le(object + 8, length_size);
    // Index 0 is the free space, whose size counts its own header; objects are padded to 8.
    const uint64_t need =
        index > 0 ? (object_size > size ? size + 1 : object_header_bytes + align8(object_size))
                  : object_size;
    if (need == 0 || need > size - p)
      fail(name, row,
           fmt::format("heap collection at address {}: object {} at offset {} has "
                       "size {}, which does not fit the collection's {} bytes",
                       address, index, p, object_size, size));
    if (index > 0) {
      if (objects.size() <= index) objects.resize(index + 1, -1);
      objects[index] = static_cast<int64_t>(object_size);
    }
    p += need;
  }
  return collections_.emplace(address, std::move(objects)).first->second;
}

void VlenHeapCheck::check_rows(hid_t dataset, hid_t file_space, hid_t mem_space, const char* name,
                               size_t base_bytes, int64_t first_row, int64_t count) {
  const unsigned address_size = raw_.address_size();
  const size_t reference_bytes = 8 + address_size;
  references_.assign(static_cast<size_t>(count) * reference_bytes, 0);
  PB_H5(H5Dread(dataset, reference_type_.get(), mem_space, file_space, H5P_DEFAULT,
                references_.data()),
        "shard {}: dataset '{}', samples {} .. {}: reading the variable-length references", path_,
        name, first_row, first_row + count - 1);
  if (collections_.size() > kMaxCachedCollections) collections_.clear();
  const Collection* collection = nullptr;
  uint64_t collection_address = 0;
  for (int64_t r = 0; r < count; ++r) {
    const unsigned char* ref = &references_[static_cast<size_t>(r) * reference_bytes];
    const uint64_t length = decode_le(ref, 4);
    const uint64_t address = decode_le(ref + 4, address_size);
    const uint64_t index = decode_le(ref + 4 + address_size, 4);
    if (address == 0) continue;  // a null reference: libhdf5 yields an empty row, reads nothing
    const int64_t row = first_row + r;
    if (!collection || address != collection_address) {
      collection = &collection_at(address, name, row);  // stable: unordered_map never moves
      collection_address = address;
    }
    if (index == 0 || index >= collection->size() || (*collection)[index] < 0)
      fail(name, row,
           fmt::format("object {} is not in the heap collection at address {}", index, address));
    const uint64_t object_size = static_cast<uint64_t>((*collection)[index]);
    if (object_size != length * base_bytes)
      fail(name, row,
           fmt::format("the row claims {} elements of {} bytes but its heap object "
                       "holds {} bytes",
                       length, base_bytes, object_size));
  }
}

}  // namespace packbert::h5
