#!/usr/bin/env bash
# `attnres inspect plan`: the cpu profile measures and predicts the config's
# layout; the h100 profile ranks every layout of N GPUs; bad input is refused.
#
# With ATTNRES_TEST_PART=docs: docs/plans/ holds what the planner prints today
# for the shipped cuda configs (numbers within one unit of their last printed
# digit, so that another CPU's rounding passes). That needs a build with CUDA
# (the configs ask for training.device = "cuda") and reports itself skipped
# (exit code 77) in one without.
source "$(dirname "$0")/lib.sh"
if [[ "${ATTNRES_TEST_PART:-}" == docs ]]; then
  n=0
  for f in "$SRC"/docs/plans/*gpus.txt; do
    name=$(basename "$f" .txt)  # <model>_<N>gpus
    model=${name%_*} gpus=${name##*_}; gpus=${gpus%gpus}
    rc=0
    "$BIN" inspect plan "$SRC/configs/gpu_$model.json" --profile h100 --gpus "$gpus" --top 100 \
      > "$name.txt" 2> err.txt || rc=$?
    if ((rc != 0)) && grep -q "this build has no CUDA backend" err.txt; then
      echo "skipped: configs/gpu_$model.json asks for training.device = \"cuda\", and this build has no CUDA backend"
      exit 77
    fi
    ((rc == 0)) || { cat err.txt; fail "inspect plan for docs/plans/$name.txt (exit code $rc)"; }
    "$PY" - "$f" "$name.txt" <<'PYEOF' || fail "docs/plans/$name.txt is stale; regenerate it: build/attnres inspect plan configs/gpu_$model.json --profile h100 --gpus $gpus --top 100 > docs/plans/$name.txt"
import re, sys
doc, now = (open(p).read().splitlines() for p in sys.argv[1:3])
num = re.compile(r"^[+-]?\d+(\.(\d+))?%?$")
def same(a, b):
    ma, mb = num.match(a), num.match(b)
    if not (ma and mb):
        return a == b
    unit = 10.0 ** -len(ma.group(2) or "")  # one unit of the last printed digit
    x, y = (float(t.rstrip("%")) for t in (a, b))
    return abs(x - y) <= unit * 1.0001 + 1e-6 * abs(y)
if len(doc) != len(now):
    sys.exit(f"{len(doc)} lines in the doc, {len(now)} printed now")
for i, (d, n) in enumerate(zip(doc, now), 1):
    dt, nt = d.split(), n.split()
    if len(dt) != len(nt) or not all(same(a, b) for a, b in zip(dt, nt)):
        sys.exit(f"line {i} differs:\n  doc: {d}\n  now: {n}")
PYEOF
    n=$((n + 1))
  done
  ((n > 0)) || fail "no docs/plans/*gpus.txt"
  pass "docs/plans/: $n tables equal the planner's output"
  exit 0
fi
[[ -z "${ATTNRES_TEST_PART:-}" ]] || fail "unknown ATTNRES_TEST_PART '$ATTNRES_TEST_PART' (docs, or unset)"
"$BIN" inspect plan "$SRC/configs/quickstart.json" --profile cpu --steps 1 \
  --model.n_layers=4 --parallel.pipeline=2 --parallel.virtual_stages=2 --training.grad_accum=2 \
  --training.steps=1 > cpu.txt
grep -q "measuring 4 chunks in one process" cpu.txt || { cat cpu.txt; fail "cpu profile: no measurement"; }
grep -qE "layout P2 V2 D1 cached, M=2: predicted step [0-9.]+ ms" cpu.txt || { cat cpu.txt; fail "cpu profile: no prediction"; }
pass "cpu profile predicts the config's layout"
# Balancing: the quickstart model's head (2 d V FLOPs a token, about 2.6 of
# its layers) makes the even [2,2] split of P2 unbalanced; the planner
# proposes [3,1] and measures it too (the runtime running the uneven split).
"$BIN" inspect plan "$SRC/configs/quickstart.json" --profile cpu --steps 1 --parallel.pipeline=2 \
  --training.grad_accum=2 --training.steps=1 > cpu_balance.txt
grep -qF "stages balanced by cost (FLOPs): --parallel.layers_per_chunk=[3,1], measured:" cpu_balance.txt \
  && grep -qE "^balanced split: step [+-][0-9.]+% over \[2,2\]$" cpu_balance.txt \
  || { cat cpu_balance.txt; fail "cpu profile: no balanced split measured"; }
pass "cpu profile: the head-heavy last stage balanced ([3,1]) and measured"
"$BIN" inspect plan "$SRC/configs/kimi_linear_48b.json" --profile h100 --training.device=cpu \
  --training.precision=fp32 > h100_balance.txt
grep -qE "^stages balanced by cost: --parallel.layers_per_chunk=\[[0-9,]+\] \(now \[3,3,4,3,3,4,3,4\]\): predicted step [0-9.]+ ms \(-[0-9.]+%\)" h100_balance.txt \
  || { cat h100_balance.txt; fail "h100 profile: no balanced split for Kimi Linear 48B"; }
pass "h100 profile: Kimi Linear 48B's P4 V2 balanced, faster than the even split"
"$BIN" inspect plan "$SRC/configs/gpu_350m.json" --profile h100 --gpus 8 \
  --training.device=cpu --training.precision=fp32 > gpu.txt
rows=$(grep -cE "^P[0-9]+ V[0-9] D[0-9]+ (naive|cached)" gpu.txt)
[[ $rows -ge 4 ]] || { cat gpu.txt; fail "h100 --gpus 8: only $rows layouts"; }
pass "h100 profile ranks $rows layouts of 8 GPUs"
# Expert parallelism: the all-to-alls of a MoE model's layers make the same
# layout slower with EP 8 than with EP 1, and its rows name EP.
moe='--model.moe={"experts": 16, "top_k": 2, "shared_experts": 1, "expert_d_ff": 512}'
step_of() {  # step_of EP: the P1 V1 D8 row's step ms
  "$BIN" inspect plan "$SRC/configs/gpu_350m.json" --profile h100 --gpus 8 --top 100 \
    --training.device=cpu --training.precision=fp32 "$moe" --parallel.data=8 --parallel.expert="$1" \
    > "ep$1.txt" || fail "inspect plan with parallel.expert=$1"
  awk -v want="P1 V1 D8 $([[ $1 -gt 1 ]] && echo "EP$1 ")cached" 'index($0, want) == 1 { print $(NF - 8) }' "ep$1.txt"
}
t1=$(step_of 1); t8=$(step_of 8)
[[ -n "$t1" && -n "$t8" ]] || { cat ep1.txt ep8.txt; fail "no P1 V1 D8 row"; }
awk -v a="$t1" -v b="$t8" 'BEGIN { exit !(b > a) }' || fail "EP 8 ($t8 ms) not slower than EP 1 ($t1 ms)"
pass "h100 profile: P1 V1 D8 with EP 8 ($t8 ms) pays its all-to-alls over EP 1 ($t1 ms)"
expect_error "unknown profile" "unknown hardware profile 'tpu'" \
  "$BIN" inspect plan "$SRC/configs/quickstart.json" --profile tpu
expect_error "--gpus with the cpu profile" "--gpus ranks GPU layouts" \
  "$BIN" inspect plan "$SRC/configs/quickstart.json" --gpus 4
