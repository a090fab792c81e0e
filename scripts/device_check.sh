#!/usr/bin/env bash
# One prepared check on a machine with a CUDA GPU: the `gpu` tests (every CUDA op against the CPU
# backend, the tensor-core attention, the whole tiny model in fp32 / bf16 / fp16, the trainer,
# the NCCL path), with 2 or more GPUs NCCL training at np 2..N against the CPU, and the GPU
# benchmarks (ops, attention against PyTorch's flash SDPA, the BERT-Large step against Hugging
# Face and with CUDA graphs, segmented and full, at batch 48 and 8, ModernBERT-base's step, MST), with a short summary
# table at the end. Meant to finish in under 8 minutes on an H200: benchmarks that would start
# after 7 minutes are skipped.
#
#   scripts/device_check.sh --bundle [DIR]   HERE (no GPU needed): build build-gpu with CUDA
#                                            (sm_80 + sm_90; PACKBERT_BUNDLE_BUILD and
#                                            PACKBERT_BUNDLE_ARCHS override) and pack the gpu test and bench
#                                            binaries with the shared libraries a bare GPU
#                                            machine lacks into DIR/bundle.tar.xz (default DIR
#                                            .device-bundle, git-ignored through
#                                            .git/info/exclude; ~9 MB); name DIR in the device
#                                            tool's `carry`.
#   scripts/device_check.sh [OUTDIR]         ON THE GPU MACHINE: run them (logs in OUTDIR,
#                                            default $OUT or out/device_check).
#
# The GPU machine has CUDA 13, cmake, ninja and PyTorch but none of packbert's C++ dependencies
# (HDF5, MPI, fmt, spdlog, CLI11, OpenBLAS, GTest) and no network, so nothing is installed there
# (install_deps.sh is never called). It runs the carried bundle when there is one; otherwise it
# builds build-gpu in place, which works only where the dependencies are present.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
GPU_TESTS="test_device test_backend_ops test_cuda_fmha test_cuda_model test_cuda_precision test_cuda_trainer test_nccl_allreduce"
GPU_TARGETS="$GPU_TESTS mpi_train_driver bench_gpu_ops bench_fmha_gpu bench_gpu_step bench_mst
  bench_attention_window bench_modern_step"

