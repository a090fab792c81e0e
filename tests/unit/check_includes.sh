#!/usr/bin/env bash
# The include edges the layering forbids, checked on the sources (kernels/backends.cpp is the
# one place that names both backends):
#   - kernels/cpu includes nothing of the CUDA backend, CUDA, NCCL or cuBLAS;
#   - kernels/cuda includes nothing of the CPU backend (shared code: kernels/common);
#   - src/model, src/optim and src/train reach devices only through kernels/backend.h: no CUDA,
#     NCCL or backend header, no PACKBERT_HAVE_CUDA, no CUDA or NCCL call (src/comm owns NCCL);
#   - src/model includes nothing of the data pipeline (train/batching.h lays samples out);
#   - kernels/ includes nothing of src/ (the build also refuses it: kernels_see_only_their_root),
#     and src/comm nothing of kernels/cuda (its mutation switch: kernels/mutants.h);
#   - the two include roots, src/ ("model/bert.h") and the repository root ("kernels/backend.h"),
#     never both hold a quoted include's path, and no include is spelled through "src/".
# Prints each offending line and exits 1 if there is any.
#   check_includes.sh SOURCE_DIR
set -uo pipefail
root=${1:?usage: check_includes.sh SOURCE_DIR}
bad=0
check() {  # check DIR REGEX WHY
  local hits
  hits=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($2)" "$root/$1" || true)
  if [ -n "$hits" ]; then
    echo "$1 must not include $3:"
    echo "$hits"
    bad=1
  fi
}
# (kernel headers are included from the repository root, "kernels/cuda/...", toolkit headers
# bare: cuda_runtime.h)
check kernels/cpu '(kernels/)?(cuda/|cuda_|cuda\.h)|nccl|cublas|cub/' \
  "the CUDA backend, CUDA, NCCL or cuBLAS"
check kernels/cuda '(kernels/)?cpu/' "the CPU backend"
device='(kernels/)?(cuda|cpu/)|nccl|cublas|cub/'
for dir in src/model src/optim src/train; do
  check "$dir" "$device" "a backend, CUDA, NCCL or cuBLAS"
  hits=$(grep -rnE 'PACKBERT_HAVE_CUDA|\b(cuda|nccl|cublas)[A-Z][A-Za-z]*[[:space:]]*\(|\bcuda_(alloc|free|stream|synchronize)\b' "$root/$dir" || true)
  if [ -n "$hits" ]; then
    echo "$dir must not use CUDA or NCCL (only kernels/backend.h):"
    echo "$hits"
    bad=1
  fi
done
check src/model 'data/' "the data pipeline (src/data)"
check kernels '(core|model|train|optim|comm|data|config)/' "a module of src/"
check src/comm 'kernels/cuda/' "the CUDA backend's files (kernels/mutants.h holds PB_MUTANT)"
# Every quoted include of the project's sources and tests resolves under at most one root.
while IFS= read -r inc; do
  if [ -e "$root/src/$inc" ] && [ -e "$root/$inc" ]; then
    echo "\"$inc\" resolves under both include roots (src/ and the repository root)"
    bad=1
  fi
  case "$inc" in
    src/*) echo "\"$inc\" is spelled through src/: include it as \"${inc#src/}\""; bad=1 ;;
  esac
done < <(grep -rhoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "$root/src" "$root/kernels" \
           "$root/tests" | sed -E 's/.*"([^"]+)"/\1/' | sort -u)
[ $bad -eq 0 ] && echo "kernels/cpu and kernels/cuda include neither the other;" \
  "src/model, src/optim and src/train reach devices through kernels/backend.h only;" \
  "src/model includes no data/; kernels/ nothing of src/, src/comm nothing of kernels/cuda;" \
  "no include path resolves under both roots"
exit $bad
