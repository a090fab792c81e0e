#!/usr/bin/env bash
# One prepared check on a machine with a CUDA GPU: build with the CUDA backend, run the `gpu`
# tests, run the GPU benchmarks that exist, and print a short summary table.
# Usage: scripts/device_check.sh [OUTDIR]   (logs go to OUTDIR, default out/device_check)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/device_check}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

step() { printf '%-28s %s\n' "$1" "$2" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
step "gpu" "$(head -1 "$OUT/gpu.txt")"

if ! command -v cmake >/dev/null || ! dpkg -s libhdf5-dev >/dev/null 2>&1; then
  bash scripts/install_deps.sh > "$OUT/install.log" 2>&1 || { step "install_deps" "FAILED (see install.log)"; exit 1; }
fi
if cmake -S . -B build-gpu -DPACKBERT_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
     > "$OUT/configure.log" 2>&1 && cmake --build build-gpu -j"$(nproc)" > "$OUT/build.log" 2>&1; then
  step "build (sm_90)" "ok"
else
  step "build (sm_90)" "FAILED (see build.log)"; tail -30 "$OUT/build.log"; exit 1
fi

build-gpu/src/packbert --devices | tee "$OUT/devices.txt"
ctest --test-dir build-gpu -L gpu --output-on-failure > "$OUT/gpu_tests.log" 2>&1
rc=$?
step "ctest -L gpu" "$(grep -E 'tests passed|tests failed' "$OUT/gpu_tests.log" | tail -1) (rc $rc)"
if grep -q "skipped: no CUDA device" "$OUT/gpu_tests.log"; then step "WARNING" "gpu tests skipped: no device seen"; fi

for b in build-gpu/tests/bench_gpu_*; do
  [ -x "$b" ] || continue
  name=$(basename "$b")
  if "$b" > "$OUT/$name.txt" 2>&1; then step "$name" "ok"; else step "$name" "FAILED"; fi
  cat "$OUT/$name.txt"
done

echo; echo "== summary =="; cat "$OUT/summary.txt"
exit $rc