# ---- packing (no GPU needed) ------------------------------------------------------------------
if [ "${1:-}" = "--bundle" ]; then
  DIR=${2:-.device-bundle}
  BUILD=${PACKBERT_BUNDLE_BUILD:-build-gpu}          # e.g. an existing CUDA build directory
  ARCHS=${PACKBERT_BUNDLE_ARCHS:-80;90}
  grep -qx "/$DIR/" .git/info/exclude 2>/dev/null || echo "/$DIR/" >> .git/info/exclude
  cmake -S . -B "$BUILD" -DPACKBERT_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" > /tmp/device_bundle_configure.log 2>&1 \
    || { tail -30 /tmp/device_bundle_configure.log; exit 1; }
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j"$(nproc)" --target $GPU_TARGETS || exit 1
  rm -rf "$DIR" && mkdir -p "$DIR/bin" "$DIR/lib"
  for t in $GPU_TARGETS; do
    f=$(find "$BUILD/tests" -type f -name "$t" -perm -u+x | head -1)
    [ -n "$f" ] || { echo "no binary for $t"; exit 1; }
    strip --strip-unneeded -o "$DIR/bin/$t" "$f"
  done
  # Shared libraries outside glibc, libstdc++/libgcc and CUDA's own (the GPU machine has those,
  # matching its driver): HDF5, MPI, OpenBLAS, fmt, spdlog, ...
  for b in "$DIR"/bin/*; do ldd "$b"; done | awk '/=> \//{print $1" "$3}' | sort -u |
    while read -r name path; do
      case "$name" in
        linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|libstdc++*|libgcc_s*) ;;
        libcuda.so*|libcudart*|libcublas*|libnccl*|libnvidia*) ;;
        *) cp -L "$path" "$DIR/lib/$name" && strip --strip-unneeded "$DIR/lib/$name" 2>/dev/null ;;
      esac
    done
  ls "$DIR/bin" "$DIR/lib"
  # One xz archive: the device tool carries at most 64 MiB, and OpenBLAS alone is 36 MB raw
  # (about 9 MB for everything compressed). The check unpacks it on the GPU machine.
  tar -C "$DIR" -cJf "$DIR/bundle.tar.xz" bin lib && rm -rf "$DIR/bin" "$DIR/lib" || exit 1
  du -sh "$DIR"
  exit 0
fi

# ---- the check (GPU machine) ------------------------------------------------------------------
OUTDIR=${1:-${OUT:-out/device_check}}
mkdir -p "$OUTDIR"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=8
SUMMARY="$OUTDIR/summary.txt"
: > "$SUMMARY"
step() { printf '%-24s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUTDIR/gpu.txt" 2>&1
step "gpu" "$(head -1 "$OUTDIR/gpu.txt")"
START=$SECONDS

BUNDLE=${PACKBERT_DEVICE_BUNDLE:-.device-bundle}
if [ -f "$BUNDLE/bundle.tar.xz" ] && [ ! -d "$BUNDLE/bin" ]; then
  tar -C "$BUNDLE" -xJf "$BUNDLE/bundle.tar.xz" || { step "binaries" "FAILED to unpack $BUNDLE"; exit 1; }
fi
if [ -d "$BUNDLE/bin" ]; then
  BIN="$ROOT/$BUNDLE/bin"
  # CUDA's libraries (cuBLASLt) from the machine: the toolkit, else the CUDA wheels PyTorch
  # brought (their folder layout differs between CUDA versions, so search for the file).
  export LD_LIBRARY_PATH="$ROOT/$BUNDLE/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for lib in $(ldd "$BIN"/* 2>/dev/null | awk '/not found/{print $1}' | sort -u); do
    for sp in $(python3 -c "import site; print(' '.join(site.getsitepackages()))" 2>/dev/null) /usr/local/cuda /usr/lib; do
      f=$(find "$sp" -name "$lib" 2>/dev/null | head -1)
      if [ -n "$f" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$f")"; break; fi
    done
  done
  step "binaries" "carried bundle $BUNDLE"
  if ldd "$BIN/test_backend_ops" | grep -q "not found"; then
    ldd "$BIN/test_backend_ops" | grep "not found" | tee -a "$SUMMARY"
    step "RESULT" "FAILED: libraries missing (above)"; exit 1
  fi
else
  # shellcheck disable=SC2086
  gen=""; [ -f build-gpu/CMakeCache.txt ] || { command -v ninja > /dev/null && gen="-G Ninja"; }
  if cmake -S . -B build-gpu $gen -DPACKBERT_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUTDIR/configure.log" 2>&1 &&
     timeout 300 cmake --build build-gpu -j"$(nproc)" --target $GPU_TARGETS > "$OUTDIR/build.log" 2>&1; then
    step "build (sm_90)" "ok"
  else
    step "build (sm_90)" "FAILED (configure.log / build.log; no bundle at $BUNDLE)"
    tail -20 "$OUTDIR/configure.log" "$OUTDIR/build.log" 2>/dev/null
    echo "Hint: run 'scripts/device_check.sh --bundle' on the dev machine and carry .device-bundle."
    exit 1
  fi
  BIN="$ROOT/build-gpu/tests"
fi

# ---- gpu tests ------------------------------------------------------------------------------
rc=0
# Time limits (seconds) keep the worst case under 8 minutes; a normal run takes 1-2.
declare -A LIMIT=([test_device]=30 [test_backend_ops]=200 [test_cuda_fmha]=20 [test_cuda_model]=90
                 [test_cuda_precision]=40 [test_cuda_trainer]=60
                 [test_nccl_allreduce]=30)
for t in $GPU_TESTS; do
  [ -x "$BIN/$t" ] || { step "$t" "MISSING binary"; rc=1; continue; }
  log="$OUTDIR/$t.log"
  PACKBERT_CUDA_SYNC=1 timeout "${LIMIT[$t]}" "$BIN/$t" --gtest_color=no > "$log" 2>&1
  code=$?
  passed=$(grep -c '^\[       OK \]' "$log")
  # Each test's own line (with its time), not gtest's closing list, which names it again.
  failed=$(grep -c '^\[  FAILED  \] [A-Za-z].* ([0-9]* ms)$' "$log")
  skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z].* ([0-9]* ms)$' "$log")
  [ "$code" -ne 0 ] && rc=1
  if [ "$passed" -eq 0 ] && grep -q "skipped: no CUDA device" "$log"; then
    step "$t" "SKIPPED: no device seen (rc $code)"; rc=1
  elif [ "$skipped" -gt 0 ]; then
    # e.g. the two-rank NCCL test on a machine with one GPU
    step "$t" "$passed passed, $failed failed, $skipped skipped (rc $code; $(grep -m1 '^skipped:' "$log" | cut -c10-))"
  else
    step "$t" "$passed passed, $failed failed (rc $code)"
  fi
done
# Bisection aids when the op tests fail: the same tests without cuBLASLt epilogues (DEFAULT GEMMs
# plus kernels), and compute-sanitizer's memcheck on the kernel-heavy tests (works on this
# workplace's Firecracker H200 machines; slow, hence the filter and the timeout).
if ! grep -q '^\[  PASSED  \]' "$OUTDIR/test_backend_ops.log" || grep -q '^\[  FAILED  \]' "$OUTDIR/test_backend_ops.log"; then
  PACKBERT_CUDA_SYNC=1 PACKBERT_CUDA_NO_EPILOGUES=1 timeout 60 "$BIN/test_backend_ops" --gtest_color=no \
    --gtest_filter='BackendOps.*:BackendOpsCuda.*' > "$OUTDIR/test_backend_ops_no_epilogues.log" 2>&1
  step "  without epilogues" "$(grep -c '^\[       OK \]' "$OUTDIR/test_backend_ops_no_epilogues.log") passed, $(grep -c '^\[  FAILED  \] [A-Za-z].* ([0-9]* ms)$' "$OUTDIR/test_backend_ops_no_epilogues.log") failed"
  if command -v compute-sanitizer > /dev/null; then
    timeout 90 compute-sanitizer --tool memcheck --print-limit 20 "$BIN/test_backend_ops" --gtest_color=no \
      --gtest_filter='BackendOps.Attention:BackendOps.ResidualLayerNorm:BackendOps.Embedding:BackendOps.Lamb*:BackendOps.Softmax*' \
      > "$OUTDIR/memcheck.log" 2>&1
    step "  memcheck" "$(grep -m1 'ERROR SUMMARY' "$OUTDIR/memcheck.log" || echo 'no summary (timeout?)')"
  fi
fi
# The worst measured error per op group (the [ops-error] lines), and every failure line.
grep -h '^\[ops-error\]\|^\[model-error\]' "$OUTDIR"/test_cuda_*.log "$OUTDIR"/test_backend_ops.log > "$OUTDIR/errors.txt"
grep -h -B1 -A4 'Failure$' "$OUTDIR"/test_*.log | head -60 > "$OUTDIR/failures.txt"

# ---- multi-GPU: NCCL training against the CPU -------------------------------------------------
# With 2 or more GPUs: tests/mpi/mpi_train_driver trains the tiny model 3 steps (dropout on) under
# mpirun at np = 2 .. min(GPUs, 8), rank r on GPU r with NCCL, unsharded and sharded, fp32 and
# bf16, against the CPU at the same np (tests/mpi/check_train.py): every step's loss and every
# first-step gradient tensor to 1e-4 (fp32) and 1e-2 / 3e-2 (bf16), the tolerances of
# tests/emulation/CMakeLists.txt, which runs the same on emulated GPUs. One row per np and dtype.
# mpirun is PACKBERT_MPIEXEC or the one on PATH (the bundle carries none).
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
MPIEXEC=${PACKBERT_MPIEXEC:-$(command -v mpirun || true)}
if [ "$NGPU" -lt 2 ]; then
  step "nccl training" "skipped: $NGPU GPU(s); NCCL needs a GPU of its own for every rank, so its multi-rank runs need >= 2"
elif [ -z "$MPIEXEC" ]; then
  step "nccl training" "skipped: no mpirun on this machine (set PACKBERT_MPIEXEC)"
elif [ ! -x "$BIN/mpi_train_driver" ]; then
  step "nccl training" "MISSING binary mpi_train_driver"; rc=1
else
  NW="$OUTDIR/nccl_train"
  # check_train.py needs numpy (PyTorch's python has it).
  PYN=python3; "$PYN" -c "import numpy" 2>/dev/null || PYN=/usr/bin/python3
  rm -rf "$NW" && mkdir -p "$NW"
  mpi() { timeout 180 "$MPIEXEC" --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=2 -x LD_LIBRARY_PATH "$@"; }
  if ! "$BIN/mpi_train_driver" write "$NW/shards" > "$NW/write.log" 2>&1; then
    step "nccl training" "FAILED to write shards ($NW/write.log)"; rc=1
  else
    for np in $(seq 2 $((NGPU < 8 ? NGPU : 8))); do
      for dtype in fp32 bf16; do
        if [ $((SECONDS - START)) -gt 360 ]; then step "nccl np$np $dtype" "skipped (time)"; continue; fi
        ltol=1e-4 gtol=1e-4
        [ "$dtype" = bf16 ] && ltol=1e-2 gtol=3e-2
        run=(run "$NW/shards" --steps 3 --batch 16 --precision "$dtype")
        cpu="$NW/np${np}_${dtype}_cpu"
        if ! mpi -np "$np" "$BIN/mpi_train_driver" "${run[@]}" --out "$cpu" > "$cpu.log" 2>&1; then
          step "nccl np$np $dtype" "FAILED: the CPU run ($cpu.log)"; rc=1; continue
        fi
        row="" ok=1
        for sharding in unsharded sharded; do
          out="$NW/np${np}_${sharding}_${dtype}_cuda"
          extra=""; [ "$sharding" = sharded ] && extra="--sharded"
          # shellcheck disable=SC2086
          if ! mpi -np "$np" "$BIN/mpi_train_driver" "${run[@]}" --out "$out" --device cuda $extra > "$out.log" 2>&1; then
            row="$row $sharding: run FAILED ($out.log);"; ok=0; continue
          fi
          "$PYN" tests/mpi/check_train.py "$cpu" "$out" --grad-tol "$gtol" --tensor-tol "$gtol" \
            --loss-tol "$ltol" > "$out.check" 2>&1 || ok=0
          loss=$(sed -n 's/^\[measure\] .*: loss trajectory, worst step (rel) \([^ ]*\) <= .*/\1/p' "$out.check")
          grad=$(sed -n 's/^\[measure\] .*: first-step gradient, worst tensor \([^ ]*\) <= .*/\1/p' "$out.check")
          row="$row $sharding: loss ${loss:-?} grad ${grad:-?};"
        done
        [ "$ok" -eq 1 ] || rc=1
        verdict=FAILED; [ "$ok" -eq 1 ] && verdict=ok
        step "nccl np$np $dtype" "${row# } tol loss $ltol grad $gtol: $verdict"
      done
    done
  fi
