#!/usr/bin/env bash
# Configures and builds attnres (Release) into build/ (or $ATTNRES_BUILD_DIR).
#   scripts/build.sh                                  everything (binary + tests)
#   scripts/build.sh --target attnres                 just the binary
#   scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90    -D options go to CMake's configure step
#   ATTNRES_BUILD_DIR=build-cpu scripts/build.sh -DATTNRES_CUDA=OFF   a second configuration
set -euo pipefail
cd "$(dirname "$0")/.."
configure=() build=()
for a in "$@"; do
  if [[ "$a" == -D* ]]; then configure+=("$a"); else build+=("$a"); fi
done
dir=${ATTNRES_BUILD_DIR:-build}
# Paths relative to the repository in ccache's hashes: another clone, or the
# planted-fault check's copy (scripts/mutants.sh), reuses these objects.
export CCACHE_BASEDIR="$PWD"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "${configure[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)" "${build[@]}"
