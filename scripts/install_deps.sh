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
  libtomlplusplus-dev                 # TOML config files (src/config/config.h)
  libopenblas-dev                     # CPU GEMMs
  libgtest-dev googletest             # tests
  libboost-context-dev                # fibers of the emulated CUDA build (one per CUDA thread)
  libutf8proc-dev                     # Unicode categories and NFD for the BERT tokenizer
  zlib1g-dev                          # gzip corpora
  libxxhash-dev python3-xxhash        # checkpoint checksums (XXH3-64), C++ and the converter
  nlohmann-json3-dev                  # JSON output (packbert pack --json), header-only
  python3 python3-pip                 # test tooling
  python3-torch python3-numpy python3-yaml   # Hugging Face round trip, reference scripts
  python3-matplotlib                  # scripts/plot_metrics.py
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
# Into Debian's python3 (the one with python3-torch), from the package registry:
# - transformers 4.44.2 (4.57 disables its models with torch < 2, Debian has 1.13; 5.x dropped
#   the slow BERT tokenizer) for the checkpoint round trip and the reference scripts;
# - mlperf-logging for the MLPerf compliance checker test, without its dependencies: it pulls
#   numpy 2 / pandas / scipy, which would break Debian's torch (built against numpy 1), and the
#   checker itself needs only pyyaml.
SYS_PY=/usr/bin/python3
pip_sys() { "$SYS_PY" -m pip install -q "$@" 2>/dev/null || "$SYS_PY" -m pip install -q --break-system-packages "$@"; }
if ! "$SYS_PY" -c "import transformers, safetensors; assert transformers.__version__ == '4.44.2'" 2>/dev/null; then
  pip_sys "transformers==4.44.2" "numpy<2"
fi
if ! "$SYS_PY" -c "import mlperf_logging.compliance_checker" 2>/dev/null; then
  pip_sys --no-deps "mlperf-logging==4.1.68"
fi
echo "install_deps: done"
