#!/usr/bin/env bash
# Checkpoints are layout-independent: a run stopped under one layout and
# resumed under another (P=4 -> P=2 x V=2; P=2 x D=2 -> P=2 x D=1; and a
# parallel checkpoint resumed by a single process) gives the same per-step
# losses as an uninterrupted single-process run (relative 1e-5). The global
# batch stays the same: grad_accum * data is kept constant.
source "$(dirname "$0")/lib.sh"
reference_run

# P=4 (4 steps) -> P=2 x V=2 (steps 5..8).
run_np 4 "$BIN" train base.json --checkpoint.dir=ck_a --run.dir=run_a --parallel.pipeline=4 \
  --run.stop_after=4 2>log_a.txt || { cat log_a.txt; fail "P=4 first half"; }
[[ $(grep -c '"loss"' run_a/metrics.jsonl) -eq 4 ]] || fail "P=4 did not stop after 4 steps"
"$BIN" inspect checkpoint ck_a/step_00000004 >/dev/null || fail "P=4 checkpoint does not verify"
run_np 2 "$BIN" train base.json --checkpoint.dir=ck_a --run.dir=run_a --parallel.pipeline=2 \
  --parallel.virtual_stages=2 --checkpoint.resume=auto 2>>log_a.txt || { cat log_a.txt; fail "P=2 V=2 resume"; }
grep -q "resumed from ck_a/step_00000004" log_a.txt || fail "P=2 V=2 did not resume from step 4"
compare_losses run_s/metrics.jsonl run_a/metrics.jsonl 1e-5 || fail "P=4 -> P=2 x V=2 losses differ"
pass "P=4 -> P=2 x V=2 resume matches the uninterrupted run"

# P=2 x D=2 (grad_accum 2) -> P=2 x D=1 (grad_accum 4).
run_np 4 "$BIN" train base.json --checkpoint.dir=ck_b --run.dir=run_b --parallel.pipeline=2 \
  --parallel.data=2 --training.grad_accum=2 --run.stop_after=4 2>log_b.txt || { cat log_b.txt; fail "D=2 first half"; }
run_np 2 "$BIN" train base.json --checkpoint.dir=ck_b --run.dir=run_b --parallel.pipeline=2 \
  --checkpoint.resume=auto 2>>log_b.txt || { cat log_b.txt; fail "D=1 resume"; }
compare_losses run_s/metrics.jsonl run_b/metrics.jsonl 1e-5 || fail "D=2 -> D=1 losses differ"
pass "P=2 x D=2 -> P=2 x D=1 resume matches the uninterrupted run"

# A parallel checkpoint resumed by a single process.
mkdir -p ck_c run_c
cp -r ck_b/step_00000004 ck_c/
step_records run_b/metrics.jsonl | head -5 > run_c/metrics.jsonl  # steps 1..4 and the eval at 4
"$BIN" train base.json --checkpoint.dir=ck_c --run.dir=run_c --checkpoint.resume=auto 2>log_c.txt \
  || { cat log_c.txt; fail "single-process resume"; }
compare_losses run_s/metrics.jsonl run_c/metrics.jsonl 1e-5 || fail "parallel -> single losses differ"
pass "P=2 x D=2 checkpoint resumed by a single process matches"
# ZeRO-1 does not change the checkpoint: P=2 x D=2 with zero=1 -> D=2 with
# zero=0 -> P=2 x D=2 with zero=1 again, against the uninterrupted run.
run_np 4 "$BIN" train base.json --checkpoint.dir=ck_z --run.dir=run_z --parallel.pipeline=2 \
  --parallel.data=2 --training.grad_accum=2 --parallel.zero=1 --run.stop_after=3 2>log_z.txt \
  || { cat log_z.txt; fail "zero=1 first part"; }
run_np 2 "$BIN" train base.json --checkpoint.dir=ck_z --run.dir=run_z --parallel.data=2 \
  --training.grad_accum=2 --run.stop_after=3 --checkpoint.resume=auto 2>>log_z.txt \
  || { cat log_z.txt; fail "zero=0 middle part"; }
run_np 4 "$BIN" train base.json --checkpoint.dir=ck_z --run.dir=run_z --parallel.pipeline=2 \
  --parallel.data=2 --training.grad_accum=2 --parallel.zero=1 --checkpoint.resume=auto \
  2>>log_z.txt || { cat log_z.txt; fail "zero=1 last part"; }
[[ $(grep -c "resumed from" log_z.txt) -eq 2 ]] || fail "the zero runs did not resume twice"
compare_losses run_s/metrics.jsonl run_z/metrics.jsonl 1e-5 || fail "zero=1 <-> zero=0 losses differ"
pass "P=2 x D=2 zero=1 -> D=2 zero=0 -> P=2 x D=2 zero=1 resume matches the uninterrupted run"
echo "all resume_layouts checks passed"
