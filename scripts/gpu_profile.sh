#!/usr/bin/env bash
# Where a training step's GPU time goes, per kernel, for each residual mode:
# Nsight Compute times every kernel of the benchmark's timed steps (the region
# `attnres bench` marks with cudaProfilerStart/Stop), and scripts/ncu_summary.py
# groups them and sets each AttnRes mode against the baseline, beside the step
# time measured without the profiler (the difference is launch gaps and host
# work). Needs a built build-gpu/attnres (scripts/gpu_check.sh) and ncu.
#   scripts/gpu_profile.sh [--preset 124m|350m|1b3] [--modes "baseline block full"]
#                          [--steps 1] [--bytes] [--limit 150]
# --bytes also reads each kernel's DRAM bytes (several replays per kernel:
# slower). Profiling serialises the kernels and costs time per kernel (a step
# has thousands), so each mode gets --limit seconds at most (a mode cut off is
# left out of the summary, and said so). Writes ncu_<preset>_<mode>.csv, bench_<preset>_profiled.txt and
# profile_<preset>.md to build-gpu/profile_<preset> and prints the tables;
# when $OUT is set (the device tool), packs them into
# $OUT/gpu_profile_<preset>.tgz after every mode.
# Clocks are left alone (--clock-control none) and caches are not flushed
# between kernels (--cache-control none), as in a real step.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=124m modes="baseline block full" steps=1 limit=150 metrics=gpu__time_duration.sum
usage() { sed -n '2,14p' "$0" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) [[ $# -ge 2 ]] || usage; preset=$2; shift ;;
    --modes) [[ $# -ge 2 ]] || usage; modes=$2; shift ;;
    --steps) [[ $# -ge 2 ]] || usage; steps=$2; shift ;;
    --limit) [[ $# -ge 2 ]] || usage; limit=$2; shift ;;
    --bytes) metrics+=,dram__bytes.sum ;;
    *) usage ;;
  esac
  shift
done
bin=build-gpu/attnres
[[ -x $bin ]] || { echo "error: $bin is missing: run scripts/gpu_check.sh --only "[none]" (its binaries step) first" >&2; exit 2; }
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
[[ -n "$ncu" ]] || { echo "error: ncu (Nsight Compute) not found" >&2; exit 2; }
out=build-gpu/profile_$preset
mkdir -p "$out"
source scripts/gpu_lib.sh
use_deps || exit 2  # the libraries build-gpu/attnres was linked against
save() { pack_to_out "gpu_profile_$preset" "$out"; }

echo "==> step times without the profiler ($preset, bf16)"
"$bin" bench --device cuda --preset "$preset" --steps 10 --warmup 3 | tee "$out/bench_${preset}_profiled.txt"
step_ms=()
for m in $modes; do
  # "block N=8" takes two columns before the step time.
  ms=$(awk -v m="$m" '$1 == m { print (m == "block" ? $3 : $2); exit }' "$out/bench_${preset}_profiled.txt")
  [[ -n "$ms" ]] && step_ms+=(--step-ms "$m=$ms")
done

# Every mode at the micro-batch of the run above (with --batch auto, as for
# 1b3, one mode alone could fit a larger one).
batch=$(grep -o ' B=[0-9]*' "$out/bench_${preset}_profiled.txt" | head -1 | cut -d= -f2)
[[ -n "$batch" ]] || { echo "error: no B= in $out/bench_${preset}_profiled.txt" >&2; exit 1; }
profiles=()
for m in $modes; do
  echo "==> ncu: $preset $m, $steps step(s)"
  t0=$(date +%s)
  if timeout "$limit" "$ncu" --profile-from-start off --clock-control none --cache-control none \
       --metrics "$metrics" --csv --page raw --print-kernel-base function \
       --log-file "$out/ncu_${preset}_${m}.csv" \
       "$bin" bench --device cuda --preset "$preset" --batch "$batch" --mode "$m" --steps "$steps" \
       --warmup 2 >/dev/null; then
    echo "    $(grep -c '^"[0-9]' "$out/ncu_${preset}_${m}.csv" || true) kernels in $(( $(date +%s) - t0 )) s"
    profiles+=("$m=$out/ncu_${preset}_${m}.csv")
  else
    echo "    $m: not profiled (ncu failed or passed --limit $limit s; see $out/ncu_${preset}_${m}.csv)"
  fi
  save
done
[[ ${#profiles[@]} -gt 0 ]] || { echo "error: no mode was profiled" >&2; exit 1; }
python3 scripts/ncu_summary.py --steps "$steps" "${step_ms[@]}" "${profiles[@]}" \
  | tee "$out/profile_${preset}.md"
save
