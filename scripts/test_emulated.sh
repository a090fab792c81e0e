#!/usr/bin/env bash
# The CUDA backend's kernels run where there is no GPU: three build trees of the emulated CUDA
# build (PACKBERT_CUDA=EMULATED, docs/testing.md, "What runs where"), each configured, built and tested:
#   build-emu        the gpu tests against the emulation, the emulation's own tests and the
#                    mutation runs (ctest labels emulated, mutation)
#   build-emu-asan   the attention, LayerNorm / embedding, scatter and LAMB op tests under
#   build-emu-tsan   AddressSanitizer and ThreadSanitizer (label sanitize)
#
#   scripts/test_emulated.sh [-j N]     (default: -j 2)
# Extra ctest arguments go in PACKBERT_CTEST_ARGS (e.g. "-R mutant"). Warnings are errors here
# (-DPACKBERT_WERROR=ON), as in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=2
if [ "${1:-}" = "-j" ]; then jobs=$2; fi
run() {  # run DIR CMAKE_ARGS...
  local dir=$1; shift
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DPACKBERT_CUDA=EMULATED -DPACKBERT_WERROR=ON "$@" \
    > "$dir/configure.log" 2>&1 || { tail -30 "$dir/configure.log"; exit 1; }
  cmake --build "$dir" -j"$jobs"
  # shellcheck disable=SC2086
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" ${PACKBERT_CTEST_ARGS:-}
}
run build-emu -DCMAKE_BUILD_TYPE=Release
# -O1: the sanitizers' usual level (line numbers that match, a tolerable slowdown).
run build-emu-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 \
    -DPACKBERT_SANITIZE=address
run build-emu-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 \
    -DPACKBERT_SANITIZE=thread
