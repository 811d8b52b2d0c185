#!/usr/bin/env bash
# The test suite: installs dependencies, builds, runs every CTest test.
# GPU tests skip (and say so) on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
