#!/usr/bin/env bash
# One command for a GPU machine (H100/H200; no network needed): builds for
# sm_90, then runs any of three stages (all three without a flag):
#   --quick   the GPU tests (test_gpu) and exact resume + eval on the GPU in bf16
#   --multi   the NCCL transport test (1 rank) and, on the visible GPUs, the
#             multi-rank scripts tests/gpu/pipeline_cuda.sh (every pipeline and
#             data-parallel layout against the single-GPU run) and zero_bf16.sh
#   --bench   124M, 350M and 1b3 training steps, per-kernel tables, PyTorch's
#             attention at the same shapes, then scripts/gpu_targets.py's table
#   --tests SPEC   only the GPU tests a Catch2 spec selects, e.g. "[mix],[adamw]"
#   --report DIR   where logs and tables go (default build-gpu/report)
# On an H100 (2026-11-22) the build took ~2 min, the GPU tests ~4, the 124M and
# 350M benchmarks ~5: each stage is meant to fit a 10-minute command limit
# (--quick --multi together may not). When $OUT is set (the device tool's
# folder, which returns at most 8 files), the report folder is also packed into
# $OUT/gpu_check_<stages>.tgz after every step, so a command killed at its time
# limit still returns what had finished.
#
# Dependencies: nvcc, CMake and the CUDA libraries must be there. The Debian
# packages the CPU side needs (json, spdlog, Catch2, OpenBLAS) are used from the
# system when present; otherwise this script unpacks .deb files from .deps/
# (made on a Debian machine with `scripts/gpu_deps.sh`) into /tmp/attnres-deps.
set -uo pipefail
cd "$(dirname "$0")/.."
out=build-gpu/report
stages=()
tests=()
usage() { echo "usage: scripts/gpu_check.sh [--quick] [--multi] [--bench] [--tests SPEC] [--report DIR]" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) stages+=(quick) ;;
    --multi) stages+=(multi) ;;
    --bench) stages+=(bench) ;;
    --tests) [[ $# -ge 2 ]] || usage; tests=("$2"); shift ;;
    --report) [[ $# -ge 2 ]] || usage; out=$2; shift ;;
    *) usage ;;
  esac
  shift
done
[[ ${#stages[@]} -eq 0 ]] && stages=(quick multi bench)
stage() { [[ " ${stages[*]} " == *" $1 "* ]]; }
mkdir -p "$out"
what=$(IFS=_; echo "${stages[*]}")
source scripts/gpu_lib.sh
# Packs the report so far into $OUT (see above); called after every stage.
save() { pack_to_out "gpu_check_$what" "$out"; }

# The CPU-side libraries: the system's, or unpacked from .deps/ (gpu_lib.sh).
use_deps || exit 2
cmake_extra=("${deps_cmake_args[@]}")

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
echo "==> configure + build (sm_90)"
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  "${cmake_extra[@]}" > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; save; exit 2; }
cmake --build build-gpu -j"$(nproc)" --target attnres test_gpu > "$out/build.log" 2>&1 || {
  grep -E "error" -A3 "$out/build.log" | head -60
  save
  exit 2
}
echo "build: $(( $(date +%s) - t0 )) s"
save

status=0
if stage quick; then
  echo "==> GPU tests"
  ./build-gpu/tests/test_gpu "${tests[@]}" --durations yes > "$out/gpu_tests.log" 2>&1 || status=1
  grep -E "^(GPU tests on|All tests passed|test cases:)" "$out/gpu_tests.log"
  if [[ $status -ne 0 ]]; then
    grep -B3 -A12 "FAILED" "$out/gpu_tests.log" | head -150
  fi
  save
  echo "==> exact resume and eval on the GPU (bf16): tests/cli/resume.sh"
  if ATTNRES_TEST_DEVICE=cuda timeout 300 bash tests/cli/resume.sh "$PWD/build-gpu/attnres" "$PWD" \
       > "$out/resume.log" 2>&1; then
    grep -E "^(ok|skipped)" "$out/resume.log"
  else
    status=1
    tail -30 "$out/resume.log"
  fi
  save
fi
if stage multi; then
  if command -v mpirun >/dev/null && cmake --build build-gpu -j"$(nproc)" --target test_mpi >> "$out/build.log" 2>&1; then
    echo "==> NCCL transport (1 rank: self-exchange, P = 1 with two chunks)"
    timeout 120 mpirun --allow-run-as-root -np 1 ./build-gpu/tests/test_mpi "[nccl]" -s > "$out/nccl.log" 2>&1 || status=1
    grep -E "skipped|All tests passed|test cases:|FAILED" "$out/nccl.log" | head -20
    save
    # Several ranks on the GPU(s) through the trainer (tests/gpu/*.sh take the
    # binary, the source dir, test_mpi, then the launcher and its flags).
    launcher=(mpirun -np --oversubscribe)
    [[ $(id -u) == 0 ]] && launcher+=(--allow-run-as-root)
    # A hung exchange fails in a minute (ATTNRES_COMM_TIMEOUT_S) rather than
    # eating the command's time limit; the stage stays under 10 minutes.
    for t in pipeline_cuda:240 zero_bf16:180; do
      limit=${t#*:} t=${t%:*}
      echo "==> tests/gpu/$t.sh (2 and 4 ranks on the visible GPUs)"
      if OMP_NUM_THREADS=1 ATTNRES_COMM_TIMEOUT_S=60 timeout "$limit" bash "tests/gpu/$t.sh" \
           "$PWD/build-gpu/attnres" "$PWD" \
           "$PWD/build-gpu/tests/test_mpi" "${launcher[@]}" > "$out/$t.log" 2>&1; then
        grep -E "^(ok|skipped|not run)" "$out/$t.log"
      else
        status=1
        tail -30 "$out/$t.log"
      fi
      save
    done
  else
    status=1
    echo "==> the multi-rank tests were NOT run (no mpirun, or test_mpi did not build: $out/build.log)"
  fi
fi
if ! stage bench; then save; exit $status; fi

# run_bench NAME ARGS...: `attnres bench --device cuda ARGS` into $out/NAME.txt,
# showing the lines that match the table or the ceilings.
run_bench() {
  local name=$1; shift
  ./build-gpu/attnres bench --device cuda "$@" > "$out/$name.txt" 2>&1 || {
    status=1
    tail -30 "$out/$name.txt"
  }
  grep -E "^(model|micro-batch|modes|baseline|block|full|measured ceilings|attention|lm_head)" "$out/$name.txt"
  save
}
echo "==> end-to-end training steps (bf16, bf16 logits): 124M, 350M, 1b3 (largest micro-batch)"
run_bench bench_124m --preset 124m --steps 10 --warmup 3
run_bench bench_350m --preset 350m --steps 5 --warmup 2
run_bench bench_1b3 --preset 1b3 --steps 5 --warmup 2
if ! grep -q "^baseline" "$out/bench_1b3.txt"; then
  # The planner's micro-batch did not run (out of memory?): once more at 3/4 of it.
  b=$(grep -o ' B=[0-9]*' "$out/bench_1b3.txt" | head -1 | cut -d= -f2)
  if [[ -n "$b" && $b -ge 2 ]]; then
    mv "$out/bench_1b3.txt" "$out/bench_1b3_failed.txt"
    echo "==> 1b3 at B=$b failed; again at B=$((b * 3 / 4))"
    run_bench bench_1b3 --preset 1b3 --steps 5 --warmup 2 --batch $((b * 3 / 4))
  fi
fi
echo "==> kernel benchmarks (each op against its floors): 124M and 350M shapes"
run_bench kernels_124m --preset 124m --kernels
run_bench kernels_350m --preset 350m --kernels
if python3 -c "import torch" 2>/dev/null; then
  echo "==> reference attention (PyTorch SDPA, each backend) at the benchmarks' shapes"
  python3 scripts/bench_attention_torch.py "$out"/bench_{124m,350m,1b3}.txt 2>&1 | tee "$out/attention_torch.txt"
fi
echo "==> the GPU performance targets (docs/cuda.md)"
python3 scripts/gpu_targets.py "$out" | tee "$out/targets.txt" || status=1
echo "==> kernel benchmark at the 1b3 shapes (information)"
run_bench kernels_1b3 --preset 1b3 --kernels
save
exit $status
