#!/usr/bin/env bash
# eval.tasks under mpirun: the questions' rows are split across the data
# replicas (microbatch g to replica g mod D) and scored on the last pipeline
# stage; the scores equal the single process's. All runs start from the same
# checkpoint and take one step at lr 1e-30, which leaves every weight as it
# was, so every layout evaluates the same weights: the task records must be
# identical, and equal `attnres eval --task` on that checkpoint.
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config
# 13 questions, 51 rows: 17 microbatches of 3 rows, 9 on replica 0, 8 on replica 1.
"$PY" "$SRC/tests/cli/make_hellaswag.py" hs.jsonl 13 corpus/doc3.txt

"$BIN" train base.json --checkpoint.dir=ck_init --run.dir=run_init --training.steps=6 2>log_init.txt \
  || { cat log_init.txt; fail "training the checkpoint"; }
init=ck_init/step_00000006
eval_args=(--model.init_from=$init --optimizer.lr=1e-30 --training.steps=1 --training.seq_len=32
           --training.micro_batch_size=3 --training.grad_accum=2 --eval.every=1
           --eval.tasks=hellaswag:hs.jsonl --checkpoint.dir=)
records() { grep '"task"' "$1/metrics.jsonl"; }

"$BIN" train base.json "${eval_args[@]}" --run.dir=run_1 2>log_1.txt || { cat log_1.txt; fail "single process"; }
[[ $(records run_1 | wc -l) -eq 1 ]] || fail "single process: expected 1 task record"
got=$("$BIN" eval --checkpoint $init --task hellaswag --data hs.jsonl --seq-len 32 --batch-size 3 2>/dev/null)
acc=$(records run_1 | sed -E 's/.*("acc":[^,]*,"acc_norm":[^,]*,"examples":[0-9]*).*/\1/')
[[ "$got" == *"$acc"* ]] || fail "single process $acc != attnres eval's $got"
pass "single process: $acc, = attnres eval --task on the checkpoint"

for args in "--parallel.data=2 --training.grad_accum=1" "--parallel.pipeline=2" \
            "--parallel.pipeline=2 --parallel.data=2 --training.grad_accum=1"; do
  P=1; D=1
  [[ "$args" == *pipeline=2* ]] && P=2
  [[ "$args" == *data=2* ]] && D=2
  rm -rf run_p
  run_np $((P * D)) "$BIN" train base.json "${eval_args[@]}" --run.dir=run_p $args 2>log_p.txt \
    || { cat log_p.txt; fail "mpirun $args"; }
  diff <(records run_1) <(records run_p) || fail "$args: task scores differ from the single process"
  [[ $(grep -c "hellaswag acc" log_p.txt) -eq 1 ]] || fail "$args: progress not printed once"
  pass "$args ($((P * D)) ranks): the same task record as the single process"
done
echo "all eval.tasks mpi checks passed"
