// Internal to the shard reader: a read-only POSIX file driver for libhdf5 that checks every
// read against the file before doing it.
//
// Why: libhdf5 1.10 turns a metadata address of all ones (HADDR_UNDEF, e.g. a run of 0xff
// bytes over the root group's B-tree or local heap address, or over a B-tree child pointer)
// into a segfault: its end-of-allocation check treats the undefined address as "not beyond"
// and its metadata accumulator then copies from a wrapped-around offset (H5F__accum_read).
// Reads that bypass the accumulator reach the driver, which can refuse them; this driver does
// not enable metadata accumulation, and refuses undefined, overflowing and out-of-file reads
// with an HDF5 error, which the reader reports as a packbert::Error.
#pragma once

#include "data/shards/shard_common.h"

namespace packbert::h5 {

// A new file access property list selecting the checked driver.
Handle checked_read_fapl();

}  // namespace packbert::h5
