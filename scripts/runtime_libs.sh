#!/usr/bin/env bash
# What a built packbert needs at run time, for the Dockerfile's runtime stage:
#
#   scripts/runtime_libs.sh BINARY OUTDIR [PACKAGE...]
#
# OUTDIR/packages.txt   the Debian packages, as NAME=VERSION of this machine, that own the shared
#                       libraries BINARY links (OpenMPI's brings its plugins along), and PACKAGEs
#                       (e.g. openmpi-bin for mpirun)
# OUTDIR/lib/           copies of the libraries that no package owns (e.g. NCCL from its wheel)
# OUTDIR/ld.so.conf     the directories, outside the standard ones, of the packaged libraries
#                       (e.g. the CUDA toolkit's), for /etc/ld.so.conf.d
#
# A library the loader does not find is an error, as is a PACKAGE that is not installed here.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: scripts/runtime_libs.sh BINARY OUTDIR [PACKAGE...]" >&2
  exit 2
fi
bin=$1 out=$2; shift 2
[ -x "$bin" ] || { echo "runtime_libs: $bin is not an executable" >&2; exit 1; }

deps=$(ldd "$bin") || { echo "runtime_libs: ldd $bin failed" >&2; exit 1; }
if grep -q "not found" <<<"$deps"; then
  echo "runtime_libs: $bin needs libraries the loader does not find:" >&2
  grep "not found" <<<"$deps" >&2
  exit 1
fi

# The package owning PATH: dpkg knows a file by the path its package ships, which with merged
# /usr may be /lib/... for /usr/lib/... and the other way round, or the target of a symlink
# (Debian's alternatives for BLAS).
owner() {
  local p=$1 c
  for c in "$p" "$(realpath "$p")" "${p#/usr}" "/usr$p"; do
    dpkg-query -S "$c" 2>/dev/null | head -1 | cut -d: -f1 && return 0
  done
  return 1
}

mkdir -p "$out/lib"
packages=()
dirs=()
while read -r lib; do
  if pkg=$(owner "$lib") && [ -n "$pkg" ]; then
    packages+=("$pkg")
    dir=$(dirname "$(realpath "$lib")")
    case "$dir" in
      /lib|/lib64|/usr/lib|/usr/lib64|/lib/x86_64-linux-gnu|/usr/lib/x86_64-linux-gnu) ;;
      *) dirs+=("$dir") ;;
    esac
  else
    cp -L "$lib" "$out/lib/"
    echo "runtime_libs: $lib belongs to no package: copied"
  fi
done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$deps")
packages+=("$@")

: > "$out/packages.txt"
for pkg in $(printf '%s\n' "${packages[@]}" | sort -u); do
  version=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) \
    || { echo "runtime_libs: package $pkg is not installed" >&2; exit 1; }
  echo "$pkg=$version" >> "$out/packages.txt"
done
printf '%s\n' "${dirs[@]+"${dirs[@]}"}" | sed '/^$/d' | sort -u > "$out/ld.so.conf"
echo "runtime_libs: $(wc -l < "$out/packages.txt") packages, $(find "$out/lib" -type f | wc -l)" \
     "unpackaged libraries, $(wc -l < "$out/ld.so.conf") library directories in $out"
