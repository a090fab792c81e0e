#!/usr/bin/env bash
# Installs everything packbert's build, tests and demo need on a Debian 12 machine.
# Idempotent: packages already present are left alone. CUDA is expected at /usr/local/cuda
# (the CUDA backend is optional; without nvcc the build is CPU-only).
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build ccache git pkg-config
  libopenmpi-dev openmpi-bin          # MPI: ranks, exchange, CPU all-reduce
  libhdf5-dev hdf5-tools              # MLPerf/NVIDIA BERT shards (h5dump for debugging)
  libspdlog-dev libfmt-dev            # logging
  libcli11-dev                        # command line + TOML config files
  libopenblas-dev                     # CPU GEMMs
  libgtest-dev googletest             # tests
  libutf8proc-dev                     # Unicode categories and NFD for the BERT tokenizer
  zlib1g-dev                          # gzip corpora
  nlohmann-json3-dev                  # JSON output (packbert pack --json), header-only
  python3 python3-pip                 # test tooling
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all Debian packages present"
fi

# Python packages for test tooling: h5py/numpy read and write shards the way other tools do.
PY=${PYTHON:-python3}
if ! "$PY" -c "import h5py, numpy" 2>/dev/null; then
  "$PY" -m pip install -q h5py numpy || "$PY" -m pip install -q --break-system-packages h5py numpy
fi
echo "install_deps: done"
