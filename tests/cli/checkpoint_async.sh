#!/usr/bin/env bash
# checkpoint.async (the default): checkpoints written by a background thread
# while training goes on. The run is bit-identical to checkpoint.async = false
# (losses and every checkpoint file's tensors); every save leaves a
# "checkpoint" record in metrics.jsonl; a write that fails (a full disk,
# simulated by the ATTNRES_TEST_FAIL_IN_SAVE hook) stops the run with exit 1
# naming the error and publishes nothing, the previous checkpoint intact; a
# process killed in the middle of a background write leaves the previous
# checkpoint the newest, and resume = auto from it ends identically.
source "$(dirname "$0")/lib.sh"
make_corpus
write_config
sed -i 's/"steps": 12/"steps": 8/; s/"every": 4,/"every": 2,/' base.json


"$BIN" train base.json --checkpoint.dir=ck_sync --run.dir=run_sync --checkpoint.async=false 2>log_sync.txt \
  || { cat log_sync.txt; fail "synchronous run"; }
"$BIN" train base.json --checkpoint.dir=ck_async --run.dir=run_async 2>log_async.txt \
  || { cat log_async.txt; fail "asynchronous run"; }
diff <(strip_metrics run_sync/metrics.jsonl) <(strip_metrics run_async/metrics.jsonl) || fail "async and sync runs train differently"
for s in 2 4 6 8; do
  d=step_0000000$s
  [[ -d ck_async/$d && -d ck_sync/$d ]] || { ls ck_async ck_sync; fail "no $d"; }
  "$BIN" inspect compare ck_sync/$d ck_async/$d --rtol 0 >/dev/null || fail "$d differs between sync and async"
  # state.json past its config (which names the run's own directories and checkpoint.async).
  "$PY" -c 'import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); [x.pop("config") for x in (a,b)]; sys.exit(a!=b)' \
    ck_sync/$d/state.json ck_async/$d/state.json || fail "$d/state.json differs"
done
pass "async = sync: the same losses, and checkpoints 2, 4, 6, 8 hold the same tensors and state"

# The background thread copies what it saves while the next step's forward and
# backward run; the update waits for the copies. With the copies held back to
# the last moment the trainer allows (ATTNRES_TEST_STAGE_AT_UPDATE), an update
# that did not wait would change every save: the same checkpoints still.
ATTNRES_TEST_STAGE_AT_UPDATE=1 "$BIN" train base.json --checkpoint.dir=ck_late --run.dir=run_late \
  2>log_late.txt || { cat log_late.txt; fail "asynchronous run, copies at the update"; }
for s in 2 4 6 8; do
  d=step_0000000$s
  "$BIN" inspect compare ck_sync/$d ck_late/$d --rtol 0 >/dev/null || fail "$d differs with the copies at the update"
done
pass "the staging copies made at the update, not before: checkpoints 2, 4, 6, 8 as the synchronous run's"

# One record per save, with the fields the issue lists.
"$PY" - run_async/metrics.jsonl run_sync/metrics.jsonl <<'PYEOF' || fail "checkpoint records"
import json, sys
for path in sys.argv[1:]:
    recs = [json.loads(l) for l in open(path) if '"event":"checkpoint"' in l]
    assert [r["step"] for r in recs] == [2, 4, 6, 8], (path, [r["step"] for r in recs])
    for r in recs:
        for k in ("stall_sec", "write_sec", "bytes", "resident_mib", "peak_rss_mib", "dir"):
            assert k in r, (path, k, r)
        assert r["bytes"] > 0 and r["resident_mib"] > 0 and r["peak_rss_mib"] > 0, r
        assert 0 <= r["stall_sec"] <= r["write_sec"] + 1e-6, r
        assert r["dir"].endswith("step_%08d" % r["step"]), r
    print(f"{path}: {len(recs)} records, stall {sum(r['stall_sec'] for r in recs):.3f} s "
          f"of write {sum(r['write_sec'] for r in recs):.3f} s")
