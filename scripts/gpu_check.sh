#!/usr/bin/env bash
# One command for a GPU machine (H100/H200; no network needed): builds for
# sm_90, runs the GPU tests, then the benchmarks, and prints a short table.
#   scripts/gpu_check.sh            everything
#   scripts/gpu_check.sh --quick    build + GPU tests only
#   scripts/gpu_check.sh --bench    build + benchmarks only (the whole script takes
#                                   ~10.5 min on an H100: ~2 build, ~4 tests, ~5
#                                   benchmarks; --quick then --bench fit a
#                                   10-minute limit per command)
#   scripts/gpu_check.sh --tests SPEC   only the GPU tests a Catch2 test spec
#                                       selects, e.g. "[mix],[adamw]" (filters the
#                                       test_gpu binary only: the resume and NCCL
#                                       tests still run)
# Logs and tables go to $OUT (if set, as on the device tool) or build-gpu/report.
#
# Dependencies: nvcc, CMake and the CUDA libraries must be there. The Debian
# packages the CPU side needs (json, spdlog, Catch2, OpenBLAS) are used from the
# system when present; otherwise this script unpacks .deb files from .deps/
# (made on a Debian machine with `scripts/gpu_deps.sh`) into /tmp/attnres-deps.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build-gpu/report}"
mkdir -p "$out"
quick=0
bench_only=0
tests=()
usage() { echo "usage: scripts/gpu_check.sh [--quick | --bench] [--tests SPEC]" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --bench) bench_only=1 ;;
    --tests) [[ $# -ge 2 ]] || usage; tests=("$2"); shift ;;
    *) usage ;;
  esac
  shift
done
[[ $quick -eq 1 && $bench_only -eq 1 ]] && usage  # one or the other

cmake_extra=()
have_deps=1
for h in nlohmann/json.hpp catch2/catch.hpp spdlog/spdlog.h; do
  [[ -f /usr/include/$h ]] || have_deps=0
done
if [[ $have_deps -eq 0 ]]; then
  if ! ls .deps/*.deb >/dev/null 2>&1; then
    echo "error: the CPU-side dependencies are missing and .deps/ holds no .deb files" >&2
    echo "       (run scripts/gpu_deps.sh on a Debian machine and carry .deps/)" >&2
    exit 2
  fi
  prefix=/tmp/attnres-deps
  mkdir -p "$prefix"
  for f in .deps/*.deb; do dpkg-deb -x "$f" "$prefix"; done
  lib="$prefix/usr/lib/x86_64-linux-gnu"
  export CMAKE_PREFIX_PATH="$prefix/usr"
  export LD_LIBRARY_PATH="$lib:$lib/openblas-openmp:${LD_LIBRARY_PATH:-}"
  cmake_extra+=("-DOPENBLAS_INCLUDE_DIR=$prefix/usr/include/x86_64-linux-gnu/openblas-openmp"
                "-DOPENBLAS_LIBRARY=$lib/openblas-openmp/libopenblas.so")
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
echo "==> configure + build (sm_90)"
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  "${cmake_extra[@]}" > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 2; }
cmake --build build-gpu -j"$(nproc)" --target attnres test_gpu > "$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -60; exit 2; }
echo "build: $(( $(date +%s) - t0 )) s"

status=0
if [[ $bench_only -eq 0 ]]; then
  echo "==> GPU tests"
  ./build-gpu/tests/test_gpu "${tests[@]}" --durations yes > "$out/gpu_tests.log" 2>&1 || status=1
  grep -E "^(GPU tests on|All tests passed|test cases:)" "$out/gpu_tests.log"
  if [[ $status -ne 0 ]]; then
    grep -B3 -A12 "FAILED" "$out/gpu_tests.log" | head -150
  fi
  echo "==> exact resume and eval on the GPU (bf16): tests/cli/resume.sh"
  if ATTNRES_TEST_DEVICE=cuda timeout 300 bash tests/cli/resume.sh "$PWD/build-gpu/attnres" "$PWD" \
       > "$out/resume.log" 2>&1; then
    grep -E "^(ok|skipped)" "$out/resume.log"
  else
    status=1
    tail -30 "$out/resume.log"
  fi
  if command -v mpirun >/dev/null && cmake --build build-gpu -j"$(nproc)" --target test_mpi >> "$out/build.log" 2>&1; then
    echo "==> NCCL transport (1 rank: self-exchange, P = 1 with two chunks)"
    mpirun --allow-run-as-root -np 1 ./build-gpu/tests/test_mpi "[nccl]" -s > "$out/nccl.log" 2>&1 || status=1
    grep -E "skipped|All tests passed|test cases:|FAILED" "$out/nccl.log" | head -20
    # Several ranks on the GPU(s) through the trainer (tests/gpu/*.sh take the
    # binary, the source dir, test_mpi, then the launcher and its flags).
    launcher=(mpirun -np --oversubscribe)
    [[ $(id -u) == 0 ]] && launcher+=(--allow-run-as-root)
    for t in pipeline_cuda zero_bf16; do
      echo "==> tests/gpu/$t.sh (2 and 4 ranks on the visible GPUs)"
      if OMP_NUM_THREADS=1 timeout 600 bash "tests/gpu/$t.sh" "$PWD/build-gpu/attnres" "$PWD" \
           "$PWD/build-gpu/tests/test_mpi" "${launcher[@]}" > "$out/$t.log" 2>&1; then
        grep -E "^(ok|skipped|not run)" "$out/$t.log"
      else
        status=1
        tail -30 "$out/$t.log"
      fi
    done
  else
    echo "==> NCCL transport test not run (no mpirun on this machine)"
  fi
fi
[[ $quick -eq 1 ]] && exit $status

echo "==> kernel benchmark (124M shapes, bf16)"
./build-gpu/attnres bench --device cuda --preset 124m --kernels 2>&1 | tee "$out/kernels_124m.txt" | tail -30 \
  || status=1
echo "==> end-to-end training steps (bf16)"
./build-gpu/attnres bench --device cuda --preset 124m --steps 10 --warmup 3 2>&1 \
  | tee "$out/bench_124m.txt" | tail -6 || status=1
if python3 -c "import torch" 2>/dev/null; then
  echo "==> reference attention (PyTorch SDPA, each backend) at the same shapes"
  python3 scripts/bench_attention_torch.py 2>&1 | tee "$out/attention_torch.txt"
fi
./build-gpu/attnres bench --device cuda --preset 350m --steps 5 --warmup 2 2>&1 \
  | tee "$out/bench_350m.txt" | tail -6 || status=1
echo "==> kernel benchmark (350M shapes, bf16; attention rows shown)"
./build-gpu/attnres bench --device cuda --preset 350m --kernels > "$out/kernels_350m.txt" 2>&1 || {
  status=1
  tail -30 "$out/kernels_350m.txt"
}
grep -E "^(measured ceilings|attention)" "$out/kernels_350m.txt"
echo "==> the GPU performance targets (docs/cuda.md)"
python3 scripts/gpu_targets.py "$out" | tee "$out/targets.txt"
exit $status
