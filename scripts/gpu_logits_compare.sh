#!/usr/bin/env bash
# Does training with bf16 logits (training.logits = "bf16", the default of a
# bf16 run) train as well as with fp32 logits? Three bf16 runs of the 124M
# model (configs/gpu_124m.json's model, V = 50304) on real text, 400 steps of
# 8 x 1024 tokens each:
#   fp32_s1   fp32 logits, training.seed = 1
#   bf16_s1   bf16 logits, training.seed = 1   (same init, same data order)
#   fp32_s2   fp32 logits, training.seed = 2   (the seed-to-seed yardstick)
# training.seed sets the weight initialisation and, with data.shuffle = true
# (set here), the order of the training sequences; the validation batches are
# the same for every run. Prints (and writes to the output folder's logits_compare.txt) the
# train loss (mean of each 25-step window) and the val loss at every 25 steps
# with |bf16 - fp32| beside |seed 2 - seed 1|, then a summary: the mean
# absolute difference of the per-step train loss over the last 100 steps and
# the final val loss of each run. Each run's metrics.jsonl and log are kept
# under <out>/<run>/; with $OUT set (the device tool) all of it is packed into
# $OUT/gpu_logits_compare.tgz (after every run, and on exit).
#
# Text: the Brown corpus encoded with GPT-2's vocabulary (ids < 50257 <= V),
# prepared on a machine that has data/brown/raw and data/gpt2 (scripts/
# prepare_brown.sh, scripts/fetch_gpt2.sh), once:
#   build/attnres tokenize encode --tokenizer data/gpt2/encoder.json \
#     --input data/brown/raw --format brown --output-dir .shards/brown_gpt2 \
#     --val-fraction 0.05 --name brown
# (~1.5M training tokens, so 400 x 8192 tokens are ~2 epochs.) .shards/ is
# git-ignored: a GPU machine that gets the working tree needs it carried:
#   carry: [".shards/brown_gpt2"]   (plus "build-gpu" if it was built elsewhere)
#
# Usage (on the GPU machine, after a scripts/gpu_check.sh stage's binaries step made build-gpu/):
#   scripts/gpu_logits_compare.sh [--bin build-gpu/attnres] [--data .shards/brown_gpt2]
#                                 [--out DIR (default build-gpu/logits)]
#                                 [--steps 400]
#   scripts/gpu_logits_compare.sh --cpu-smoke [--bin build/attnres]
# --cpu-smoke checks this script's mechanics without a GPU: a tiny model on the
# cpu in fp32 (so fp32 logits in all three runs; "bf16_s1" is then a repeat of
# fp32_s1 and its difference 0), 10 steps. Expected GPU time: ~12 s per run at
# ~25 ms per step, ~1 minute in all with start-up and evaluation (not yet run).
set -euo pipefail
cd "$(dirname "$0")/.."

bin="" data=.shards/brown_gpt2 out="" steps="" smoke=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --cpu-smoke) smoke=1; shift ;;
    *) echo "usage: $0 [--bin PATH] [--data DIR] [--out DIR] [--steps N] [--cpu-smoke]" >&2; exit 2 ;;
  esac
done
if [[ $smoke -eq 1 ]]; then
  bin="${bin:-build/attnres}" out="${out:-build/logits_smoke}" steps="${steps:-10}"
  window=2 last=5
  # A tiny model with the real vocabulary, on the cpu (fp32 only).
  setup=(--model.d_model=64 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=4
         --model.d_ff=128 --model.residual='{"mode":"block","n_blocks":2}'
         --training.device=cpu --training.precision=fp32 --training.micro_batch_size=2
         --training.seq_len=64 --schedule.warmup_steps=2 --eval.every=2 --eval.batches=2)
  logits=(fp32 fp32 fp32)
else
  bin="${bin:-build-gpu/attnres}" out="${out:-build-gpu/logits}" steps="${steps:-400}"
  window=25 last=100
  setup=(--training.micro_batch_size=8 --schedule.warmup_steps=40 --eval.every=25
         --eval.batches=8)
  logits=(fp32 bf16 fp32)
fi
[[ -x $bin ]] || { echo "error: no $bin (build it, or pass --bin)" >&2; exit 2; }
source scripts/gpu_lib.sh
if [[ $smoke -eq 0 ]]; then
  use_deps || exit 2  # the libraries build-gpu/attnres was linked against
  # The device tool returns at most 8 files: the runs' folders travel packed,
  # after every run and on any exit, so a stopped command returns what ran.
  trap 'pack_to_out gpu_logits_compare "$out"' EXIT
