#!/usr/bin/env bash
# The layering of the build, checked on the linked binaries: the GPU tests and benchmarks that
# exercise only the kernels and model libraries must not need MPI's or HDF5's shared libraries,
# so they run on a GPU machine that has only CUDA's (scripts/device_check.sh). Each argument is
# a binary; the script lists the forbidden DT_NEEDED entries it finds and exits 1 if any.
#   check_layering.sh BINARY...
set -euo pipefail
command -v readelf > /dev/null || { echo "check_layering.sh: readelf not found" >&2; exit 2; }
bad=0
for b in "$@"; do
  [ -f "$b" ] || { echo "$b: missing" >&2; bad=1; continue; }
  needed=$(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  forbidden=$(printf '%s\n' "$needed" | grep -E '^lib(mpi|mpi_cxx|open-pal|open-rte|hdf5)[._]' || true)
  if [ -n "$forbidden" ]; then
    echo "$(basename "$b"): needs $(echo $forbidden)" >&2
    bad=1
  else
    echo "$(basename "$b"): $(printf '%s\n' "$needed" | wc -l) shared libraries, none of MPI or HDF5"
  fi
done
exit $bad
