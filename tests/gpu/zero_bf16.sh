#!/usr/bin/env bash
# ZeRO-1 in a bf16 GPU run (2 data-parallel ranks on one GPU, MPI transport,
# which stages through host memory): zero = 1 trains like zero = 0 (losses
# within 1e-3 relative: the replicas' sums are reassociated, and the bf16
# weights round the same fp32 masters); each rank holds the AdamW state and
# the fp32 masters of half the parameters (the resident bytes the trainer
# logs after step 1 against `inspect memory`, within 2%); checkpoints do not
# depend on it (zero = 1 -> zero = 0 -> zero = 1 resume matches the
# uninterrupted run); eval.tasks scores with zero = 1. Skipped without a GPU.
# Usage: zero_bf16.sh BIN SRC TEST_MPI MPIEXEC NPFLAG [launcher flags...]
export ATTNRES_TEST_DEVICE=cuda
source "$2/tests/mpi/lib.sh"
require_device
make_corpus
write_mpi_config
common=(--training.device=cuda --training.precision=bf16 --parallel.transport=mpi
        --parallel.data=2 --training.grad_accum=2 --optimizer.eps=1e-4)

run_np 2 "$BIN" train base.json "${common[@]}" --checkpoint.dir=ck0 --run.dir=run0 2>log0.txt \
  || { cat log0.txt; fail "zero = 0"; }
run_np 2 "$BIN" train base.json "${common[@]}" --parallel.zero=1 --checkpoint.dir=ck1 --run.dir=run1 \
  2>log1.txt || { cat log1.txt; fail "zero = 1"; }
compare_losses run0/metrics.jsonl run1/metrics.jsonl 1e-3 || fail "zero = 1 trains differently"
"$BIN" inspect compare ck0/step_00000008 ck1/step_00000008 --rtol 1e-2 || fail "final checkpoints differ"
pass "zero = 1 = zero = 0 in bf16 (losses within 1e-3)"

resident() { sed -nE 's/.*\(largest\): ([0-9.]+) MiB resident.*/\1/p' "$1" | awk 'NR == 1'; }  # (head would leave sed a SIGPIPE)
r0=$(resident log0.txt); r1=$(resident log1.txt)
"$BIN" inspect memory base.json "${common[@]}" --parallel.zero=1 --json > plan.json
"$PY" - "$r0" "$r1" <<'PY' || fail "resident memory with zero = 1 is not what the planner says"
import json, sys
r0, r1 = float(sys.argv[1]), float(sys.argv[2])
plan = max(r["weights"] + r["master"] + r["grads"] + r["optimizer"] for r in json.load(open("plan.json"))) / 2**20
print(f"resident per rank: zero=0 {r0:.3f} MiB, zero=1 {r1:.3f} MiB, planned {plan:.3f} MiB")
sys.exit(0 if r1 < r0 and abs(r1 - plan) <= 0.02 * plan else 1)
PY
pass "zero = 1 holds half the AdamW state and fp32 masters, as planned"

rm -rf ckz runz
run_np 2 "$BIN" train base.json "${common[@]}" --parallel.zero=1 --checkpoint.dir=ckz --run.dir=runz \
  --run.stop_after=3 2>logz.txt || { cat logz.txt; fail "zero = 1, first part"; }
run_np 2 "$BIN" train base.json "${common[@]}" --checkpoint.dir=ckz --run.dir=runz --run.stop_after=3 \
  --checkpoint.resume=auto 2>>logz.txt || { cat logz.txt; fail "zero = 0, middle part"; }
run_np 2 "$BIN" train base.json "${common[@]}" --parallel.zero=1 --checkpoint.dir=ckz --run.dir=runz \
  --checkpoint.resume=auto 2>>logz.txt || { cat logz.txt; fail "zero = 1, last part"; }
compare_losses run1/metrics.jsonl runz/metrics.jsonl 1e-3 || fail "resume across zero differs"
pass "zero = 1 -> zero = 0 -> zero = 1 resume matches the uninterrupted run"

# Scoring during training: with zero = 1 a rank keeps only a slice of the
# fp32 masters, so the LM head scores with its bf16 weights widened to fp32.
"$PY" "$SRC/tests/cli/make_hellaswag.py" hs.jsonl 7 corpus/doc2.txt
run_np 2 "$BIN" train base.json "${common[@]}" --parallel.zero=1 --checkpoint.dir=ckt --run.dir=runt \
  --training.seq_len=32 --eval.tasks=hellaswag:hs.jsonl 2>logt.txt || { cat logt.txt; fail "zero = 1 with eval.tasks"; }
[[ $(grep -c '"task":"hellaswag"' runt/metrics.jsonl) -eq 2 ]] || { cat runt/metrics.jsonl; fail "expected 2 task records"; }
pass "zero = 1 in bf16 scores eval.tasks ($(grep -m1 'hellaswag acc' logt.txt | sed 's/.*info //'))"
echo "all zero_bf16 checks passed"
