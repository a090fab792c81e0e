// Checked MPI calls: a failure becomes a packbert::Error naming the call, the file:line and
// MPI's own message, which the top-level handler logs before MPI_Abort (DESIGN.md, Errors).
// A check fires only where MPI returns the error: on the communicators that run with
// MPI_ERRORS_RETURN (the gradient reducer's, MetricSums' and the NCCL bootstrap's). Elsewhere
// (MPI_COMM_WORLD, the loader's duplicate of it, calls on no communicator, which MPI raises on
// MPI_COMM_WORLD) the default handler, MPI_ERRORS_ARE_FATAL, aborts with MPI's own message
// before a return code exists; the check there holds if a caller installs MPI_ERRORS_RETURN.
// Header-only, in core so that every layer that calls MPI includes it from below: the loader
// (data), comm, train and main. core's library itself links no MPI; each includer's does.
#pragma once

#include <mpi.h>

#include <string>

#include "kernels/base/error.h"

namespace packbert::detail {

[[noreturn]] inline void throw_mpi_error(int rc, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  // The macro passes the whole call expression; its name is what a reader needs.
  std::string name(call);
  name = name.substr(0, name.find('('));
  PB_THROW("{}:{}: {} failed: {} (MPI error {})", file, line, name,
           len > 0 ? std::string(text, static_cast<size_t>(len)) : std::string("unknown error"),
           rc);
}

}  // namespace packbert::detail

// PB_MPI_CHECK(MPI_Iallreduce(...)): throws packbert::Error unless the call returns MPI_SUCCESS.
#define PB_MPI_CHECK(call)                                                                         \
  do {                                                                                             \
    const int pb_mpi_rc_ = (call);                                                                 \
    if (pb_mpi_rc_ != MPI_SUCCESS)                                                                 \
      ::packbert::detail::throw_mpi_error(pb_mpi_rc_, #call, __FILE__, __LINE__);                  \
  } while (0)
