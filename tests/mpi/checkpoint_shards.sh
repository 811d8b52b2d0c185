#!/usr/bin/env bash
# Sharded checkpoints: a pipeline run's stages each write their own
# safetensors shard plus Hugging Face index files, and no tensor goes to
# rank 0. The shards hold exactly the gathered checkpoint's tensors; resume
# across layouts (P=4 -> P=2 x D=2 -> one process) matches the uninterrupted
# run; eval, generate and inspect read them; a rank killed in the middle of a
# save leaves the previous checkpoint valid, and resume = auto takes it;
# background saves equal synchronous ones, and a failing one stops the job.
source "$(dirname "$0")/lib.sh"
reference_run

# P=4, sharded (the default): the files and the index.
run_np 4 "$BIN" train base.json --checkpoint.dir=ck_a --run.dir=run_a --parallel.pipeline=4 \
  --run.stop_after=4 2>log_a.txt || { cat log_a.txt; fail "P=4 sharded"; }
d=ck_a/step_00000004
for s in 1 2 3 4; do
  for stem in model optimizer; do
    [[ -f $d/$stem-0000$s-of-00004.safetensors ]] || { ls $d; fail "no $stem shard $s of 4"; }
  done
done
[[ ! -e $d/model.safetensors ]] || fail "a sharded checkpoint also has model.safetensors"
/usr/bin/python3 - "$d" <<'PY' || fail "index files do not describe the shards"
import json, os, struct, sys
d = sys.argv[1]
for stem in ("model", "optimizer"):
    index = json.load(open(os.path.join(d, stem + ".safetensors.index.json")))
    wm, total, seen = index["weight_map"], 0, {}
    for f in sorted(set(wm.values())):
        raw = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            seen[name] = f
            total += meta["data_offsets"][1] - meta["data_offsets"][0]
    assert seen == wm, f"{stem}: weight_map differs from the shards' contents"
    assert index["metadata"]["total_size"] == total, f"{stem}: total_size {index['metadata']['total_size']} != {total}"
    print(f"{stem}: {len(wm)} tensors in {len(set(wm.values()))} shards, {total} bytes")
PY
"$BIN" inspect checkpoint $d > inspect.txt || fail "inspect checkpoint of a sharded checkpoint"
grep -q "sharded: 4 model shards" inspect.txt || { cat inspect.txt; fail "inspect does not report the shards"; }
pass "P=4 wrote 4 model + 4 optimizer shards and index files that match them"

# The same checkpoint gathered at rank 0: the same tensors, bit for bit.
run_np 4 "$BIN" train base.json --checkpoint.dir=ck_g --run.dir=run_g --parallel.pipeline=4 \
  --run.stop_after=4 --checkpoint.sharded=false 2>log_g.txt || { cat log_g.txt; fail "P=4 gathered"; }
[[ -f ck_g/step_00000004/model.safetensors ]] || fail "gathered checkpoint has no model.safetensors"
"$BIN" inspect compare ck_g/step_00000004 $d --rtol 0 || fail "sharded and gathered checkpoints differ"
pass "sharded = gathered, tensor for tensor"

# Resume across layouts: P=4 (steps 1-4) -> P=2 x D=2 (5-6) -> one process (7-8).
run_np 4 "$BIN" train base.json --checkpoint.dir=ck_a --run.dir=run_a --parallel.pipeline=2 \
  --parallel.data=2 --training.grad_accum=2 --run.stop_after=2 --checkpoint.resume=auto \
  2>>log_a.txt || { cat log_a.txt; fail "P=2 x D=2 resume"; }
[[ -f ck_a/step_00000006/model-00001-of-00002.safetensors ]] || fail "P=2 x D=2 did not write 2 shards"
"$BIN" train base.json --checkpoint.dir=ck_a --run.dir=run_a --checkpoint.resume=auto 2>>log_a.txt \
  || { cat log_a.txt; fail "single-process resume"; }
[[ $(grep -c "resumed from" log_a.txt) -eq 2 ]] || fail "expected two resumes"
compare_losses run_s/metrics.jsonl run_a/metrics.jsonl 1e-5 || fail "sharded resume chain losses differ"
pass "P=4 -> P=2 x D=2 -> 1 process through sharded checkpoints matches the uninterrupted run"

# eval and generate read a sharded checkpoint like a single file.
"$BIN" eval --checkpoint $d --data 'shards/tiny_val_*.bin' > eval_sharded.txt || fail "eval of shards"
"$BIN" eval --checkpoint ck_g/step_00000004 --data 'shards/tiny_val_*.bin' > eval_gathered.txt \
  || fail "eval of the gathered checkpoint"
cmp -s eval_sharded.txt eval_gathered.txt || fail "eval differs between sharded and gathered"
"$BIN" generate --checkpoint $d --prompt "the jury" --tokens 8 --temperature 0 > gen.txt \
  || fail "generate from shards"
pass "eval and generate read sharded checkpoints ($(cat eval_sharded.txt | tr '\n' ' '))"

# A rank killed in the middle of the step-4 save (after its model shard).
rm -rf ck_k run_k
"$MPIEXEC" "$NPFLAG" 4 "${MPI_FLAGS[@]}" -x ATTNRES_TEST_KILL_IN_SAVE=2:4 "$BIN" train base.json \
  --checkpoint.dir=ck_k --run.dir=run_k --parallel.pipeline=4 --checkpoint.every=2 \
  >log_k.txt 2>&1 && fail "the job with a killed rank exited 0"
