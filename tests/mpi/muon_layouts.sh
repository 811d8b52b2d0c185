#!/usr/bin/env bash
# optimizer.type = "muon" under mpirun equals the single process, as AdamW
# does (tests/mpi/train_exact.sh): every replica and stage runs each of its
# matrices' Newton-Schulz on the whole summed gradient, so pipelines that keep
# every sum in the single-process order are bit for bit (metrics and
# checkpoints, momentum buffers included), and cached interleaving and data
# parallelism within relative 1e-5. A dense Block model and a MoE model
# (experts take Muon, routers AdamW). A run stopped at step 4 resumes bit for
# bit on its own layout and within 1e-5 on another; a resume that changes the
# optimizer type is refused naming the missing state. ZeRO-1: each matrix has
# one owner replica, which holds its momentum, runs its Newton-Schulz on the
# whole summed gradient and shares the result (the all-gather): D2, P2 x D2,
# D4 (4 owners; gathered checkpoints), and with the experts of a MoE model
# split by expert parallelism (their owners among the replicas holding them);
# a resume from ZeRO-1 onto another layout.
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config

mu=(--optimizer.type=muon --optimizer.momentum=0.9)
models=("" '--model.moe={"experts": 4, "top_k": 2, "shared_experts": 1, "expert_d_ff": 24}')
for model in "${models[@]}"; do
  echo "== ${model:-dense}"
  m=("${mu[@]}"); [[ -n $model ]] && m+=("$model")
  rm -rf ck_1 run_1
  "$BIN" train base.json --checkpoint.dir=ck_1 --run.dir=run_1 "${m[@]}" 2>log_1.txt \
    || { cat log_1.txt; fail "single process"; }
  python3 - ck_1/step_00000008 <<'PY' || fail "the checkpoint's optimizer state is not Muon's"
import glob, json, struct, sys
names = set()
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(f, "rb") as h:
        n = struct.unpack("<Q", h.read(8))[0]
        names |= set(json.loads(h.read(n)))
assert "momentum_buffer.model.layers.0.self_attn.q_proj.weight" in names, sorted(names)[:8]
assert "exp_avg.model.embed_tokens.weight" in names
assert not any(n.startswith("exp_avg.model.layers.0.self_attn") for n in names)
PY
  same_as_reference 1 0 "--parallel.pipeline=4" \
    "--parallel.pipeline=2 --parallel.virtual_stages=2 --parallel.cache_blocks=false" -- "${m[@]}"
  same_as_reference 1 1e-5 "--parallel.pipeline=4 --parallel.virtual_stages=2" \
    "--parallel.data=2 --training.grad_accum=2" \
    "--parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2" \
    "--parallel.data=2 --training.grad_accum=2 --parallel.zero=1" \
    "--parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 --parallel.zero=1" \
    "--parallel.data=4 --training.grad_accum=1 --parallel.zero=1 --checkpoint.sharded=false" -- "${m[@]}"
  [[ -n $model ]] && same_as_reference 1 1e-5 \
    "--parallel.data=4 --parallel.expert=2 --training.grad_accum=1 --parallel.zero=1" -- "${m[@]}"
done

# Resume: stopped at step 4, continued on the same layout (bit for bit) and
# on another (within 1e-5).
rm -rf ck_r run_r
"$BIN" train base.json --checkpoint.dir=ck_r --run.dir=run_r "${mu[@]}" --run.stop_after=4 2>log_r1.txt \
  || { cat log_r1.txt; fail "the first half"; }
"$BIN" train base.json --checkpoint.dir=ck_r --run.dir=run_r "${mu[@]}" --checkpoint.resume=auto \
  2>log_r2.txt || { cat log_r2.txt; fail "the second half"; }
"$BIN" train base.json --checkpoint.dir=ck_1d --run.dir=run_1d "${mu[@]}" 2>log_1d.txt \
  || { cat log_1d.txt; fail "the dense single process again"; }
diff <(strip_metrics run_1d/metrics.jsonl) <(strip_metrics run_r/metrics.jsonl) \
  || fail "resumed: metrics differ from the uninterrupted run"
"$BIN" inspect compare ck_1d/step_00000008 ck_r/step_00000008 --rtol 0 >/dev/null \
  || fail "resumed: checkpoint differs from the uninterrupted run's"
pass "stopped at step 4 and resumed: bit-identical to the uninterrupted run"
# On other layouts (within 1e-5): stopped in one process, resumed on D = 2;
# ZeRO-1's owners write their momentum buffers: stopped on D = 2 with ZeRO-1,
# resumed on P = 2 without it.
resume_on 1d 1e-5 "" "--parallel.data=2 --training.grad_accum=2" -- "${mu[@]}"
resume_on 1d 1e-5 "--parallel.data=2 --training.grad_accum=2 --parallel.zero=1" "--parallel.pipeline=2" \
  -- "${mu[@]}"

# The optimizer's state must match its type.
expect_error "AdamW resuming Muon's checkpoint" "exp_avg.model.layers.0" "$BIN" train base.json \
  --checkpoint.dir=ck_r --run.dir=run_t --checkpoint.resume=auto --training.steps=12
echo "all muon_layouts checks passed"
