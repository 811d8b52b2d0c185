#!/usr/bin/env bash
# cli: sweep on slurm. A tiny sweep of 8 runs (2 sizes x baseline / Block x 2
# seeds) submitted with `attnres sweep --slurm` to a single-node Slurm that
# this test starts from Debian's packages (tests/slurm/lib.sh) and stops at the
# end. Checks: --dry-run prints the scripts and writes nothing; --status says
# "not started", then "queued" / "running" with the job, then "failed" with
# the reason for a task cancelled mid-run (scancel after its first
# checkpoint), then "done"; submitting again submits only that run, which
# resumes from its checkpoint; a task told its time is nearly over (SIGUSR1)
# saves, requeues itself and resumes; the collect job's results.csv and fits.json
# equal those of the same sweep trained here with --jobs 2.
# ATTNRES_TEST_PART=srun (its own CTest test, needs MPI in the build): runs of
# 2 ranks (a pipeline of 2) go through srun (PMIx) and give the metrics of the
# same runs started by mpirun from `sweep --jobs`.
# Skipped (exit 77, with the reason) where Slurm cannot be started: the
# packages missing, not root, or the daemons not coming up.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../cli/lib.sh"  # cds into a temp dir
source "$here/lib.sh"
part="${ATTNRES_TEST_PART:-}"
[[ -z $part || $part == srun ]] || fail "unknown ATTNRES_TEST_PART '$part' (srun, or unset)"
trap 'stop_slurm; rm -rf "$WORK"' EXIT
start_slurm "$WORK/slurm"
make_corpus

if [[ $part == srun ]]; then
  cat > srun.json <<JSON
{"out_dir": "out",
 "base": {"model": {"vocab_size": 300, "n_heads": 4, "n_kv_heads": 2, "d_model": 32, "d_ff": 64},
          "training": {"micro_batch_size": 2, "seq_len": 16, "grad_accum": 2},
          "parallel": {"pipeline": 2},
          "data": {"train": "shards/tiny_train_*.bin", "val": "shards/tiny_val_*.bin", "tokenizer": "tok.json"},
          "checkpoint": {"every": 10}, "eval": {"batches": 2}, "run": {"log_every": 5}},
 "sizes": [{"name": "a", "model": {"n_layers": 2}, "tokens": [1280]}],
 "modes": [{"mode": "baseline"}, {"mode": "block", "block_size": 2}]}
JSON
  "$BIN" sweep srun.json --slurm 2> sub.err || { cat sub.err; fail "--slurm of 2-rank runs"; }
  grep -q "submitted job array [0-9]*: 2 task(s) of 2 rank(s)" sub.err || { cat sub.err; fail "no array of 2-rank tasks"; }
  grep -q "^srun --ntasks=2 " out/slurm/sweep_1.sbatch || { cat out/slurm/sweep_1.sbatch; fail "the script does not use srun"; }
  queue_empty() { [[ -z $(squeue --noheader) ]]; }
  wait_for 120 "Slurm's queue to empty (both 2-rank tasks ended)" queue_empty
  "$BIN" sweep srun.json --status > st.txt 2>&1
  tail -1 st.txt | grep -qx "2 done" || { cat st.txt out/slurm/*.out; tail -20 out/runs/*/train.log; fail "2-rank runs under srun not done"; }
  grep -q "2 pipeline stages" out/runs/a_baseline_1.28k/train.log || fail "the srun task did not run 2 stages"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "$BIN" sweep srun.json --jobs 2 --no-plots --out_dir=local > /dev/null 2> local.err || { tail -20 local.err; fail "the same runs through mpirun"; }
  for r in a_baseline_1.28k a_block_s2_1.28k; do
    diff <(strip_metrics out/runs/$r/metrics.jsonl) <(strip_metrics local/runs/$r/metrics.jsonl) \
      || fail "$r: srun's metrics differ from mpirun's"
  done
  pass "2-rank runs (pipeline of 2) as Slurm tasks through srun: metrics equal to the same runs under mpirun"
  exit 0
fi

