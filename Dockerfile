# packbert on an NVIDIA CUDA devel image: the same packages as scripts/install_deps.sh, then the
# build. Run with: docker run --gpus all -it packbert build/src/packbert --help
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORKDIR /opt/packbert
COPY scripts/install_deps.sh scripts/install_deps.sh
RUN bash scripts/install_deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -DPACKBERT_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
 && cmake --build build -j"$(nproc)"
ENV PATH=/opt/packbert/build/src:$PATH
CMD ["packbert", "--help"]