fi

# ---- benchmarks -----------------------------------------------------------------------------
# Each runs only while the whole check is inside 7 minutes (the rest are listed as skipped).
bench() {  # bench NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  if [ $((SECONDS - START)) -gt 420 ]; then step "$name" "skipped (time)"; return; fi
  if timeout "$limit" "$@" > "$OUTDIR/$name.txt" 2>&1; then step "$name" "ok"
  else step "$name" "FAILED (rc $?)"; fi
}
PY=python3; command -v "$PY" > /dev/null || PY=true
# The BERT-Large step (bf16, the MLPerf model's tanh GELU, as many samples as fit, lengths from
# the Wikipedia histogram), then Hugging Face on exactly those samples padded to 512 (with its
# own fastest GELU, the erf one: one fused PyTorch kernel, where gelu_new is several).
bench bench_gpu_step 150 "$BIN/bench_gpu_step" --precision bf16 --gelu tanh --steps 3 --warmup 1 \
  --graphs off --lengths-out "$OUTDIR/lengths.txt"
# The same step in FP8 (train.precision = "fp8": the encoder's GEMMs in FP8 once warm; the
# warm-up's first step runs them in bf16 and records the scales), beside the bf16 one above.
bench bench_gpu_step_fp8 150 "$BIN/bench_gpu_step" --precision fp8 --gelu tanh --steps 3 \
  --warmup 2 --graphs off
