#!/usr/bin/env bash
# Does `attnres bench` measure what `attnres train` runs? Both step through
# the same engine (train::Stepper: the pipeline executor, runtime and AdamW);
# this runs them on the same model shape and prints both tokens/s and their
# ratio. Bench: the median of its timed steps on fixed synthetic tokens.
# Train: the median of the per-step tokens_per_sec of metrics.jsonl (steps
# after the first 2), on real text, with data loading, the learning-rate
# schedule and logging; no evaluation, no checkpoints.
#   scripts/bench_vs_train.sh [--device cpu|cuda] [--preset 124m|350m]
#                             [--steps 12] [--rounds 3] [--bin build/attnres] [--data DIR]
# cpu (default): bench's default model (d 256, L 6, V 4096, T 256, B 8, Block
#   AttnRes S = 4) on the Brown corpus of the quickstart (data/brown, 4096
#   tokens: scripts/prepare_brown.sh 4096), fp32.
# --device cuda --preset 124m: configs/gpu_124m.json's model (Block N = 8,
#   B 16, T 1024), bf16, on Brown in GPT-2 tokens (--data .shards/brown_gpt2:
#   see the head of scripts/gpu_logits_compare.sh).
# Bench and train alternate for --rounds rounds; prints each round's pair, then
# "train / bench: R" of the medians and whether they agree within 5%; exits 0
# unless a run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
device=cpu preset="" steps=12 rounds=3 bin=build/attnres data=""
usage() { sed -n '2,/^set -euo/{/^set -euo/d;p}' "$0" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) [[ $# -ge 2 ]] || usage; device=$2; shift ;;
    --preset) [[ $# -ge 2 ]] || usage; preset=$2; shift ;;
    --steps) [[ $# -ge 2 ]] || usage; steps=$2; shift ;;
    --rounds) [[ $# -ge 2 ]] || usage; rounds=$2; shift ;;
    --bin) [[ $# -ge 2 ]] || usage; bin=$2; shift ;;
    --data) [[ $# -ge 2 ]] || usage; data=$2; shift ;;
    *) usage ;;
  esac
  shift
done
[[ $steps =~ ^[0-9]+$ && $steps -ge 5 ]] || { echo "error: --steps must be 5 or more" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "error: --rounds must be a positive integer" >&2; exit 2; }
[[ -x $bin ]] || { echo "error: $bin is not built" >&2; exit 2; }

# The shape, as bench's flags and as the trainer's config.
case "$device:$preset" in
  cpu:)
    [[ -n $data ]] || data=data/brown
    train_glob="$data/brown_train_*.bin"
    bench=(--device cpu --mode block --block-size 4)
    model='"vocab_size": 4096, "d_model": 256, "n_layers": 6, "n_heads": 8, "n_kv_heads": 4,
           "d_ff": 688, "residual": {"mode": "block", "block_size": 4}'
    B=8 T=256 precision=fp32 ;;
  cuda:124m|cuda:350m)
    [[ -n $data ]] || data=.shards/brown_gpt2
    train_glob="$data/brown_train_*.bin"
    bench=(--device cuda --preset "$preset" --mode block)
    cfg=configs/gpu_$preset.json
    model=$(python3 -c "import json,sys; print(json.dumps(json.load(open('$cfg'))['model'])[1:-1])")
    read -r B T < <(python3 -c "import json; t=json.load(open('$cfg'))['training']; print(t['micro_batch_size'], t['seq_len'])")
    precision=bf16 ;;
  *) echo "error: --device cpu (no preset) or --device cuda --preset 124m|350m" >&2; exit 2 ;;
esac
compgen -G "$train_glob" >/dev/null || { echo "error: no shards $train_glob (see this script's head)" >&2; exit 2; }

work=$(mktemp -d /tmp/attnres_bench_vs_train.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/train.json" <<JSON
{"model": {$model},
 "optimizer": {"lr": 3e-4},
 "schedule": {"type": "cosine", "warmup_steps": 2},
 "training": {"steps": $steps, "micro_batch_size": $B, "seq_len": $T, "grad_accum": 1, "seed": 1,
              "device": "$device", "precision": "$precision"},
 "data": {"train": "$train_glob", "val": "", "shuffle": true},
 "checkpoint": {"dir": ""},
 "eval": {"every": 0, "batches": 1},
 "run": {"dir": "$work/run", "log_every": 1000}}
JSON

# Rounds alternate bench and train, so that a slow spell of the machine (a
# shared VM's CPU speed drifts by 10% over a minute) falls on both sides.
: > "$work/pairs.txt"
for ((round = 1; round <= rounds; round++)); do
  echo "==> round $round/$rounds: attnres bench ${bench[*]} --steps $((steps - 2)) --warmup 2"
  "$bin" bench "${bench[@]}" --steps $((steps - 2)) --warmup 2 > "$work/bench.txt"
  grep -E "^(mode|block) " "$work/bench.txt"
  bench_tps=$(awk '/^block /{print $(NF-4); exit}' "$work/bench.txt")
  echo "==> round $round/$rounds: attnres train ($steps steps, B=$B T=$T, $device $precision)"
  rm -rf "$work/run"
  "$bin" train "$work/train.json" 2> "$work/train.log" || { tail -20 "$work/train.log"; exit 1; }
  [[ $round -gt 1 ]] || grep -E "model:|device:|cpu:" "$work/train.log" || true
  python3 - "$work/run/metrics.jsonl" "$bench_tps" >> "$work/pairs.txt" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_sec"' in l]
print(sys.argv[2], statistics.median(r["tokens_per_sec"] for r in rows[2:]))
PY
  read -r b t < <(tail -n 1 "$work/pairs.txt")
  printf '    bench %.0f tokens/s, train %.0f tokens/s (median of steps 3..%d)\n' "$b" "$t" "$steps"
done
python3 - "$work/pairs.txt" <<'PY'
import statistics, sys
pairs = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
bench = statistics.median(b for b, _ in pairs)
train = statistics.median(t for _, t in pairs)
ratio = train / bench
print(f"bench: {bench:.0f} tokens/s (median over {len(pairs)} rounds of each round's median step)")
print(f"train: {train:.0f} tokens/s (the same over its steps 3..)")
print(f"train / bench: {ratio:.3f} ({'within' if abs(ratio - 1) <= 0.05 else 'NOT within'} 5%)")
PY
