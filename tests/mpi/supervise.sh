#!/usr/bin/env bash
# attnres supervise over mpirun: a P = 2 run whose ranks are killed (SIGKILL,
# a random rank at a random moment, several times) is restarted from its
# newest checkpoint each time and ends with the losses of the run that was
# never interrupted, bit for bit; every restart is in metrics.jsonl.
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config
sed -i 's/"steps": 8/"steps": 600/; s/"every": 4, "keep_last": 0/"every": 10, "keep_last": 3/; s/"eval": {"every": 4/"eval": {"every": 60/' base.json

run_np 2 "$BIN" train base.json --parallel.pipeline=2 --checkpoint.dir=ck_s --run.dir=run_s 2>log_s.txt \
  || { cat log_s.txt; fail "the uninterrupted run"; }

seed=${ATTNRES_TEST_SEED:-$RANDOM}
RANDOM=$seed
echo "kill times and ranks drawn with seed $seed (ATTNRES_TEST_SEED=$seed repeats them)"
"$BIN" supervise --max-restarts 8 --backoff 0 -- "$MPIEXEC" "$NPFLAG" 2 "${MPI_FLAGS[@]}" \
  "$BIN" train base.json --parallel.pipeline=2 --checkpoint.dir=ck_v --run.dir=run_v >log_v.txt 2>&1 &
sup=$!
kills=0
# The ranks are the processes whose command line starts with "$BIN train"
# (mpirun's and supervise's start otherwise).
ranks() { pgrep -f "^$BIN train base.json --parallel.pipeline=2 --checkpoint.dir=ck_v" || true; }
for k in 1 2 3; do
  # Wait until the attempt after the last kill trains (its restart record is
  # written, then a step record after it) with its two ranks alone (the
  # killed attempt's other rank can outlive its mpirun for a moment, and a
  # kill sent to it restarts nothing), then kill one of them after 0-0.09 s
  # more: a step takes a few ms on 2 cores, and a checkpoint is written every
  # 10 steps, so the kills land anywhere in its cycle. The first kill may
  # land before the first checkpoint (a restart from nothing); the later ones
  # wait for a checkpoint record, so that a restart resumes from one (all
  # three before step 10 failed "no restart resumed from a checkpoint" in CI
  # on 2026-11-28).
  victim=""
  for _ in $(seq 1 600); do
    kill -0 $sup 2>/dev/null || break
    if [[ $(ranks | wc -l) -eq 2 && -f run_v/metrics.jsonl ]] &&
       [[ $(grep -c '"event":"restart"' run_v/metrics.jsonl || true) -eq $kills ]] &&
       { ((k == 1)) || grep -q '"event":"checkpoint"' run_v/metrics.jsonl; } &&
       tail -1 run_v/metrics.jsonl | grep -q '"loss"'; then
      sleep "0.0$((RANDOM % 10))"
      mapfile -t pids < <(ranks)
      if ((${#pids[@]} == 2)); then
        victim=${pids[$((RANDOM % 2))]}
        break
      fi
    fi
    sleep 0.05
  done
  [[ -n $victim ]] || break
  kill -KILL "$victim" 2>/dev/null && kills=$((kills + 1)) && echo "kill $k: rank process $victim"
done
rc=0
wait $sup || rc=$?
[[ $rc -eq 0 ]] || { tail -40 log_v.txt; fail "supervise exited $rc"; }
# Three kills are tried; an attempt that trains faster than this loop polls
# could finish the run first, so two are enough (the checks below hold for
# however many landed). Before 2026-11-28 a kill could hit the previous
# attempt's lingering rank: "only 2 kills landed" or "2 kills but 1 restart
# records", now and then (CI, and 1 run in 6 on a 2-core machine).
((kills >= 2)) || { tail -40 log_v.txt; fail "only $kills kills landed (the run ended first?)"; }
restarts=$(grep -c '"event":"restart"' run_v/metrics.jsonl || true)
[[ $restarts -eq $kills ]] || { cat run_v/metrics.jsonl | grep event; fail "$kills kills but $restarts restart records"; }
[[ $(grep -c "supervise: the command ended with" log_v.txt) -eq $kills ]] || { tail -40 log_v.txt; fail "restarts not logged"; }
from=$(grep -o '"resumed_from":"[^"]*"' run_v/metrics.jsonl | cut -d'"' -f4 | tr '\n' ' ')
grep -q '"resumed_from":"ck_v/step_' run_v/metrics.jsonl || fail "no restart resumed from a checkpoint ($from)"
diff <(strip_metrics run_s/metrics.jsonl) <(strip_metrics run_v/metrics.jsonl) \
  || fail "the supervised run with $kills kills differs from the uninterrupted run"
pass "$kills ranks killed at random moments (seed $seed): $restarts restarts, resumed from: ${from:-?}; losses bit for bit those of the uninterrupted run"
echo "all supervise checks passed"
