#!/usr/bin/env bash
# The CUDA backend's kernels run where there is no GPU: three build trees of the emulated CUDA
# build (PACKBERT_CUDA=EMULATED, docs/testing.md, "What runs where"), each configured, built and tested:
#   build-emu        the gpu tests against the emulation, the emulation's own tests and the
#                    mutation runs (ctest labels emulated, mutation)
#   build-emu-asan   the attention, LayerNorm / embedding, scatter and LAMB op tests under
#   build-emu-tsan   AddressSanitizer and ThreadSanitizer (label sanitize), built alone
#
#   scripts/test_emulated.sh [-j N]     (default: -j 2)
# Extra ctest arguments go in PACKBERT_CTEST_ARGS (e.g. "-R mutant"). Warnings are errors here
# (-DPACKBERT_WERROR=ON), as in CI. Each tree announces itself before it configures; after its
# tests, scripts/ctest_skips.py lists the skipped ones with their reasons. The first tree whose
# configure, build or tests fail ends the script with that status.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=2
if [ "${1:-}" = "-j" ]; then jobs=$2; fi
trees=3 tree=0
run() {  # run DIR TARGET CMAKE_ARGS...   (TARGET: what to build, all or the tree's tests)
  local dir=$1 target=$2; shift 2
  tree=$((tree + 1))
  # The configure output goes to a log, so this line is what says which tree the build and
  # test output below belongs to.
  echo "test_emulated: $dir ($tree/$trees): configure, build, test" \
    "(configure output in $dir/configure.log)"
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DPACKBERT_CUDA=EMULATED -DPACKBERT_WERROR=ON "$@" \
    > "$dir/configure.log" 2>&1 || { tail -30 "$dir/configure.log"; exit 1; }
  cmake --build "$dir" -j"$jobs" --target "$target"
  local status=0
  # shellcheck disable=SC2086
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" ${PACKBERT_CTEST_ARGS:-} || status=$?
  # ctest prints no reason for a skipped test; list them, then stop on a failure as before.
  scripts/ctest_skips.py "$dir"
  [ "$status" -eq 0 ] || exit "$status"
}
run build-emu all -DCMAKE_BUILD_TYPE=Release
# -O1: the sanitizers' usual level (line numbers that match, a tolerable slowdown). These trees
# build only their tests (sanitize_tests: the kernels, not the model or the trainer).
run build-emu-asan sanitize_tests -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DPACKBERT_SANITIZE=address
run build-emu-tsan sanitize_tests -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DPACKBERT_SANITIZE=thread