# Size b is slow enough (3000 steps, about 8 s; a checkpoint every 200) to be cancelled
# mid-run; size a is quick.
sweep_json() {
cat <<JSON
{"out_dir": "$1",
 "base": {"model": {"vocab_size": 300, "n_heads": 4, "n_kv_heads": 2},
          "optimizer": {"lr": 3e-3},
          "schedule": {"type": "cosine"},
          "training": {"micro_batch_size": 2, "seq_len": 16},
          "data": {"train": "shards/tiny_train_*.bin", "val": "shards/tiny_val_*.bin",
                   "shuffle": true, "tokenizer": "tok.json"},
          "checkpoint": {"every": 200, "keep_last": 1},
          "eval": {"batches": 2},
          "run": {"log_every": 10, "depth_stats_every": 0}},
 "sizes": [{"name": "a", "model": {"d_model": 32, "n_layers": 2, "d_ff": 64}, "tokens": [1280]},
           {"name": "b", "model": {"d_model": 64, "n_layers": 4, "d_ff": 128}, "tokens": [96000]}],
 "modes": [{"mode": "baseline"}, {"mode": "block", "block_size": 2}],
 "seeds": [1, 2],
 "warmup_fraction": 0.1}
JSON
}
sweep_json out > sweep.json
sweep_json local > local.json

status() { "$BIN" sweep sweep.json --status 2>&1; }
show_logs() {
  status || true
  for f in out/slurm/*.out "$SLURM_DIR"/slurmctld.log; do [[ -f $f ]] && { echo "== $f"; tail -15 "$f"; }; done
  for f in out/runs/*/train.log; do echo "== $f"; tail -5 "$f"; done
}
on_wait_timeout() { show_logs; }  # wait_for's (tests/cli/lib.sh)

# --- Slurm options need --slurm; a layout that is not the runs' is refused.
expect_error "--partition without --slurm" "need --slurm" "$BIN" sweep sweep.json --partition debug
expect_error "--ranks-per-run 2 for 1-rank runs" "--ranks-per-run 2" \
  "$BIN" sweep sweep.json --slurm --ranks-per-run 2 --dry-run

# --- Before anything: every run "not started".
status > st0.txt
[[ $(grep -cE "^ +[^ ]+ +not started$" st0.txt) -eq 8 ]] || { cat st0.txt; fail "--status before submission: 8 not started"; }
grep -q "not submitted to Slurm" st0.txt || { cat st0.txt; fail "--status: no word on Slurm"; }
pass "--status before submission: 8 runs not started"

# --- --dry-run: the scripts, nothing written or submitted.
"$BIN" sweep sweep.json --slurm --dry-run --time 10:00 --sbatch --comment=attnres-test > dry.txt 2>dry.err \
  || { cat dry.err; fail "--slurm --dry-run"; }
for want in "#SBATCH --array=0-7" "#SBATCH --export=NONE" "#SBATCH --requeue" "#SBATCH --time=10:00" \
            "#SBATCH --comment=attnres-test" "train \"\$dir/config.json\"" "sweep --finish" \
            "--report" "'b_block_s2_96k_s2'"; do
  grep -qF -- "$want" dry.txt || { cat dry.txt; fail "--dry-run scripts lack '$want'"; }
done
[[ ! -e out ]] || fail "--dry-run wrote $(find out | head -3)"
[[ -z $(squeue --noheader) ]] || fail "--dry-run submitted a job"
pass "--slurm --dry-run prints the array and collect scripts, writes and submits nothing"

# The submitting user's OpenBLAS settings go to the tasks (--export=NONE
# otherwise drops them): the same kernels, so the same bits, as a local run.
# A kernel choice attnres made itself is not carried: each node chooses.
env OPENBLAS_CORETYPE=Sandybridge OPENBLAS_L2_SIZE=1024 "$BIN" sweep sweep.json --slurm --dry-run \
  > dry_blas.txt 2>/dev/null || fail "--slurm --dry-run with OPENBLAS_CORETYPE"
grep -q "^export OPENBLAS_CORETYPE=.*Sandybridge" dry_blas.txt && grep -q "^export OPENBLAS_L2_SIZE=.*1024" dry_blas.txt \
  || { grep export dry_blas.txt; fail "the user's OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are not exported to the tasks"; }
env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=SkylakeX ATTNRES_BLAS_CHOICE="SkylakeX: a test's" \
  "$BIN" sweep sweep.json --slurm --dry-run > dry_ours.txt 2>/dev/null || fail "--slurm --dry-run (attnres's kernels)"
