#!/usr/bin/env bash
# `attnres inspect memory` against the trainer's measured memory (the log
# line "memory per rank (largest): R MiB resident ... + A MiB step
# high-water"): the activation high-water within 10% and the resident state
# within 1%, largest rank against largest rank, and each rank's resident
# state (the line "resident memory by rank") against its replica's in the
# plan; at two shapes, in the Block and Full modes, without and with recomputation, in one process and under
# mpirun (P = 2 x V = 2, P = 4 x V = 2, P = 2 x D = 2), and with
# mixture-of-experts layers, expert parallelism included, and in Kimi Linear
# hybrids (KDA and MLA layers).
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config

check() {  # check NP ARGS...: one training step measured against the planner
  local np="$1"; shift
  rm -rf ck run
  run_np "$np" "$BIN" train base.json --training.steps=1 --eval.every=0 --checkpoint.dir= "$@" \
    2>log.txt || { cat log.txt; fail "train $*"; }
  local line; line=$(grep -m1 "memory per rank" log.txt) || { cat log.txt; fail "no memory line: $*"; }
  local res act
  res=$(sed -E 's/.*\(largest\): ([0-9.]+) MiB resident.*/\1/' <<<"$line")
  act=$(sed -E 's/.* \+ ([0-9.]+) MiB step high-water.*/\1/' <<<"$line")
  "$BIN" inspect memory base.json --json "$@" > plan.json || fail "inspect memory $*"
  local by_rank; by_rank=$(grep -m1 "resident memory by rank" log.txt || true)
  [[ $np -eq 1 || -n $by_rank ]] || { cat log.txt; fail "no per-rank memory line: $*"; }
  /usr/bin/python3 - "$res" "$act" "$*" "$by_rank" <<'PY' || fail "inspect memory disagrees with the measurement: $*"
import json, re, sys
res, act, what, by_rank = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
ranks = json.load(open("plan.json"))
est_act = max(r["activations"] for r in ranks) / 2**20
est_res = max(r["weights"] + r["master"] + r["grads"] + r["optimizer"] for r in ranks) / 2**20
ok = abs(est_act - act) <= 0.10 * act and abs(est_res - res) <= 0.01 * res
print(f"{'ok' if ok else 'FAIL'}: {what}: activations measured {act:.3f} MiB, planned {est_act:.3f} "
      f"({100 * (est_act / act - 1):+.1f}%); resident {res:.3f} MiB, planned {est_res:.3f}")
# Every rank's own resident state against the plan's replica of its stage
# (ZeRO-1's slices and Muon's owners differ between replicas): measured,
# not the planner's rule checked against itself.
for stage, replica, mib in re.findall(r"stage (\d+), replica (\d+)\) ([0-9.]+) MiB", by_rank):
    planned = ranks[int(stage)]["replica_resident"][int(replica)] / 2**20
    good = abs(planned - float(mib)) <= 0.01 * float(mib)
    ok = ok and good
    print(f"  {'ok' if good else 'FAIL'}: stage {stage} replica {replica}: resident measured "
          f"{float(mib):.3f} MiB, planned {planned:.3f}")
sys.exit(0 if ok else 1)
PY
}

shapes=("--model.d_model=64 --model.d_ff=160 --training.seq_len=32 --training.micro_batch_size=4"
        "--model.d_model=96 --model.n_heads=6 --model.n_kv_heads=3 --model.d_ff=256 --training.seq_len=64 --training.micro_batch_size=2")
for shape in "${shapes[@]}"; do
  for mode in "--model.residual.mode=block" "--model.residual.mode=full --model.residual.block_size=0"; do
    for rc in none layer; do
      # shellcheck disable=SC2086
      check 1 $shape $mode --training.recompute=$rc
      check 4 $shape $mode --training.recompute=$rc --parallel.pipeline=4 --parallel.virtual_stages=2
    done
    check 2 $shape $mode --training.recompute=mix --parallel.pipeline=2 --parallel.virtual_stages=2
    check 4 $shape $mode --parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2
  done