fi
ls "$data"/brown_train_*.bin "$data"/brown_val_*.bin >/dev/null 2>&1 ||
  { echo "error: no brown_train_*.bin / brown_val_*.bin in $data (see the top of $0)" >&2; exit 2; }
[[ $steps -gt $last ]] || { echo "error: --steps must exceed $last" >&2; exit 2; }
mkdir -p "$out"

names=(fp32_s1 bf16_s1 fp32_s2)
seeds=(1 1 2)
for i in 0 1 2; do
  run="$out/${names[$i]}"
  rm -rf "$run"
  echo "==> ${names[$i]}: ${logits[$i]} logits, seed ${seeds[$i]}, $steps steps"
  start=$SECONDS
  "$bin" train configs/gpu_124m.json "${setup[@]}" \
    --training.steps="$steps" --training.grad_accum=1 --training.seed="${seeds[$i]}" \
    --training.logits="${logits[$i]}" \
    --data.train="$data/brown_train_*.bin" --data.val="$data/brown_val_*.bin" --data.shuffle=true \
    --checkpoint.dir= --checkpoint.resume=never --run.dir="$run" --run.log_every=1 \
    > "$out/${names[$i]}.log" 2>&1 || { tail -20 "$out/${names[$i]}.log"; exit 1; }
  grep -m1 "device:" "$out/${names[$i]}.log" || true
  echo "    $((SECONDS - start)) s"
  [[ $smoke -eq 1 ]] || pack_to_out gpu_logits_compare "$out"
done

python3 - "$out" "$window" "$last" "${names[@]}" <<'PY' | tee "$out/logits_compare.txt"
import json, sys

out, window, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = sys.argv[4:]  # fp32 seed 1, bf16 seed 1, fp32 seed 2

def read(name):
    train, val = {}, {}
    with open(f"{out}/{name}/metrics.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                val[r["step"]] = r["val_loss"]
            elif "loss" in r:
                train[r["step"]] = r["loss"]
    return train, val

runs = [read(n) for n in names]
steps = sorted(set.intersection(*(set(t) for t, _ in runs)))
if not steps:
    sys.exit("no common training steps in the metrics")
vals = sorted(set.intersection(*(set(v) for _, v in runs)))
ref, low, seed2 = runs

def wmean(train, end):  # mean train loss of the window of steps ending at `end`
    xs = [train[s] for s in steps if end - window < s <= end]
    return sum(xs) / len(xs)

print(f"train loss: mean of each {window}-step window; val loss at that step")
print(f"{'step':>6} | {'train ' + names[0]:>14} {names[1]:>9} {names[2]:>9} "
      f"{'|bf16-fp32|':>12} {'|s2-s1|':>9} | {'val ' + names[0]:>12} {names[1]:>9} "
      f"{names[2]:>9} {'|bf16-fp32|':>12} {'|s2-s1|':>9}")
for end in [s for s in steps if s % window == 0] or [steps[-1]]:
    a, b, c = (wmean(r[0], end) for r in runs)
    row = f"{end:6d} | {a:14.4f} {b:9.4f} {c:9.4f} {abs(b - a):12.4f} {abs(c - a):9.4f} |"
    if end in vals:
        va, vb, vc = (r[1][end] for r in runs)
        row += f" {va:12.4f} {vb:9.4f} {vc:9.4f} {abs(vb - va):12.4f} {abs(vc - va):9.4f}"
    print(row)

tail = [s for s in steps if s > steps[-1] - last]
def mad(x, y):
    return sum(abs(x[s] - y[s]) for s in tail) / len(tail)
print()
print(f"last {len(tail)} steps ({tail[0]}..{tail[-1]}), mean |difference| of the per-step train loss:")
print(f"  bf16 vs fp32 logits (seed 1): {mad(low[0], ref[0]):.4f}")
print(f"  seed 2 vs seed 1 (fp32):      {mad(seed2[0], ref[0]):.4f}")
tail_vals = [s for s in vals if s > steps[-1] - last]
if tail_vals:
    def vmad(x, y):
        return sum(abs(x[s] - y[s]) for s in tail_vals) / len(tail_vals)
    print(f"  val loss at its {len(tail_vals)} evaluations in those steps: bf16 vs fp32 "
          f"{vmad(low[1], ref[1]):.4f}, seed 2 vs seed 1 {vmad(seed2[1], ref[1]):.4f}")
if vals:
    s = vals[-1]
    print(f"final val loss (step {s}): " +
          ", ".join(f"{n} {r[1][s]:.4f}" for n, r in zip(names, runs)) +
          f"; |bf16-fp32| {abs(low[1][s] - ref[1][s]):.4f}, |s2-s1| {abs(seed2[1][s] - ref[1][s]):.4f}")
PY