grep -q "OPENBLAS" dry_ours.txt && { grep OPENBLAS dry_ours.txt; fail "a kernel choice attnres made is carried to the tasks"; }
pass "--slurm: the user's OpenBLAS settings are exported to the tasks, attnres's own choice is not"

# --- Submit: one array of 8 tasks and a collect job.
"$BIN" sweep sweep.json --slurm > sub1.txt 2> sub1.err || { cat sub1.err; show_logs; fail "--slurm"; }
grep -q "submitted job array [0-9]*: 8 task(s) of 1 rank(s)" sub1.err || { cat sub1.err; fail "no array submitted"; }
array=$(grep -o "submitted job array [0-9]*" sub1.err | grep -o "[0-9]*$")
status > st1.txt
# 2 CPUs: two tasks run, the others wait (or some are done already).
grep -qE " (queued|running) .*job ${array}_" st1.txt || { cat st1.txt; fail "--status after submission: no queued or running task"; }
grep -qE "^ +[^ ]+ +not started" st1.txt && { cat st1.txt; fail "--status after submission: a run not started and not queued"; }
pass "submitted array $array; --status: $(tail -1 st1.txt)"

# --- Cancel a size-b task once it has a checkpoint, mid-run.
# running_b_run [EXCEPT]: sets victim and task to a size-b run that is running
# with a checkpoint (not EXCEPT), in the first half of its steps (so that it is
# still running when the signal comes), and its Slurm task, from one --status.
victim="" task=""
running_b_run() {
  local line
  line=$(status | awk -v x="${1:-}" '$1 ~ /^b_/ && $1 != x && $2 == "running" && / job [0-9]+_[0-9]+/ &&
                                      match($0, /step [0-9]+\/[0-9]+/) {
                                        split(substr($0, RSTART + 5, RLENGTH - 5), s, "/")
                                        if (2 * s[1] < s[2] + 0) print
                                      }' | head -1)
  [[ -n $line ]] || return 1
  victim=$(awk '{print $1}' <<< "$line")
  task=$(grep -o "job [0-9]*_[0-9]*" <<< "$line" | cut -d' ' -f2)
  compgen -G "out/runs/$victim/ckpt/step_*" >/dev/null
}
wait_for 300 "a size-b run running with a checkpoint" running_b_run
scancel "$task"
echo "cancelled $victim (task $task) at $(status | awk -v r="$victim" '$1 == r')"
not_in_queue() { [[ -z $(squeue --noheader --array --jobs="$task" 2>/dev/null | grep -v " CG ") ]]; }
wait_for 60 "task $task leaving the queue" not_in_queue
wait_for 30 "$victim reported failed" bash -c "[[ \$('$BIN' sweep sweep.json --status 2>&1 | awk -v r='$victim' '\$1 == r {print \$2}') == failed ]]"
status > st2.txt
grep -E "^ +$victim +failed +step [0-9]+/3000: .*the task ended with signal 15" st2.txt \
  || { cat st2.txt; show_logs; fail "--status: the cancelled run is not failed with the reason"; }
pass "--status after scancel: $(grep -E "^ +$victim" st2.txt | sed 's/  */ /g')"

# --- Another size-b run is told its time limit is near: it saves, stops and
# requeues itself, and the requeued task resumes. Slurm's --signal=B:USR1@300
# ends with slurmstepd sending SIGUSR1 to the batch shell alone; the test does
# that last step itself, to the shell `scontrol listpids` names (local id 0 of
# the batch step). Not `scancel --batch --signal=USR1 A_T`: Slurm 22.05's
# controller delivers it but answers "Job can not be altered now, try again
# later" while the array still has pending tasks (job_str_signal sets that
# error for the pending part of the array whatever the task asked for), and
# scancel then resends the signal every 5-6 s, up to 10 times: a second USR1
# to the requeued task once it runs again, and a failed scancel if it is still
# pending at the last try (docs/testing.md, "Tests that start processes").
first=$victim first_task=$task
wait_for 60 "a second size-b run running with a checkpoint" running_b_run "$first"
victim2=$victim task2=$task victim=$first task=$first_task
task2_job=$(squeue --noheader --array --jobs="$task2" --format=%A)
shell=$(scontrol listpids "$task2_job" | awk '$3 == "batch" && $4 == "0" {print $1}')
[[ -n $shell ]] || { scontrol listpids "$task2_job"; show_logs; fail "task $task2 (job $task2_job): no batch shell in scontrol listpids"; }
kill -USR1 "$shell" || { show_logs; fail "kill -USR1 $shell (the batch shell of task $task2)"; }
requeued() { grep -q "time limit near, checkpoint saved; requeued" "out/runs/$victim2/train.log"; }
wait_for 60 "$victim2 requeued after SIGUSR1" requeued
pass "SIGUSR1 to task $task2: $victim2 $(grep -o "the task ended with .* of [0-9]*" "out/runs/$victim2/train.log"), requeued"

# --- Submit again: only the cancelled run (the others are done or queued).
"$BIN" sweep sweep.json --slurm > sub2.txt 2> sub2.err || { cat sub2.err; show_logs; fail "second --slurm"; }
grep -q "submitted job array [0-9]*: 1 task(s)" sub2.err || { cat sub2.err; fail "the second submission is not the one cancelled run"; }
grep -qF "'$victim'" out/slurm/sweep_2.sbatch || { cat out/slurm/sweep_2.sbatch; fail "sweep_2.sbatch does not train $victim"; }
pass "submitted again: $(grep -o 'submitted [0-9]* run(s).*running)' sub2.err)"

# --- Everything ends: 8 runs done, the collect jobs ran.
all_done() { [[ -z $(squeue --noheader) ]] && [[ $(status | grep -c " done ") -eq 8 ]]; }
wait_for 600 "every run done and the queue empty" all_done
status > st3.txt
tail -1 st3.txt | grep -qx "8 done" || { cat st3.txt; fail "--status at the end"; }
grep -q "resumed from .*/step_[0-9]* at step [1-9]" "out/runs/$victim/train.log" || { tail -20 "out/runs/$victim/train.log"; fail "$victim did not resume from its checkpoint"; }
[[ -f out/results.csv && -f out/fits.json ]] || { show_logs; fail "the collect job wrote no results.csv / fits.json"; }
pass "all 8 done; $victim $(grep -m1 -o "resumed from .*" "out/runs/$victim/train.log")"
grep -q "Slurm task $task2 .*(restart 1)" "out/runs/$victim2/train.log" \
  && grep -q "resumed from .*/step_[0-9]* at step [1-9]" "out/runs/$victim2/train.log" \
  || { cat "out/runs/$victim2/train.log" | grep -v "info step"; fail "$victim2: the requeued task did not resume"; }
grep -q "Slurm task $task2 .*(restart 2)" "out/runs/$victim2/train.log" \
  && { grep "Slurm task" "out/runs/$victim2/train.log"; fail "$victim2 was requeued twice: one SIGUSR1 should requeue it once"; }
pass "the requeued task $task2 ran again (restart 1): $victim2 $(grep -m1 -o "resumed from .*" "out/runs/$victim2/train.log")"

# --- The same sweep trained here, 2 at a time: the same results and fits.
"$BIN" sweep local.json --jobs 2 --no-plots > /dev/null 2> local.err || { tail -20 local.err; fail "local sweep"; }
wallless() { cut -d, -f1-$(($(head -1 "$1" | tr ',' '\n' | grep -n '^wall_sec$' | cut -d: -f1) - 1)) "$1"; }
diff <(wallless out/results.csv) <(wallless local/results.csv) || fail "results.csv differs from the local sweep's"
diff out/fits.json local/fits.json || fail "fits.json differs from the local sweep's"
for r in $(ls out/runs); do
  diff <(strip_metrics out/runs/$r/metrics.jsonl | sort -u) <(strip_metrics local/runs/$r/metrics.jsonl | sort -u) > /dev/null \
    || fail "$r: its metrics differ from the local sweep's"
done
pass "results.csv, fits.json and every run's metrics equal the local --jobs 2 sweep's"

# --- Nothing left to submit.
"$BIN" sweep sweep.json --slurm > sub3.txt 2>&1 || { cat sub3.txt; fail "third --slurm"; }
grep -q "nothing to submit: 8 of 8 runs complete" sub3.txt || { cat sub3.txt; fail "third --slurm submitted"; }
pass "a complete sweep submits nothing"