done
# Mixture-of-experts layers (the routing, the shared and routed experts'
# rows): dropless and with a capacity, every recompute mode, and a pipeline.
moe='--model.moe={"experts": 4, "top_k": 2, "expert_d_ff": 48, "shared_experts": 1}'
shape="--model.d_model=64 --model.d_ff=160 --training.seq_len=32 --training.micro_batch_size=4"
for rc in none mix layer; do
  # shellcheck disable=SC2086
  check 1 $shape --model.residual.mode=block "$moe" --training.recompute=$rc
done
# shellcheck disable=SC2086
check 1 $shape --model.residual.mode=full --model.residual.block_size=0 \
  --model.moe='{"experts": 6, "top_k": 3, "expert_d_ff": 40, "capacity_factor": 0.5, "dense_layers": 0}'
# shellcheck disable=SC2086
check 4 $shape --model.residual.mode=block "$moe" --parallel.pipeline=4 --parallel.virtual_stages=2
# Kimi Linear hybrids: the KDA layers' saved projections, convolutions,
# gates and core output; MLA's latent, its norm and the expanded heads.
kda='--model.kda={"heads": 2, "head_dim": 16, "conv_size": 4}'
mla='--model.mla={"kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12}'
for rc in none mix layer; do
  # shellcheck disable=SC2086
  check 1 $shape --model.residual.mode=block "$kda" --training.recompute=$rc
  # shellcheck disable=SC2086
  check 1 $shape --model.residual.mode=block "$kda" "$mla" --training.recompute=$rc
done
# shellcheck disable=SC2086
check 1 $shape --model.residual.mode=full --model.residual.block_size=0 "$mla" --training.recompute=layer
# shellcheck disable=SC2086
check 4 $shape --model.residual.mode=block "$kda" "$mla" "$moe" --parallel.pipeline=4 --parallel.virtual_stages=2
# Expert parallelism: E / EP experts per rank (their ZeRO-1 state over the
# replicas holding them), the exchanged rows kept and copied.
for rc in none layer; do
  # shellcheck disable=SC2086
  check 2 $shape --model.residual.mode=block "$moe" --parallel.data=2 --parallel.expert=2 \
    --training.grad_accum=2 --training.recompute=$rc
done
# shellcheck disable=SC2086
check 4 $shape --model.residual.mode=block "$moe" --parallel.data=4 --parallel.expert=2 \
  --training.grad_accum=1 --parallel.zero=1
# Muon's state: one buffer per element of the layers' matrices, AdamW's two for the rest.
# shellcheck disable=SC2086
check 1 $shape --model.residual.mode=block "$moe" --optimizer.type=muon
# shellcheck disable=SC2086
check 4 $shape --model.residual.mode=block --optimizer.type=muon --parallel.pipeline=4 --parallel.virtual_stages=2
# ZeRO-1 under Muon: an owner replica per matrix (its momentum there only).
# shellcheck disable=SC2086
check 2 $shape --model.residual.mode=block "$moe" --optimizer.type=muon --parallel.data=2 \
  --training.grad_accum=2 --parallel.zero=1
# The residual variants' one-pass Mix: its weights [N, H, k] and an input
# query's rows per sublayer, every recompute mode; a window; a pipeline.
for rc in none mix layer; do
  # shellcheck disable=SC2086
  check 1 $shape --model.residual='{"mode": "block", "block_size": 3, "query": "input", "heads": 4}' \
    --training.recompute=$rc
  # shellcheck disable=SC2086
  check 1 $shape --model.residual='{"mode": "full", "score": "sigmoid", "window": 4}' --training.recompute=$rc
done
# shellcheck disable=SC2086
check 4 $shape --model.residual='{"mode": "full", "weights": "scalars"}' --parallel.pipeline=4 \
  --parallel.virtual_stages=2
# DenseFormer: each layer's output a source, the averages' outputs and weights.
for rc in none mix layer; do
  # shellcheck disable=SC2086
  check 1 $shape --model.residual='{"mode": "denseformer"}' --training.recompute=$rc
done
# shellcheck disable=SC2086
check 4 $shape --model.residual='{"mode": "denseformer"}' --parallel.pipeline=4 --parallel.virtual_stages=2
pass "inspect memory within 10% of the measured activation high-water, 1% of the resident state"