[[ -d ck_k/step_00000002 ]] || { cat log_k.txt; fail "no step 2 checkpoint"; }
[[ ! -e ck_k/step_00000004 ]] || fail "the interrupted save was published"
"$BIN" inspect checkpoint ck_k/step_00000002 >/dev/null || fail "step 2 does not verify"
grep -q "^.tmp_step_00000004_" <(ls -a ck_k) || fail "no temp dir of the interrupted save (did it die there?)"
# The launcher returns before every rank of the aborted job has exited; a
# temp dir is only deleted once its writer is gone, so wait for them.
no_ck_k_rank() { ! pgrep -f "checkpoint.dir=ck_k" >/dev/null; }
wait_for 30 "the aborted job's ranks to exit" no_ck_k_rank
run_np 2 "$BIN" train base.json --checkpoint.dir=ck_k --run.dir=run_k --parallel.pipeline=2 \
  --checkpoint.every=2 --checkpoint.resume=auto 2>log_k2.txt || { cat log_k2.txt; fail "resume after the kill"; }
grep -q "resumed from ck_k/step_00000002" log_k2.txt || { cat log_k2.txt; fail "did not resume from step 2"; }
[[ -z "$(ls -a ck_k | grep "^.tmp_step_")" ]] || { ls -a ck_k; grep -i "stale\|checkpoint" log_k2.txt; fail "the dead save's temp dir was not cleaned up"; }
compare_losses run_s/metrics.jsonl run_k/metrics.jsonl 1e-5 || fail "losses after the kill differ"
pass "a rank killed mid-save: step 2 stays valid, resume = auto takes it, the run completes identically"
# checkpoint.async (the default) against synchronous saves at P=2 x D=2 with
# ZeRO-1: the same losses and checkpoints; a write failing on rank 1 (not the
# one that publishes) stops every rank with exit 1 naming it, nothing published.
for mode in true false; do
  run_np 4 "$BIN" train base.json --checkpoint.dir=ck_z$mode --run.dir=run_z$mode --parallel.pipeline=2 \
    --parallel.data=2 --training.grad_accum=2 --parallel.zero=1 --checkpoint.async=$mode \
    2>log_z$mode.txt || { cat log_z$mode.txt; fail "P=2 x D=2 zero=1 async=$mode"; }
done
diff <(strip_metrics run_ztrue/metrics.jsonl) <(strip_metrics run_zfalse/metrics.jsonl) \
  || fail "async and sync saves train differently at P=2 x D=2"
for s in 4 8; do
  "$BIN" inspect compare ck_zfalse/step_0000000$s ck_ztrue/step_0000000$s --rtol 0 >/dev/null \
    || fail "step $s: async and sync checkpoints differ"
done
# ZeRO-1 writes without a gather: every replica its own slices of the moments
# (P x D optimizer files, the index's "slices"), replica 0 of each stage the
# weights; the same tensors as the gathered zero = 1 checkpoint, bit for bit.
d=ck_ztrue/step_00000008
for k in 1 2 3 4; do [[ -f $d/optimizer-0000$k-of-00004.safetensors ]] || { ls $d; fail "no optimizer file $k of 4"; }; done
[[ -f $d/model-00002-of-00002.safetensors && ! -e $d/model-00003-of-00004.safetensors ]] || { ls $d; fail "expected 2 model shards"; }
/usr/bin/python3 - "$d" <<'PY' || fail "the optimizer index's slices"
import json, os, sys
index = json.load(open(os.path.join(sys.argv[1], "optimizer.safetensors.index.json")))
slices = index["slices"]
assert slices and all("@" in p["name"] for s in slices.values() for p in s["parts"]), "no slices"
files = {index["weight_map"][p["name"]] for s in slices.values() for p in s["parts"]}
assert len(files) == 4, files
split = sum(1 for s in slices.values() if len(s["parts"]) > 1)
print(f"{len(slices)} moments in slices over {len(files)} files, {split} of them split between replicas")
assert split > 0
PY
run_np 4 "$BIN" train base.json --checkpoint.dir=ck_zg --run.dir=run_zg --parallel.pipeline=2 \
  --parallel.data=2 --training.grad_accum=2 --parallel.zero=1 --checkpoint.sharded=false \
  2>log_zg.txt || { cat log_zg.txt; fail "P=2 x D=2 zero=1 gathered"; }
"$BIN" inspect compare ck_zg/step_00000008 $d --rtol 0 >/dev/null || fail "ZeRO-1 slices differ from the gathered checkpoint"
pass "zero=1: each replica wrote its own moment slices (4 optimizer files, no gather), equal to the gathered checkpoint"

rc=0
"$MPIEXEC" "$NPFLAG" 4 "${MPI_FLAGS[@]}" -x ATTNRES_TEST_FAIL_IN_SAVE=1:8 "$BIN" train base.json \
  --checkpoint.dir=ck_f --run.dir=run_f --parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 \
  >log_f.txt 2>&1 || rc=$?
[[ $rc -eq 1 ]] || { cat log_f.txt; fail "a failed background write exited $rc, expected 1"; }
grep -q "checkpoint of step 8 failed.*rank 1: .*No space left on device" log_f.txt \
  || { cat log_f.txt; fail "the error does not name step 8, rank 1 and the reason"; }
[[ -d ck_f/step_00000004 && ! -e ck_f/step_00000008 ]] || { ls -a ck_f; fail "expected step 4 and no step 8"; }
pass "P=2 x D=2, zero=1: async saves = sync saves; a write failing on rank 1 stops the job (exit 1), step 4 intact"
echo "all checkpoint_shards checks passed"
