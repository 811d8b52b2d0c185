#!/usr/bin/env bash
# Configures and builds attnres (Release) into build/. Extra arguments go to
# CMake, e.g. scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
