#!/usr/bin/env bash
# Kimi Linear hybrids (model.kda: KDA layers with softmax attention every 4
# and in the last layer) under mpirun equal the single process, as dense and
# MoE models do (tests/mpi/train_exact.sh, moe_layouts.sh): pipelines that
# keep every sum in the single-process order bit for bit, metrics and every
# checkpoint tensor; cached interleaving, data parallelism and ZeRO-1 within
# relative 1e-5; a hybrid with MoE MLPs under expert parallelism; a run
# stopped on one layout and resumed on another continues exactly; the
# softmax layers as MLA too; a checkpoint of another layer pattern is refused,
# naming the key or tensor. The sequences (T = 16) span one KDA chunk, so
# chunk boundaries are the kernel tests' (tests/kernels/test_kda.cpp).
source "$(dirname "$0")/lib.sh"
make_corpus
write_mpi_config  # 8 layers: KDA in 1-3 and 5-7, softmax in 4 and 8
kda=(--model.kda='{"heads": 2, "head_dim": 8, "conv_size": 3}')

"$BIN" train base.json --checkpoint.dir=ck_1 --run.dir=run_1 "${kda[@]}" 2>log_1.txt \
  || { cat log_1.txt; fail "single process"; }
grep -q 'self_attn.q_conv1d.weight' <("$BIN" inspect checkpoint ck_1/step_00000008) \
  || fail "no KDA tensors in the checkpoint"
# A checkpoint of another layer pattern: resuming it, or starting from its
# weights, exits 2 naming what differs; nothing is written into it.
other=(--model.kda='{"heads": 2, "head_dim": 8, "conv_size": 3, "full_attention_layers": [2, 8]}')
sum_before=$(cat ck_1/step_00000008/* | md5sum)
expect_error "resume a checkpoint of another layer pattern" "model.kda.full_attention_layers" \
  "$BIN" train base.json --checkpoint.dir=ck_x --run.dir=run_x --checkpoint.resume=ck_1/step_00000008 "${other[@]}"
expect_error "model.init_from a checkpoint of another layer pattern" "its layer 2 (1-based) is a KDA layer, this config's a GQA layer" \
  "$BIN" train base.json --checkpoint.dir=ck_x --run.dir=run_x --model.init_from=ck_1/step_00000008 "${other[@]}"
expect_error "model.init_from a hybrid into a softmax-only model" "config key model.kda: ck_1/step_00000008 holds another layer pattern" \
  "$BIN" train base.json --checkpoint.dir=ck_x --run.dir=run_x --model.init_from=ck_1/step_00000008
[[ $(cat ck_1/step_00000008/* | md5sum) == "$sum_before" ]] || fail "a refused run changed the checkpoint"
# An uneven split (parallel.layers_per_chunk, as `inspect plan` balances
# stages) is bit for bit too.
same_as_reference 1 0 "--parallel.pipeline=4" \
  "--parallel.pipeline=2 --parallel.virtual_stages=2 --parallel.cache_blocks=false" \
  "--parallel.pipeline=2 --parallel.layers_per_chunk=[5,3]" -- "${kda[@]}"

"$BIN" train base.json --checkpoint.dir=ck_e --run.dir=run_e --optimizer.eps=1e-4 "${kda[@]}" 2>log_e.txt \
  || { cat log_e.txt; fail "single process (eps 1e-4)"; }
same_as_reference e 1e-5 "--parallel.pipeline=4 --parallel.virtual_stages=2" \
  "--parallel.data=2 --training.grad_accum=2" \
  "--parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 --parallel.zero=1" \
  -- "${kda[@]}" --optimizer.eps=1e-4
resume_on e 1e-5 "--parallel.pipeline=2" "" -- "${kda[@]}" --optimizer.eps=1e-4

# With MoE MLPs, under expert parallelism.
moe=(--model.moe='{"experts": 4, "top_k": 2, "shared_experts": 1, "expert_d_ff": 24}')
rm -rf ck_e run_e
"$BIN" train base.json --checkpoint.dir=ck_e --run.dir=run_e --optimizer.eps=1e-4 "${kda[@]}" "${moe[@]}" \
  2>log_e.txt || { cat log_e.txt; fail "single process, hybrid with MoE"; }
# 3e-5: the losses agree to 2e-6, but AdamW's second moments of the decay
# path's small gradients (f_b_proj's) reach 1.5e-5: v = g^2 doubles the
# relative rounding of gradients summed in another order (the experts' rows
# come back through the all-to-all).
same_as_reference e 3e-5 "--parallel.data=2 --parallel.expert=2 --training.grad_accum=2" \
  -- "${kda[@]}" "${moe[@]}" --optimizer.eps=1e-4

# The softmax layers as MLA (DeepSeek-V3's decoupled RoPE on, to carry k_r's
# rotation through every layout): pipelines bit for bit, the rest within 3e-5.
mla=(--model.mla='{"kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "rope": true}')
rm -rf ck_1 run_1 ck_e run_e
"$BIN" train base.json --checkpoint.dir=ck_1 --run.dir=run_1 "${kda[@]}" "${mla[@]}" 2>log_1.txt \
  || { cat log_1.txt; fail "single process, KDA + MLA"; }
grep -q 'self_attn.kv_a_proj_with_mqa.weight' <("$BIN" inspect checkpoint ck_1/step_00000008) \
  || fail "no MLA tensors in the checkpoint"
# Decoding a hybrid: KDA's state and convolution windows, MLA's keys and
# values (tests/model/test_model.cpp holds it equal to the full forward).
"$BIN" generate --checkpoint ck_1/step_00000008 --prompt "the quick" --tokens 12 --temperature 0 \
  --json > gen.json 2>err.txt || { cat err.txt; fail "generate from a KDA + MLA hybrid"; }
/usr/bin/python3 -c 'import json,sys; t=json.load(open("gen.json"))["tokens"]; sys.exit(len(t) != 12)' \
  || fail "generate did not give 12 tokens: $(cat gen.json)"
"$BIN" score --checkpoint ck_1/step_00000008 --text "the quick brown fox" > score.txt 2>err.txt \
  || { cat err.txt; fail "score a KDA + MLA hybrid"; }
pass "generate (greedy, 12 tokens) and score run on a KDA + MLA hybrid"
same_as_reference 1 0 "--parallel.pipeline=4" -- "${kda[@]}" "${mla[@]}"
"$BIN" train base.json --checkpoint.dir=ck_e --run.dir=run_e --optimizer.eps=1e-4 "${kda[@]}" "${mla[@]}" \
  2>log_e.txt || { cat log_e.txt; fail "single process (eps 1e-4), KDA + MLA"; }
# 3e-5: the losses agree to 1e-6, but A_log's gradient (2 values, a sum over
# every token with much cancellation) carries its summation order's rounding
# into AdamW's first moment at 1.2e-5 relative on some CPUs (an AVX2 AMD EPYC, 2026-12-03).
same_as_reference e 3e-5 "--parallel.pipeline=2 --parallel.virtual_stages=2" \
  "--parallel.data=2 --training.grad_accum=2 --parallel.zero=1" \
  -- "${kda[@]}" "${mla[@]}" --optimizer.eps=1e-4
echo "all kda_layouts checks passed"
