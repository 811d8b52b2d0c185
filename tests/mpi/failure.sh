#!/usr/bin/env bash
# Failures under mpirun end the whole job, non-zero, with the failing rank's
# message, within a bounded time (never a silent hang); configuration
# mismatches are refused before any work; SIGTERM stops every rank after the
# same step, with a checkpoint.
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config

# expect_fail NAME NEEDLE cmd...: cmd must exit non-zero within 120 s and print NEEDLE.
expect_fail() {
  local name="$1" needle="$2"; shift 2
  local rc=0 start=$SECONDS
  timeout 120 "$@" >out.txt 2>err.txt || rc=$?
  [[ $rc -ne 124 ]] || fail "$name: still running after 120 s (a hang)"
  [[ $rc -ne 0 ]] || { cat err.txt; fail "$name: exit code 0"; }
  grep -qF -- "$needle" err.txt || { cat err.txt; fail "$name: message lacks '$needle'"; }
  pass "$name -> exit $rc in $((SECONDS - start)) s: $(grep -m1 -F -- "$needle" err.txt)"
}

NP2=("$MPIEXEC" "$NPFLAG" 2 "${MPI_FLAGS[@]}")

# A rank that throws while the others wait for it in a collective.
expect_fail "one rank throws" "rank 1: test failed with an exception: injected failure on purpose" \
  "${NP2[@]}" "$TEST_MPI" "[abort]"

# Only rank 0 fails (it writes checkpoints; the target is a file), rank 1 waits for it.
touch not_a_dir
expect_fail "rank 0 cannot write its checkpoint" "rank 0: not_a_dir: cannot create checkpoint directory" \
  "${NP2[@]}" "$BIN" train base.json --parallel.pipeline=2 --checkpoint.dir=not_a_dir --run.dir=run_f

# Layout and job size must agree.
expect_fail "P*D != processes" "parallel.pipeline * parallel.data = 4 * 1 = 4 processes, but the job has 2" \
  "${NP2[@]}" "$BIN" train base.json --parallel.pipeline=4 --checkpoint.dir=ck_x --run.dir=run_x
expect_fail "P*D = 1 under mpirun -np 2" "= 1 processes, but the job has 2" \
  "${NP2[@]}" "$BIN" train base.json --checkpoint.dir=ck_x --run.dir=run_x
# Bad input that every rank meets alike is reported once (by rank 0), not once per rank.
NP4=("$MPIEXEC" "$NPFLAG" 4 "${MPI_FLAGS[@]}")
expect_fail "too many chunks, 4 ranks" "16 chunks exceed model.n_layers = 8" \
  "${NP4[@]}" "$BIN" train base.json --parallel.pipeline=4 --parallel.virtual_stages=4 \
  --checkpoint.dir=ck_x --run.dir=run_x
[[ $(grep -c "chunks exceed" err.txt) -eq 1 ]] || { cat err.txt; fail "the error was printed $(grep -c "chunks exceed" err.txt) times"; }
pass "... printed once"
expect_fail "P = 2 without mpirun" "start the job with mpirun -np 2" \
  "$BIN" train base.json --parallel.pipeline=2 --checkpoint.dir=ck_x --run.dir=run_x
[[ ! -e ck_x && ! -e run_x/metrics.jsonl ]] || fail "a refused job wrote files"
expect_fail "interleaving without a pipeline" "parallel.virtual_stages" \
  "$BIN" train base.json --parallel.virtual_stages=2 --checkpoint.dir=ck_x --run.dir=run_x
expect_fail "M % P with V > 1" "training.grad_accum" \
  "$BIN" train base.json --parallel.pipeline=3 --parallel.virtual_stages=2 --checkpoint.dir=ck_x

# SIGTERM: every rank stops after the same step (a signal that reaches only
# some ranks is shared by a reduction each step), rank 0 writes a checkpoint
# of that step. sigterm NAME TARGET: TARGET "launcher" (mpirun forwards the
# signal to all ranks, and exits non-zero itself) or a rank number (the job
# then exits 128 + 15 like a single process).
sigterm() {
  local name="$1" target="$2"
  "$MPIEXEC" "$NPFLAG" 4 "${MPI_FLAGS[@]}" "$BIN" train base.json --training.steps=1000000 \
    --checkpoint.dir=ck_$name --run.dir=run_$name --parallel.pipeline=4 --checkpoint.every=0 \
    --eval.every=0 >log_$name.txt 2>&1 &
  local mp=$! rc=0
  wait_for 60 "$name: step 5 in log_$name.txt" grep -qs "step      5/" log_$name.txt
  if [[ "$target" == launcher ]]; then
    kill -TERM $mp
  else
    local p
    for p in $(pgrep -P $mp); do
      [[ $(tr '\0' '\n' < /proc/$p/environ | sed -n 's/^OMPI_COMM_WORLD_RANK=//p') == "$target" ]] && kill -TERM $p
    done
  fi
  wait_for 60 "$name: the job to end after SIGTERM" gone $mp
  wait $mp || rc=$?
  [[ $rc -ne 0 ]] || fail "$name: exit code 0 after SIGTERM"
  [[ "$target" == launcher || $rc -eq 143 ]] || { tail -20 log_$name.txt; fail "$name: exit code $rc, expected 143"; }
  grep -q "received SIGTERM: stopping after step" log_$name.txt || { tail log_$name.txt; fail "$name: no orderly stop"; }
  local latest last_step
  latest=$(ls -d ck_$name/step_* | tail -1)
  "$BIN" inspect checkpoint "$latest" >/dev/null || fail "$name: checkpoint $latest does not verify"
  last_step=$(grep -o '"step":[0-9]*' run_$name/metrics.jsonl | tail -1 | cut -d: -f2)
  [[ "$latest" == "ck_$name/step_$(printf %08d "$last_step")" ]] || fail "$name: checkpoint $latest is not the last step $last_step"
  pass "$name: SIGTERM to $target -> all ranks stopped after step $last_step, wrote $latest, exit $rc"
}
sigterm sig_rank 2
sigterm sig_launcher launcher
echo "all failure checks passed"