# CUDA graphs (train.cuda_graphs: segmented, the encoder layers; full, a micro-step's whole
# forward and backward) against none, at NVIDIA's per-GPU batch 48 and a scale run's 8, padded
# (whose micro-batches share a shape).
bench bench_gpu_step_graphs48 120 "$BIN/bench_gpu_step" --precision bf16 --gelu tanh --steps 3 \
  --warmup 1 --batch 48 --layouts padded --graphs off,segmented,full
bench bench_gpu_step_graphs8 120 "$BIN/bench_gpu_step" --precision bf16 --gelu tanh --steps 3 \
  --warmup 1 --batch 8 --layouts padded --graphs off,segmented,full
[ -s "$OUTDIR/lengths.txt" ] && bench bench_hf_gpu 150 "$PY" scripts/bench_hf_gpu.py "$OUTDIR/lengths.txt" --steps 3 --warmup 1
# ModernBERT-base's step (bf16, forward + backward) at 1024 and 8192, its local and global layers
# against every layer global, beside BERT-Large's above.
bench bench_modern_step 150 "$BIN/bench_modern_step" --backends cuda --reps 2 --tokens 16384
# Our attention against PyTorch's flash SDPA, BERT-Large heads at fixed length 512.
bench bench_fmha_gpu 60 "$BIN/bench_fmha_gpu"
# Local (window 128) against global attention on one sequence of 8192 tokens, BERT-Base heads.
bench bench_attention_window 60 "$BIN/bench_attention_window" --backends cuda
bench bench_flash_sdpa 60 "$PY" scripts/bench_flash_sdpa.py
bench bench_gpu_ops 60 "$BIN/bench_gpu_ops"
# MST on the GPU: activation peak by kind and step time for M = 1..8 and each recompute mode at
# 512 / 2048 / 8192 tokens (2 layers of BERT-Large width), and the longest-sequence estimate.
bench bench_mst 120 "$BIN/bench_mst" --device cuda --lens 512,2048,8192 --reps 2

