#!/usr/bin/env bash
# eval.tasks during training: HellaSwag-format questions scored every
# eval.every steps and at the end, one metrics.jsonl record per task and
# evaluation and a progress line; the last record equals
# `attnres eval --task` on the final checkpoint (the same runtime path, bit
# for bit); eval.task_examples limits the questions; tasks alone (no
# data.val) are something to evaluate; bad task settings are refused before
# any training.
source "$(dirname "$0")/lib.sh"
make_corpus
write_config
"$PY" "$SRC/tests/cli/make_hellaswag.py" hs.jsonl 11 corpus/doc2.txt

common=(--training.steps=10 --training.seq_len=32 --training.micro_batch_size=3 --data.shuffle=false
        --eval.every=5 --eval.tasks=hellaswag:hs.jsonl)
"$BIN" train base.json "${common[@]}" 2>log.txt || { cat log.txt; fail "training with eval.tasks"; }
[[ $(grep -c '"task":"hellaswag"' run/metrics.jsonl) -eq 2 ]] || { cat run/metrics.jsonl; fail "expected 2 task records"; }
[[ $(grep -c '"val_loss"' run/metrics.jsonl) -eq 2 ]] || fail "expected 2 val_loss records"
grep -q '"acc":[0-9.e-]*,"acc_norm":[0-9.e-]*,"examples":11,"scoring":"lm-eval","step":5,"task":"hellaswag"' run/metrics.jsonl \
  || { cat run/metrics.jsonl; fail "task record at step 5"; }
grep -q "step     10 | hellaswag acc 0\.[0-9]* | acc_norm 0\.[0-9]* (11 examples)" log.txt \
  || { grep hellaswag log.txt; fail "no progress line for the task"; }
pass "2 hellaswag records and progress lines: $(grep -m1 'hellaswag acc' log.txt | sed 's/.*| step/step/')"

# The final record is `attnres eval --task` on the final checkpoint.
acc_fields() { sed -E 's/.*"acc":([^,]*),"acc_norm":([^,]*),"examples":([0-9]*).*/\1 \2 \3/'; }
want=$(grep '"task"' run/metrics.jsonl | tail -1 | acc_fields)
got=$("$BIN" eval --checkpoint ckpt/step_00000010 --task hellaswag --data hs.jsonl 2>/dev/null \
      | acc_fields)
[[ -n "$want" && "$want" == "$got" ]] || fail "trainer's task scores '$want' != attnres eval's '$got'"
pass "attnres eval --task reproduces the trainer's scores ($got)"

# A limit, several tasks, and no data.val.
"$BIN" train base.json "${common[@]}" --data.val= --eval.task_examples=4 \
  --eval.tasks=hellaswag:hs.jsonl,hellaswag:hs.jsonl --run.dir=run_b --checkpoint.dir=ck_b 2>log_b.txt \
  || { cat log_b.txt; fail "tasks without data.val"; }
[[ $(grep -c '"examples":4' run_b/metrics.jsonl) -eq 4 ]] || { cat run_b/metrics.jsonl; fail "task_examples"; }
! grep -q val_loss run_b/metrics.jsonl || fail "val_loss without data.val"
pass "eval.task_examples = 4, two tasks, no data.val: 4 records, no val_loss"

# llm.c's scoring (eval.scoring): its record says so and equals `attnres eval --scoring llm.c`.
"$BIN" train base.json "${common[@]}" --eval.scoring=llm.c --run.dir=run_c --checkpoint.dir=ck_c 2>log_c.txt \
  || { cat log_c.txt; fail "training with eval.scoring = llm.c"; }
want=$(grep '"task"' run_c/metrics.jsonl | tail -1)
[[ $want == *'"scoring":"llm.c"'* ]] || fail "the record does not name llm.c's scoring: $want"
got=$("$BIN" eval --checkpoint ck_c/step_00000010 --task hellaswag --data hs.jsonl --scoring llm.c 2>/dev/null \
      | acc_fields)
[[ "$(acc_fields <<< "$want")" == "$got" ]] || fail "llm.c scoring: trainer's '$want' != attnres eval's '$got'"
pass "eval.scoring = llm.c: the trainer's record equals attnres eval --scoring llm.c ($got)"
expect_error "an unknown scoring" "unknown scoring 'helm'" "$BIN" train base.json "${common[@]}" \
  --eval.scoring=helm --run.dir=run_x --checkpoint.dir=ck_x

expect_error "eval.tasks without a tokenizer" "data.tokenizer" "$BIN" train base.json "${common[@]}" \
  --data.tokenizer= --run.dir=run_x --checkpoint.dir=ck_x
expect_error "an unknown task" "unknown task 'piqa'" "$BIN" train base.json "${common[@]}" \
  --eval.tasks=piqa:hs.jsonl --run.dir=run_x --checkpoint.dir=ck_x
expect_error "a missing task file" "eval.tasks: hellaswag file 'nope.jsonl'" "$BIN" train base.json "${common[@]}" \
  --eval.tasks=hellaswag:nope.jsonl --run.dir=run_x --checkpoint.dir=ck_x
expect_error "an ending longer than training.seq_len" "training.seq_len" "$BIN" train base.json \
  "${common[@]}" --training.seq_len=4 --run.dir=run_x --checkpoint.dir=ck_x
[[ ! -e run_x && ! -e ck_x ]] || fail "a rejected task config wrote files"
echo "all eval.tasks checks passed"