PYEOF
grep -q "checkpoint written: .*training stopped" log_async.txt || fail "no checkpoint log line"
pass "a checkpoint record per save (stall_sec <= write_sec, bytes, resident_mib, peak_rss_mib)"

# The staging buffers are made beside the start-up, for all that a save
# writes (one process: every byte of the checkpoint), not at the first save.
staged=$(sed -nE "s/.*staging buffers for rank 0's saves \(([0-9.]+) MB\).*/\1/p" log_async.txt)
saved=$("$PY" -c 'import json,sys; print("%.3f" % (next(json.loads(l) for l in open(sys.argv[1]) if "\"event\":\"checkpoint\"" in l)["bytes"] / 1e6))' run_async/metrics.jsonl)
[[ -n $staged && $staged == "$saved" ]] || { grep -i staging log_async.txt; fail "staging buffers made beside the start-up: '$staged' MB, a save writes $saved MB"; }
grep -q "staging buffers" log_sync.txt && fail "checkpoint.async = false made staging buffers"
pass "checkpoint.async: the staging buffers ($staged MB, what a save writes) made beside the start-up"

# A write that fails: exit 1 naming the error, nothing published, the
# previous checkpoint the newest and intact; the temp dir removed.
for mode in true false; do
  rc=0
  ATTNRES_TEST_FAIL_IN_SAVE=0:4 "$BIN" train base.json --checkpoint.dir=ck_fail_$mode \
    --run.dir=run_fail_$mode --checkpoint.async=$mode >log_fail.txt 2>&1 || rc=$?
  [[ $rc -eq 1 ]] || { cat log_fail.txt; fail "async=$mode: a failed save exited $rc, expected 1"; }
  grep -q "checkpoint of step 4 failed.*rank 0: .*No space left on device" log_fail.txt \
    || { cat log_fail.txt; fail "async=$mode: the error does not name the step, the rank and the reason"; }
  [[ -d ck_fail_$mode/step_00000002 && ! -e ck_fail_$mode/step_00000004 ]] \
    || { ls -a ck_fail_$mode; fail "async=$mode: expected step 2 and no step 4"; }
  [[ -z "$(ls -a ck_fail_$mode | grep '^.tmp_step_')" ]] || { ls -a ck_fail_$mode; fail "async=$mode: temp dir left"; }
  "$BIN" inspect checkpoint ck_fail_$mode/step_00000002 >/dev/null || fail "async=$mode: step 2 does not verify"
done
pass "a failing write (disk full): exit 1 naming step, rank and reason; step 2 intact, nothing else"

# Killed in the middle of the background write of step 4: step 2 is the
# newest; resume = auto from it ends as the uninterrupted run.
rc=0
ATTNRES_TEST_KILL_IN_SAVE=0:4 "$BIN" train base.json --checkpoint.dir=ck_kill --run.dir=run_kill \
  >log_kill.txt 2>&1 || rc=$?
[[ $rc -eq 137 ]] || { cat log_kill.txt; fail "the killed run exited $rc, expected 137"; }
[[ -d ck_kill/step_00000002 && ! -e ck_kill/step_00000004 ]] || { ls -a ck_kill; fail "expected step 2 and no step 4"; }
"$BIN" train base.json --checkpoint.dir=ck_kill --run.dir=run_kill --checkpoint.resume=auto 2>log_kill2.txt \
  || { cat log_kill2.txt; fail "resume after the kill"; }
grep -q "resumed from ck_kill/step_00000002" log_kill2.txt || { cat log_kill2.txt; fail "did not resume from step 2"; }
diff <(strip_metrics run_sync/metrics.jsonl) <(strip_metrics run_kill/metrics.jsonl) || fail "the resumed run differs"
pass "killed mid-write: step 2 the newest, resume = auto from it matches the uninterrupted run"
echo "all checkpoint_async checks passed"
