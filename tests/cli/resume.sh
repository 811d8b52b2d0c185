#!/usr/bin/env bash
# 12 steps straight == 6 steps + resume to 12: bit-identical losses (shuffled
# data, cosine schedule, grad accumulation), and eval of the final checkpoint
# reproduces the trainer's val loss. With ATTNRES_TEST_DEVICE=cuda the same on
# the GPU in bf16 ("gpu: resume", and scripts/gpu_check.sh).
source "$(dirname "$0")/lib.sh"
require_device
make_corpus
write_config

"$BIN" train base.json --checkpoint.dir=ck_a --run.dir=run_a 2>log_a.txt || { cat log_a.txt; fail "straight run"; }
"$BIN" train base.json --checkpoint.dir=ck_b --run.dir=run_b --run.stop_after=6 2>log_b.txt \
  || { cat log_b.txt; fail "first half"; }
[[ $(grep -c '"loss"' run_b/metrics.jsonl) -eq 6 ]] || fail "first half did not stop at 6 steps"
"$BIN" train base.json --checkpoint.dir=ck_b --run.dir=run_b --checkpoint.resume=auto 2>>log_b.txt \
  || { cat log_b.txt; fail "resumed half"; }

# Compare every per-step record except the timing fields.
diff <(strip_metrics run_a/metrics.jsonl) <(strip_metrics run_b/metrics.jsonl) || fail "losses differ after resume"
[[ $(grep -c '"loss"' run_a/metrics.jsonl) -eq 12 ]] || fail "expected 12 steps"
pass "12 straight == 6 + resume 6 ($(grep -c '"loss"' run_b/metrics.jsonl) identical step records)"

# eval on the final checkpoint reproduces the last val loss of the run.
want=$(grep val_loss run_a/metrics.jsonl | tail -1 | sed -E 's/.*"val_loss":([^,}]*).*/\1/')
got=$("$BIN" eval --checkpoint ck_a/step_00000012 --data 'shards/tiny_val_*.bin' --batches 2 \
      | sed -E 's/.*"loss":([^,}]*).*/\1/')
[[ "$want" == "$got" ]] || fail "eval loss $got != trainer val loss $want"
pass "attnres eval reproduces the val loss ($got)"

# generate runs with the KV cache from the checkpoint (tokenizer copied into it).
"$BIN" generate --checkpoint ck_a/step_00000012 --prompt "The quick" --tokens 10 > gen.txt \
  || fail "generate failed"
grep -q "^The quick" gen.txt || fail "generate did not echo the prompt"
pass "generate: $(head -c 80 gen.txt)"

# SIGTERM: checkpoint, then exit 128+15.
"$BIN" train base.json --training.steps=100000 --checkpoint.dir=ck_sig --run.dir=run_sig \
  --checkpoint.every=0 2>log_sig.txt &
pid=$!
wait_for 30 "the first step line in log_sig.txt" grep -qs "step " log_sig.txt
kill -TERM $pid
rc=0; wait $pid || rc=$?
[[ $rc -eq 143 ]] || { cat log_sig.txt; fail "SIGTERM exit code $rc, expected 143"; }
ls ck_sig/step_* >/dev/null 2>&1 || fail "no checkpoint after SIGTERM"
"$BIN" inspect checkpoint ck_sig/step_* >/dev/null || fail "SIGTERM checkpoint does not verify"
pass "SIGTERM wrote $(ls ck_sig) and exited 143"
echo "all resume checks passed"
