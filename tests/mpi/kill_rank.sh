#!/usr/bin/env bash
# A rank killed with SIGKILL in the middle of training ends the whole job
# within a bounded time with a non-zero exit (the launcher notices the dead
# process and stops the others; nobody hangs waiting for it), and the last
# complete checkpoint is intact and resumable. Killed: a middle stage, then
# rank 0, the one that writes checkpoints.
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config

kill_one() {  # kill_one NAME WHICH_CHILD
  local name="$1" which="$2"
  rm -rf "ck_$name" "run_$name"
  "$MPIEXEC" "$NPFLAG" 4 "${MPI_FLAGS[@]}" "$BIN" train base.json --training.steps=1000000 \
    --checkpoint.dir="ck_$name" --run.dir="run_$name" --parallel.pipeline=2 --parallel.data=2 \
    --training.grad_accum=2 --checkpoint.every=3 --checkpoint.keep_last=2 --eval.every=0 \
    >"log_$name.txt" 2>&1 &
  local mp=$!
  # Let it write a few checkpoints first (keep_last = 2 keeps two).
  # Counted once per poll: a listing taken while a checkpoint is published and
  # an old one pruned can miss an entry, so the count is not checked twice.
  two_checkpoints() {
    gone $mp && { cat "log_$name.txt"; fail "$name: job ended by itself"; }
    [[ $(ls -d ck_$name/step_* 2>/dev/null | wc -l) -ge 2 ]]
  }
  wait_for 60 "$name: 2 checkpoints" two_checkpoints
  # The ranks are the launcher's children, in rank order of their start.
  local pids=($(pgrep -P $mp | sort -n))
  [[ ${#pids[@]} -eq 4 ]] || { kill -9 $mp; fail "$name: expected 4 rank processes, found ${#pids[@]}"; }
  # Rank of each pid: its OMPI_COMM_WORLD_RANK.
  local victim=""
  for p in "${pids[@]}"; do
    r=$(tr '\0' '\n' < /proc/$p/environ | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [[ "$r" == "$which" ]] && victim=$p
  done
  [[ -n "$victim" ]] || victim=${pids[$which]}
  local start=$SECONDS
  kill -KILL "$victim"
  local rc=0
  on_wait_timeout() { kill -9 "${pids[@]}" 2>/dev/null; }
  wait_for 60 "$name: the job to end after rank $which was killed" gone $mp
  wait $mp || rc=$?
  [[ $rc -ne 0 ]] || fail "$name: job exited 0 after a rank was killed"
  # No rank survives the job (zombies waiting for their reaper count as gone).
  for p in "${pids[@]}"; do
    wait_for 10 "$name: rank process $p to exit with the job (it outlived it)" gone "$p"
  done
  unset -f on_wait_timeout
  # The newest complete checkpoint verifies and resumes (single process, one step).
  local latest
  latest=$(ls -d ck_$name/step_* | sort | tail -1)
  "$BIN" inspect checkpoint "$latest" >/dev/null || fail "$name: newest checkpoint $latest damaged"
  local step=$((10#${latest##*step_}))
  "$BIN" train base.json --checkpoint.dir="ck_$name" --run.dir="run_$name" --training.grad_accum=4 \
    --checkpoint.resume=auto --training.steps=$((step + 1)) --eval.every=0 2>"resume_$name.txt" \
    || { cat "resume_$name.txt"; fail "$name: resume from $latest failed"; }
  pass "$name: rank $which killed -> job ended in $((SECONDS - start)) s with exit $rc; $latest intact and resumable"
}

kill_one middle 2
kill_one writer 0
echo "all kill_rank checks passed"
