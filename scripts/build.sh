#!/usr/bin/env bash
# Configures and builds attnres (Release) into build/.
#   scripts/build.sh                                  everything (binary + tests)
#   scripts/build.sh --target attnres                 just the binary
#   scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90    -D options go to CMake's configure step
set -euo pipefail
cd "$(dirname "$0")/.."
configure=() build=()
for a in "$@"; do
  if [[ "$a" == -D* ]]; then configure+=("$a"); else build+=("$a"); fi
done
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${configure[@]}" >/dev/null
cmake --build build -j"$(nproc)" "${build[@]}"
