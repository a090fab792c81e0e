// The checked read-only driver (see shard_vfd.h): POSIX pread, no write support, no metadata
// accumulation, and a bounds check on every read.
#include "data/shards/shard_vfd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "kernels/base/error.h"

namespace packbert::h5 {

namespace {

// libhdf5 sees only `driver`; the rest is ours. `driver` must come first.
struct CheckedFile {
  H5FD_t driver;
  int fd = -1;
  haddr_t eoa = 0;  // end of allocation, as libhdf5 sets it from the superblock
  haddr_t eof = 0;  // size of the file
  dev_t device = 0;
  ino_t inode = 0;
};

CheckedFile* as_checked(H5FD_t* f) { return reinterpret_cast<CheckedFile*>(f); }
const CheckedFile* as_checked(const H5FD_t* f) { return reinterpret_cast<const CheckedFile*>(f); }

// Puts a message on libhdf5's error stack, so that the reader's error names the cause.
template <typename... Args>
herr_t driver_error(const char* function, hid_t minor, const char* format, Args... args) {
  H5Epush2(H5E_DEFAULT, __FILE__, function, __LINE__, H5E_ERR_CLS, H5E_VFL, minor, format, args...);
  return -1;
}

// The largest address a file may have: what off_t can express, like the sec2 driver.
constexpr haddr_t kMaxAddress = (haddr_t{1} << (8 * sizeof(off_t) - 1)) - 1;

H5FD_t* checked_open(const char* name, unsigned flags, hid_t /*fapl*/, haddr_t maxaddr) {
  if (flags & (H5F_ACC_RDWR | H5F_ACC_TRUNC | H5F_ACC_CREAT | H5F_ACC_EXCL)) {
    driver_error("checked_open", H5E_CANTOPENFILE, "the checked shard driver only reads");
    return nullptr;
  }
  if (maxaddr == 0 || maxaddr == HADDR_UNDEF || maxaddr > kMaxAddress) {
    driver_error("checked_open", H5E_BADVALUE, "bad maximum address");
    return nullptr;
  }
  const int fd = ::open(name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    driver_error("checked_open", H5E_CANTOPENFILE, "cannot open %s: %s", name,
                 std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    driver_error("checked_open", H5E_CANTOPENFILE, "cannot stat %s: %s", name, std::strerror(err));
    return nullptr;
  }
  auto* f = new CheckedFile();
  f->fd = fd;
  f->eof = static_cast<haddr_t>(st.st_size);
  f->device = st.st_dev;
  f->inode = st.st_ino;
  return &f->driver;
}

herr_t checked_close(H5FD_t* file) {
  CheckedFile* f = as_checked(file);
  const int rc = ::close(f->fd);
  delete f;
  return rc == 0 ? 0 : driver_error("checked_close", H5E_CANTCLOSEFILE, "close failed");
}

int checked_cmp(const H5FD_t* a, const H5FD_t* b) {
  const CheckedFile* x = as_checked(a);
  const CheckedFile* y = as_checked(b);
  if (x->device != y->device) return x->device < y->device ? -1 : 1;
  if (x->inode != y->inode) return x->inode < y->inode ? -1 : 1;
  return 0;
}

herr_t checked_query(const H5FD_t*, unsigned long* flags) {
  // Deliberately without H5FD_FEAT_ACCUMULATE_METADATA: the accumulator is where undefined
  // addresses crash. Data sieving keeps small raw reads of contiguous datasets efficient.
  *flags = H5FD_FEAT_DATA_SIEVE;
  return 0;
}

haddr_t checked_get_eoa(const H5FD_t* file, H5FD_mem_t) { return as_checked(file)->eoa; }

herr_t checked_set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  if (addr == HADDR_UNDEF || addr > kMaxAddress)
    return driver_error("checked_set_eoa", H5E_OVERFLOW, "bad end of allocation %llu",
                        static_cast<unsigned long long>(addr));
  as_checked(file)->eoa = addr;
  return 0;
}

haddr_t checked_get_eof(const H5FD_t* file, H5FD_mem_t) { return as_checked(file)->eof; }

herr_t checked_get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = &as_checked(file)->fd;
  return 0;
}

herr_t checked_read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buffer) {
  CheckedFile* f = as_checked(file);
  if (addr == HADDR_UNDEF)
    return driver_error("checked_read", H5E_READERROR,
                        "read of %zu bytes at an undefined address (damaged file)", size);
  if (addr > kMaxAddress || size > kMaxAddress - addr || addr + size > f->eoa)
    return driver_error("checked_read", H5E_OVERFLOW,
                        "read of %zu bytes at address %llu is beyond the file's end of "
                        "allocation %llu (damaged file)",
                        size, static_cast<unsigned long long>(addr),
                        static_cast<unsigned long long>(f->eoa));
  auto* out = static_cast<unsigned char*>(buffer);
  while (size > 0) {
    if (addr >= f->eof) {  // allocated but not yet written: zeros, as the sec2 driver does
      std::memset(out, 0, size);
      break;
    }
    const ssize_t got = ::pread(f->fd, out, size, static_cast<off_t>(addr));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      return driver_error("checked_read", H5E_READERROR, "pread failed: %s", std::strerror(errno));
    if (got == 0) {
      std::memset(out, 0, size);
      break;
    }
    out += got;
    addr += static_cast<haddr_t>(got);
    size -= static_cast<size_t>(got);
  }
  return 0;
}

herr_t checked_write(H5FD_t*, H5FD_mem_t, hid_t, haddr_t, size_t, const void*) {
  return driver_error("checked_write", H5E_WRITEERROR, "the checked shard driver only reads");
}

H5FD_class_t make_driver_class() {
  H5FD_class_t c{};
  c.name = "packbert_checked_read";
  c.maxaddr = kMaxAddress;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.open = checked_open;
  c.close = checked_close;
  c.cmp = checked_cmp;
  c.query = checked_query;
  c.get_eoa = checked_get_eoa;
  c.set_eoa = checked_set_eoa;
  c.get_eof = checked_get_eof;
  c.get_handle = checked_get_handle;
  c.read = checked_read;
  c.write = checked_write;
  const H5FD_mem_t map[] = H5FD_FLMAP_DICHOTOMY;
  std::memcpy(c.fl_map, map, sizeof c.fl_map);
  return c;
}

}  // namespace

Handle checked_read_fapl() {
  static const H5FD_class_t driver_class = make_driver_class();
  static std::once_flag once;
  static hid_t driver = H5I_INVALID_HID;
  std::call_once(once, [] { driver = H5FDregister(&driver_class); });
  PB_CHECK(driver >= 0, "cannot register the checked shard driver with libhdf5: {}",
           error_stack_summary());
  Handle fapl(PB_H5(H5Pcreate(H5P_FILE_ACCESS), "checked shard driver"));
  PB_H5(H5Pset_driver(fapl.get(), driver, nullptr), "checked shard driver");
  return fapl;
}

}  // namespace packbert::h5
