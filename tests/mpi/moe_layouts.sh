#!/usr/bin/env bash
# Mixture-of-experts models (model.moe) under mpirun equal the single process,
# as dense ones do (tests/mpi/train_exact.sh): pipelines that keep every sum
# in the single-process order bit for bit, metrics and checkpoints (the
# routers' balancing biases included); cached interleaving, data parallelism
# and ZeRO-1 within relative 1e-5, with the same expert loads and biases in
# every step record (the loads are summed over the whole global batch, so
# every replica nudges its biases alike); expert parallelism (EP replicas
# splitting the experts, rows exchanged by all-to-all) under data, pipeline,
# interleaved and ZeRO-1 layouts, gathered checkpoints too. Two MoE settings: sigmoid routing
# with aux-free balancing and a shared expert; softmax routing with the
# auxiliary loss and a capacity that drops. A resume on another layout
# continues the run exactly, one that changes EP included.
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config

moe_settings=(
  '{"experts": 4, "top_k": 2, "shared_experts": 1, "expert_d_ff": 24}'
  '{"experts": 6, "top_k": 2, "expert_d_ff": 16, "router": "softmax", "balance": "aux_loss", "capacity_factor": 1.0, "dense_layers": 0}'
)
for moe in "${moe_settings[@]}"; do
  echo "== model.moe = $moe"
  m=(--model.moe="$moe")
  rm -rf ck_1 run_1 ck_e run_e
  "$BIN" train base.json --checkpoint.dir=ck_1 --run.dir=run_1 "${m[@]}" 2>log_1.txt \
    || { cat log_1.txt; fail "single process"; }
  grep -q '"moe_load"' run_1/metrics.jsonl || fail "no moe_load in the step records"
  same_as_reference 1 0 "--parallel.pipeline=4" \
    "--parallel.pipeline=2 --parallel.virtual_stages=2 --parallel.cache_blocks=false" -- "${m[@]}"
  "$BIN" train base.json --checkpoint.dir=ck_e --run.dir=run_e --optimizer.eps=1e-4 "${m[@]}" 2>log_e.txt \
    || { cat log_e.txt; fail "single process (eps 1e-4)"; }
  same_as_reference e 1e-5 "--parallel.pipeline=4 --parallel.virtual_stages=2" \
    "--parallel.data=2 --training.grad_accum=2" \
    "--parallel.data=2 --training.grad_accum=2 --parallel.zero=1" \
    "--parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 --parallel.zero=1" \
    "--parallel.data=2 --parallel.expert=2 --training.grad_accum=2" \
    "--parallel.pipeline=2 --parallel.virtual_stages=2 --parallel.data=2 --parallel.expert=2 --training.grad_accum=2" \
    "--parallel.data=4 --parallel.expert=2 --training.grad_accum=1 --parallel.zero=1" \
    "--parallel.pipeline=2 --parallel.data=2 --parallel.expert=2 --training.grad_accum=2 --parallel.zero=1 --checkpoint.sharded=false" \
    -- --optimizer.eps=1e-4 "${m[@]}"
done

# A resume on another layout (aux-free, the uninterrupted run with eps 1e-4):
# stopped on a pipeline of 2, continued data parallel; and one that changes
# expert parallelism, 2 experts per rank (D = 2, EP = 2, ZeRO-1: each
# expert's moments sharded over its holders) to 1 (D = 4, EP = 4): the
# checkpoint names experts by global index.
m=(--model.moe="${moe_settings[0]}")
rm -rf ck_e run_e
"$BIN" train base.json --checkpoint.dir=ck_e --run.dir=run_e --optimizer.eps=1e-4 "${m[@]}" 2>log_e.txt \
  || { cat log_e.txt; fail "single process (eps 1e-4)"; }
resume_on e 1e-5 "--parallel.pipeline=2" "--parallel.data=2 --training.grad_accum=2" \
  -- --optimizer.eps=1e-4 "${m[@]}"
resume_on e 1e-5 "--parallel.data=2 --parallel.expert=2 --parallel.zero=1 --training.grad_accum=2" \
  "--parallel.data=4 --parallel.expert=4 --training.grad_accum=1" -- --optimizer.eps=1e-4 "${m[@]}"
echo "all moe_layouts checks passed"
