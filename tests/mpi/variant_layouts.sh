#!/usr/bin/env bash
# The residual variants (model.residual's query, weights, score, key_norm,
# heads, window; docs/model.md "Residual variants") under mpirun equal the
# single process, as the AttnRes modes do (tests/mpi/train_exact.sh): each
# Mix is one pass over the sources the stages already send (an input query's
# v is one of them), so pipelines that keep every sum in the single-process
# order (V = 1, or without the cache) are bit for bit; the cache, data
# parallelism and ZeRO-1 (which reassociate sums) within relative 1e-5; a run stopped on one layout and resumed on another
# continues exactly; a checkpoint of another variant is refused, naming the
# key. Block S = 3 over 8 layers (the base config), and Full with a window.
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config
block=(--model.residual='{"mode": "block", "block_size": 3, "query": "input", "score": "sigmoid", "heads": 2, "key_norm": false}')
full=(--model.residual='{"mode": "full", "window": 3, "weights": "scalars"}')

"$BIN" train base.json --checkpoint.dir=ck_1 --run.dir=run_1 "${block[@]}" 2>log_1.txt \
  || { cat log_1.txt; fail "single process, block variant"; }
grep -q 'attn_res.query_proj.weight' <("$BIN" inspect checkpoint ck_1/step_00000008) \
  || fail "no input query in the checkpoint"
same_as_reference 1 0 "--parallel.pipeline=4" \
  "--parallel.pipeline=2 --parallel.virtual_stages=2 --parallel.cache_blocks=false" \
  "--parallel.pipeline=2 --parallel.layers_per_chunk=[5,3]" -- "${block[@]}"
# A checkpoint of another variant: resuming it exits 2 naming the key, and
# nothing is written into it.
sum_before=$(cat ck_1/step_00000008/* | md5sum)
expect_error "resume a checkpoint of another residual variant" "model.residual" \
  "$BIN" train base.json --checkpoint.dir=ck_x --run.dir=run_x --checkpoint.resume=ck_1/step_00000008
[[ $(cat ck_1/step_00000008/* | md5sum) == "$sum_before" ]] || fail "a refused run changed the checkpoint"

"$BIN" train base.json --checkpoint.dir=ck_e --run.dir=run_e --optimizer.eps=1e-4 "${block[@]}" 2>log_e.txt \
  || { cat log_e.txt; fail "single process (eps 1e-4)"; }
same_as_reference e 1e-5 "--parallel.pipeline=2 --parallel.virtual_stages=2" \
  "--parallel.data=2 --training.grad_accum=2" \
  "--parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 --parallel.zero=1" \
  -- "${block[@]}" --optimizer.eps=1e-4
resume_on e 1e-5 "--parallel.pipeline=2" "" -- "${block[@]}" --optimizer.eps=1e-4

rm -rf ck_1 run_1
"$BIN" train base.json --checkpoint.dir=ck_1 --run.dir=run_1 "${full[@]}" 2>log_1.txt \
  || { cat log_1.txt; fail "single process, full variant"; }
same_as_reference 1 0 "--parallel.pipeline=4 --parallel.virtual_stages=2 --parallel.cache_blocks=false" \
  "--parallel.pipeline=2 --parallel.layers_per_chunk=[3,5]" -- "${full[@]}"
resume_on 1 0 "" "--parallel.pipeline=2" -- "${full[@]}"

# DenseFormer: its sources X_0 .. X_l cross the boundaries (one a layer, as
# Block AttnRes with S = 2 to the pipeline); each average reads them all.
dense=(--model.residual='{"mode": "denseformer"}')
rm -rf ck_1 run_1 ck_e run_e
"$BIN" train base.json --checkpoint.dir=ck_1 --run.dir=run_1 "${dense[@]}" 2>log_1.txt \
  || { cat log_1.txt; fail "single process, denseformer"; }
grep -q 'model.layers.7.attn_res.dwa' <("$BIN" inspect checkpoint ck_1/step_00000008) \
  || fail "no depth-weighted averages in the checkpoint"
same_as_reference 1 0 "--parallel.pipeline=4" \
  "--parallel.pipeline=2 --parallel.virtual_stages=2 --parallel.cache_blocks=false" -- "${dense[@]}"
"$BIN" train base.json --checkpoint.dir=ck_e --run.dir=run_e --optimizer.eps=1e-4 "${dense[@]}" 2>log_e.txt \
  || { cat log_e.txt; fail "single process (eps 1e-4), denseformer"; }
same_as_reference e 1e-5 "--parallel.pipeline=2 --parallel.virtual_stages=2" \
  "--parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 --parallel.zero=1" \
  -- "${dense[@]}" --optimizer.eps=1e-4
resume_on e 1e-5 "--parallel.pipeline=2" "" -- "${dense[@]}" --optimizer.eps=1e-4
echo "all residual-variant layout checks passed"
