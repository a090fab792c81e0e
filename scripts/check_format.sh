#!/usr/bin/env bash
# The C++ and CUDA sources (src/, kernels/, tests/) as .clang-format formats them (the ctest
# format_check):
#   scripts/check_format.sh         names each line clang-format would change and exits 1 if any
#   scripts/check_format.sh --fix   formats every file in place
# The tree is formatted with clang-format 14, Debian 12's (scripts/install_deps.sh --tests
# installs it); another version breaks some lines differently, so without version 14 the check
# prints a "skipped:" line and exits 77, which ctest counts as skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "check_format.sh: unknown option '$1' (expected --fix)" >&2; exit 2 ;;
esac
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$cf" ]; then
  echo "skipped: clang-format not found (scripts/install_deps.sh --tests installs it)"
  exit 77
fi
version=$("$cf" --version | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p')
if [ "$version" != 14 ]; then
  echo "skipped: $cf is version ${version:-unknown}; the tree is formatted with clang-format 14"
  exit 77
fi
mapfile -t files < <(find src kernels tests -type f \
  \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
if [ "$fix" -eq 1 ]; then
  "$cf" --style=file -i "${files[@]}"
  exit $?
fi
if ! out=$("$cf" --style=file --dry-run --Werror "${files[@]}" 2>&1); then
  printf '%s\n' "$out" | grep -E '^[^ ].*: error:' | head -40
  bad=$(printf '%s\n' "$out" | grep -E '^[^ ].*: error:' | cut -d: -f1 | sort -u | wc -l)
  echo "check_format: $bad of ${#files[@]} files differ from .clang-format;" \
    "scripts/check_format.sh --fix formats them"
  exit 1
fi
echo "check_format: ${#files[@]} files as .clang-format formats them ($cf, version $version)"
