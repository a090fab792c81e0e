# packbert in a container, two stages on Debian 12: the distribution scripts/install_deps.sh, CI
# and the development machines use, so the image is built from the package versions CI tests.
# NVIDIA publishes its CUDA images for Ubuntu and RHEL only; here the CUDA toolkit comes from
# NVIDIA's apt repository for Debian 12 and NCCL from its PyPI wheel (what the CI machines have).
#
#   builder   CUDA 13.0 devel (nvcc, cuBLASLt, NCCL) and scripts/install_deps.sh's packages; builds
#             the packbert target, tests off, as CI configures it (.ci/run)
#   runtime   the packbert binary, the shared libraries it needs (the Debian and CUDA packages
#             that own them, at the builder's versions; scripts/runtime_libs.sh), mpirun,
#             configs/, scripts/ and data/vocab.txt
#
#   docker build -t packbert .
#   docker run --gpus all --rm packbert packbert --devices
#   docker run --gpus all --rm -v /data/seq128:/opt/packbert/data/seq128 \
#     -v "$PWD/out:/opt/packbert/out" packbert \
#     mpirun -np 8 packbert train --config configs/bert_large_phase1_seq128.toml
#
# The image runs without a GPU too (the CPU backend). CI lints this file with hadolint.

ARG CUDA_VERSION=13.0
ARG CUDA_PKG=13-0

# ---- NVIDIA's CUDA apt repository on Debian 12, for both stages -------------------------------
FROM debian:bookworm-slim AS cuda-apt
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
# A URL (DL3020 is about local files, and cannot tell through the ARG).
# hadolint ignore=DL3020
ADD ${CUDA_REPO}/cuda-keyring_1.1-1_all.deb /tmp/cuda-keyring.deb
# ca-certificates: the repository is https. Debian's own version (DL3008): the base image's.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && dpkg -i /tmp/cuda-keyring.deb \
 && rm -rf /tmp/cuda-keyring.deb /var/lib/apt/lists/*

# ---- builder: the CUDA devel toolkit and the build ------------------------------------------
FROM cuda-apt AS builder
ARG CUDA_VERSION
ARG CUDA_PKG
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/packbert
COPY scripts/install_deps.sh scripts/install_deps.sh
# The CUDA packages carry their version in their names (CUDA_PKG); python3-venv holds NCCL's
# wheel (pip never touches the system Python). NCCL's headers and library then sit in
# /opt/nccl-dist, named to CMake below.
# hadolint ignore=DL3008
RUN bash scripts/install_deps.sh \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      "cuda-nvcc-${CUDA_PKG}" "cuda-cudart-dev-${CUDA_PKG}" "cuda-cccl-${CUDA_PKG}" \
      "libcublas-dev-${CUDA_PKG}" python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/nccl \
 && /opt/nccl/bin/pip install --no-cache-dir nvidia-nccl-cu13==2.28.9 \
 && cp -r /opt/nccl/lib/python3*/site-packages/nvidia/nccl /opt/nccl-dist
ENV PATH=/usr/local/cuda-${CUDA_VERSION}/bin:$PATH \
    CUDACXX=/usr/local/cuda-${CUDA_VERSION}/bin/nvcc
COPY . .
RUN cmake -S . -B build -DPACKBERT_CUDA=ON -DPACKBERT_TESTS=OFF -DCMAKE_BUILD_TYPE=Release \
      -DNCCL_INCLUDE_DIR=/opt/nccl-dist/include \
      -DNCCL_LIBRARY=/opt/nccl-dist/lib/libnccl.so.2 \
 && cmake --build build -j"$(nproc)" --target packbert \
 && bash scripts/runtime_libs.sh build/src/packbert /opt/runtime openmpi-bin

# ---- runtime: the binary and what it needs ------------------------------------------------------
FROM cuda-apt AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/packbert
COPY --from=builder /opt/runtime /opt/packbert/runtime
# The packages are pinned to the builder's versions in packages.txt (DL3008 sees no literal).
# hadolint ignore=DL3008
RUN apt-get update \
 && xargs -a runtime/packages.txt apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* \
 && { cat runtime/ld.so.conf; echo /opt/packbert/runtime/lib; } > /etc/ld.so.conf.d/packbert.conf \
 && ldconfig
COPY --from=builder /opt/packbert/build/src/packbert /usr/local/bin/packbert
COPY configs/ configs/
COPY scripts/ scripts/
COPY data/vocab.txt data/vocab.txt
# Every library found, and the binary starts (the CPU backend: no GPU while building).
RUN if ldd /usr/local/bin/packbert | grep "not found"; then exit 1; fi \
 && packbert --devices
# The NVIDIA container toolkit hands the GPUs and the driver in; OpenMPI runs as root here.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CMD ["packbert", "--help"]
