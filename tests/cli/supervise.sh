#!/usr/bin/env bash
# attnres supervise without MPI: what it does not restart (bad input, exit 2;
# a run stopped on request), how it gives up (--max-restarts), how it restarts
# (--checkpoint.resume=auto appended, ATTNRES_RESTART set, a restart record in
# metrics.jsonl), and its arguments. Random rank kills: tests/mpi/supervise.sh.
source "$(dirname "$0")/lib.sh"
make_corpus
write_config

# Bad input is not retried: one attempt, its exit status.
rc=0
"$BIN" supervise --backoff 0 -- "$BIN" train base.json --training.steps=-1 >log_bad.txt 2>&1 || rc=$?
[[ $rc -eq 2 ]] || { cat log_bad.txt; fail "a bad config: exit $rc, expected 2"; }
grep -q "not restartable" log_bad.txt || { cat log_bad.txt; fail "no 'not restartable'"; }
[[ $(grep -c "training.steps" log_bad.txt) -ge 1 && $(grep -c "restart 1 of" log_bad.txt) -eq 0 ]] \
  || { cat log_bad.txt; fail "a bad config was restarted"; }
pass "exit 2 (bad input): not restarted, its status returned"

# A command that always fails with 1: N restarts, then its status.
rc=0
"$BIN" supervise --max-restarts 2 --backoff 0 -- bash -c 'echo "attempt: $ATTNRES_RESTART $*" >> attempts.txt; exit 1' x \
  >log_fail.txt 2>&1 || rc=$?
[[ $rc -eq 1 ]] || { cat log_fail.txt; fail "always failing: exit $rc, expected 1"; }
[[ $(wc -l < attempts.txt) -eq 3 ]] || { cat attempts.txt; fail "expected 3 attempts"; }
grep -q 'attempt: {"previous_signal":0,"previous_status":1,"reason":"exit status 1","restart":2} --checkpoint.resume=auto' attempts.txt \
  || { cat attempts.txt; fail "the restarts do not get --checkpoint.resume=auto and ATTNRES_RESTART"; }
grep -q "no restart left (2 made, --max-restarts 2)" log_fail.txt || { cat log_fail.txt; fail "no give-up message"; }
pass "exit 1: restarted twice (--max-restarts 2) with --checkpoint.resume=auto and ATTNRES_RESTART, then exit 1"

# A killed run is restarted and resumes from its newest checkpoint, and the
# restart is in metrics.jsonl.
"$BIN" train base.json --checkpoint.dir=ck_s --run.dir=run_s 2>/dev/null || fail "the uninterrupted run"
cat > once.sh <<SH
#!/usr/bin/env bash
# The first attempt dies by SIGKILL in the middle of its step-8 save.
if [[ ! -e killed_once ]]; then touch killed_once; export ATTNRES_TEST_KILL_IN_SAVE=0:8; fi
exec "$BIN" "\$@"
SH
chmod +x once.sh
"$BIN" supervise --backoff 0 -- ./once.sh train base.json --checkpoint.dir=ck_k --run.dir=run_k >log_k.txt 2>&1 \
  || { cat log_k.txt; fail "supervised run"; }
grep -q "killed by signal 9" log_k.txt || { cat log_k.txt; fail "the kill is not logged"; }
grep -q '"event":"restart".*"resumed_from":"ck_k/step_00000004".*"step":4' run_k/metrics.jsonl \
  || { grep event run_k/metrics.jsonl; fail "no restart record resumed from step 4"; }
diff <(strip_metrics run_s/metrics.jsonl) <(strip_metrics run_k/metrics.jsonl) || fail "the restarted run differs"
pass "killed in the step-8 save: restarted, resumed from step 4, the same losses; the restart recorded"

# Killed twice before its first checkpoint: both restarts resume from nothing,
# and the second must not lose the first's record (a fresh start used to
# begin metrics.jsonl anew: '2 kills but 1 restart records' in mpi: supervise).
cat > twice.sh <<SH
#!/usr/bin/env bash
# The first two attempts die by SIGKILL in the middle of their first save (step 4).
n=\$(cat attempts_z 2>/dev/null || echo 0); echo \$((n + 1)) > attempts_z
if ((n < 2)); then export ATTNRES_TEST_KILL_IN_SAVE=0:4; fi
exec "$BIN" "\$@"
SH
chmod +x twice.sh
"$BIN" supervise --backoff 0 -- ./twice.sh train base.json --checkpoint.dir=ck_z --run.dir=run_z >log_z.txt 2>&1 \
  || { cat log_z.txt; fail "supervised run killed twice"; }
[[ $(grep -c '"event":"restart".*"resumed_from":"".*"step":0' run_z/metrics.jsonl) -eq 2 ]] \
  || { grep event run_z/metrics.jsonl; fail "killed twice before a checkpoint: expected 2 restart records from nothing"; }
diff <(strip_metrics run_s/metrics.jsonl) <(strip_metrics run_z/metrics.jsonl) || fail "the run restarted from nothing differs"
pass "killed twice before its first checkpoint: both restarts recorded (from nothing), the same losses"

# SIGTERM to supervise: passed on, the run checkpoints and stops (143), no restart.
"$BIN" supervise --backoff 0 -- "$BIN" train base.json --training.steps=100000 --checkpoint.dir=ck_t \
  --run.dir=run_t >log_t.txt 2>&1 &
sup=$!
wait_for 20 "a step record in run_t/metrics.jsonl" grep -qs '"loss"' run_t/metrics.jsonl
kill -TERM $sup
rc=0
wait $sup || rc=$?
[[ $rc -eq 143 ]] || { cat log_t.txt; fail "SIGTERM: exit $rc, expected 143"; }
grep -q "received SIGTERM, passed to the command" log_t.txt || { cat log_t.txt; fail "not passed on"; }
[[ -n "$(ls ck_t)" ]] || fail "no checkpoint written on SIGTERM"
grep -q "restart 1 of" log_t.txt && fail "restarted after SIGTERM"
pass "SIGTERM: passed to the run, which saved and stopped with 143; not restarted"

expect_error "supervise without a command" "no command after --" "$BIN" supervise --max-restarts 2
expect_error "supervise --max-restarts -1" "takes a number >= 0" "$BIN" supervise --max-restarts -1 -- true
pass "bad arguments exit 2"
echo "all supervise checks passed"
