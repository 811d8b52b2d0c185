#!/usr/bin/env bash
# Checks the timed pipeline simulator against measurement on this machine:
# for P in {2, 4}, V in {1, 2}, naive and cached blocks, it trains the
# quickstart model (8 layers, 8 microbatches a step) under mpirun, takes the
# median step time of the logged steps, asks `attnres inspect plan --profile
# cpu` for its prediction (chunk times measured in one process at the ranks'
# thread count), and prints both with the error. Exit 1 when any prediction
# is off by more than 15% (--tolerance PCT to change).
#   scripts/check_pipeline_model.sh [--steps 12] [--tolerance 15]
# Needs a build (scripts/build.sh) and the corpus (scripts/prepare_brown.sh 4096).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=12 tol=15
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --tolerance) tol="$2"; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--tolerance PCT]" >&2; exit 2 ;;
  esac
done
[[ -x build/attnres ]] || { echo "error: build/attnres missing: run scripts/build.sh" >&2; exit 2; }
[[ -f data/brown/tokenizer.json ]] || { echo "error: data/brown missing: run scripts/prepare_brown.sh 4096" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--model.n_layers=8 --training.grad_accum=8 --training.steps="$steps" --eval.every=0
        --checkpoint.dir="" --checkpoint.every=0 --run.log_every=1000)
bad=0
printf "%-18s %12s %12s %8s\n" layout "measured ms" "predicted ms" "error"
for P in 2 4; do
  for V in 1 2; do
    for cache in false true; do
      lay=(--parallel.pipeline=$P --parallel.virtual_stages=$V --parallel.cache_blocks=$cache)
      run="$work/P${P}V${V}$cache"
      mpirun --oversubscribe -np "$P" build/attnres train configs/quickstart.json "${common[@]}" \
        "${lay[@]}" --run.dir="$run" > "$run.log" 2>&1 || { cat "$run.log"; exit 1; }
      # Step time = tokens per step / tokens per second, median of steps 3..N.
      measured=$(grep -o '"tokens_per_sec":[0-9.e+]*' "$run/metrics.jsonl" | tail -n +3 |
                 cut -d: -f2 | awk '{print 8*8*128/$1*1000}' | sort -g |
                 awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
      predicted=$(build/attnres inspect plan configs/quickstart.json --profile cpu "${common[@]}" \
                  "${lay[@]}" | sed -n 's/.*predicted step \([0-9.]*\) ms.*/\1/p')
      err=$(awk -v m="$measured" -v p="$predicted" 'BEGIN {printf "%+.1f", 100*(p-m)/m}')
      name="P$P V$V $([[ $cache == true ]] && echo cached || echo naive)"
      printf "%-18s %12.1f %12.1f %7s%%\n" "$name" "$measured" "$predicted" "$err"
      awk -v e="$err" -v t="$tol" 'BEGIN {exit !(e > t || e < -t)}' && bad=1
    done
  done
done
if [[ $bad == 1 ]]; then echo "some prediction is off by more than $tol%"; exit 1; fi
echo "every prediction within $tol% of the measured step time"