# The headline numbers against the targets (BERT-Large phase 2, bf16, one H200).
ours=$(awk '$1 == "unpadded" && $2 == "off" && $5 ~ /^[0-9.]+$/ {print $5; exit}' "$OUTDIR/bench_gpu_step.txt" 2>/dev/null)
hf=$(awk '$1 == "hf-padded" {print $5; exit}' "$OUTDIR/bench_hf_gpu.txt" 2>/dev/null)
lamb=$(sed -n 's/^LAMB step over .*: \([0-9.]*\) ms.*/\1/p' "$OUTDIR/bench_gpu_step.txt" 2>/dev/null)
[ -n "$ours" ] && step "samples/s (ours)" "$ours (target >= 1100)"
[ -n "$hf" ] && step "samples/s (HF+SDPA)" "$hf$( [ -n "$ours" ] && awk -v a="$ours" -v b="$hf" 'BEGIN{printf "  ours/HF %.2fx (target >= 2.5x)", a/b}')"
[ -n "$lamb" ] && step "LAMB step" "$lamb ms (target <= 3 ms)"
fp8=$(awk '$1 == "unpadded" && $2 == "off" && $5 ~ /^[0-9.]+$/ {print $5; exit}' "$OUTDIR/bench_gpu_step_fp8.txt" 2>/dev/null)
[ -n "$fp8" ] && step "samples/s (fp8)" "$fp8$( [ -n "$ours" ] && awk -v a="$fp8" -v b="$ours" 'BEGIN{printf "  fp8/bf16 %.2fx", a/b}')"
mb=$(awk '$1 == "cuda" && $4 == "8192" {printf "%s ms  ", $5}' "$OUTDIR/bench_modern_step.txt" 2>/dev/null)
[ -n "$mb" ] && step "ModernBERT-base 8192" "step local+global, all global: $mb"
g8=$(awk '/^GEMM fp8 e4m3 fast-accum peak/ {print $(NF-2); exit}' "$OUTDIR/bench_gpu_ops.txt" 2>/dev/null)
gb=$(awk '/^GEMM bf16 peak/ {print $(NF-2); exit}' "$OUTDIR/bench_gpu_ops.txt" 2>/dev/null)
[ -n "$g8" ] && step "GEMM TFLOP/s 8192^3" "fp8 $g8, bf16 $gb"
for b in 48 8; do
  g=$(awk '$1 == "padded" && $5 ~ /^[0-9.]+$/ {printf "%s %s  ", $2, $5}' "$OUTDIR/bench_gpu_step_graphs$b.txt" 2>/dev/null)
  [ -n "$g" ] && step "samples/s, batch $b, graphs" "$g"
done

echo
echo "== largest op errors (all in $OUTDIR/errors.txt) =="
awk '{print $NF, $0}' "$OUTDIR/errors.txt" | sort -g | tail -8 | cut -d' ' -f2-
if [ -s "$OUTDIR/failures.txt" ]; then echo "== first failures =="; head -30 "$OUTDIR/failures.txt"; fi
for b in bench_gpu_step bench_gpu_step_fp8 bench_gpu_step_graphs48 bench_gpu_step_graphs8 bench_hf_gpu bench_fmha_gpu \
         bench_modern_step bench_attention_window bench_flash_sdpa bench_gpu_ops bench_mst; do
  [ -f "$OUTDIR/$b.txt" ] && { echo "== $b =="; tail -40 "$OUTDIR/$b.txt"; }
done
echo
step "elapsed" "$((SECONDS - START)) s"
echo "== summary =="
cat "$SUMMARY"
exit $rc
