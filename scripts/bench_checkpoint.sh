#!/usr/bin/env bash
# What a checkpoint costs the training loop: the same short run with
# checkpoint.async = true and false, saving every few steps, and the
# "checkpoint" records of metrics.jsonl summed up (train/checkpoint_save.h):
# the time training stood still (stall), the time to durable files (write),
# the bytes, and the largest resident / peak memory of any rank.
#
#   scripts/bench_checkpoint.sh [--np N] [--pipeline P] [--data D] [--zero Z]
#                               [--size 28m|300m] [--steps S] [--every E] [--dir DIR]
#
# --size 28m: d 512, 8 layers, 29.5M parameters; 300m: d 1024, 24 layers,
# 316M parameters (~3.8 GB per checkpoint with the moments); both Block
# AttnRes, vocabulary 4096, on the Brown shards of scripts/prepare_brown.sh,
# micro-batch 1 x 64 tokens (the step is short; the save is what is measured).
# Several ranks: mpirun -np N (N = P x D), as root with --allow-run-as-root,
# and --oversubscribe. Prints one line per mode: the saves during training
# (the one at the last step ends the run, which waits for all of it), the
# ratio stall / write, and the memory.
set -euo pipefail
cd "$(dirname "$0")/.."
np=1 P=1 D=1 zero=0 size=28m steps=9 every=3 dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --np) np=$2; shift 2 ;;
    --pipeline) P=$2; shift 2 ;;
    --data) D=$2; shift 2 ;;
    --zero) zero=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_checkpoint.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
((np == P * D)) || { echo "bench_checkpoint.sh: --np $np is not --pipeline $P x --data $D" >&2; exit 2; }
case "$size" in
  28m) model='"d_model": 512, "n_layers": 8, "n_heads": 8, "n_kv_heads": 4, "d_ff": 1376' ;;
  300m) model='"d_model": 1024, "n_layers": 24, "n_heads": 16, "n_kv_heads": 8, "d_ff": 2816' ;;
  *) echo "bench_checkpoint.sh: --size is 28m or 300m" >&2; exit 2 ;;
esac
ls data/brown/brown_train_*.bin >/dev/null 2>&1 || scripts/prepare_brown.sh
work=${dir:-$(mktemp -d /tmp/attnres_bench_ckpt.XXXXXX)}
mkdir -p "$work"
[[ -n $dir ]] || trap 'rm -rf "$work"' EXIT
cat > "$work/cfg.json" <<JSON
{"model": {"vocab_size": 4096, $model, "residual": {"mode": "block", "n_blocks": 4}},
 "training": {"steps": $steps, "micro_batch_size": 1, "seq_len": 64, "grad_accum": $P, "seed": 1},
 "parallel": {"pipeline": $P, "data": $D, "zero": $zero},
 "data": {"train": "$PWD/data/brown/brown_train_*.bin"},
 "checkpoint": {"every": $every, "keep_last": 2},
 "eval": {"every": 0}, "run": {"log_every": 1}}
JSON
launch=(build/attnres)
if ((np > 1)); then
  launch=(mpirun -np "$np" --oversubscribe)
  [[ $(id -u) -eq 0 ]] && launch+=(--allow-run-as-root)
  launch+=(build/attnres)
fi
echo "model $size, P=$P x D=$D (zero=$zero), $steps steps, a save every $every; in $work"
for async in true false; do
  rm -rf "$work/ck_$async" "$work/run_$async"
  "${launch[@]}" train "$work/cfg.json" --checkpoint.dir="$work/ck_$async" --run.dir="$work/run_$async" \
    --checkpoint.async=$async 2> "$work/log_$async.txt" || { tail -20 "$work/log_$async.txt"; exit 1; }
  python3 - "$work/run_$async/metrics.jsonl" "$async" "$steps" <<'PY'
import json, sys
path, mode, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = [json.loads(l) for l in open(path) if '"event":"checkpoint"' in l]
run_sec = max(json.loads(l)["elapsed_sec"] for l in open(path) if '"loss"' in l)
# The save at the last step ends the run: nothing trains beside it, so the
# end waits for all of it. The saves during training are the measure.
during = [r for r in recs if r["step"] < last]
stall, write = sum(r["stall_sec"] for r in during), sum(r["write_sec"] for r in during)
print(f"async={mode:5s}: {len(during)} saves during training, {recs[0]['bytes'] / 1e6:.0f} MB each: "
      f"stall {stall:.2f} s of write {write:.2f} s (stall / write {stall / write:.3f}); "
      f"largest resident {max(r['resident_mib'] for r in recs):.0f} MiB, peak during a save "
      f"{max(r['peak_rss_mib'] for r in recs):.0f} MiB; {len(recs)} saves in all, run {run_sec:.1f} s")
ranks = [max(col) for col in zip(*(r["rank_peak_rss_mib"] for r in recs))]
print("   peak during a save, by rank: " + ", ".join(f"{m:.0f}" for m in ranks) + " MiB")
PY
done
