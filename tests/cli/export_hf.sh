#!/usr/bin/env bash
# `attnres export hf` checked against the binary under Debian's python3-torch
# (tests/cli/hf_export_check.py): tiny models in every residual mode (block
# with uneven blocks, given by block_size and by n_blocks), GQA and MHA, tied
# and untied embeddings, a vocabulary padded past the tokenizer's, mixture-of-
# experts layers (sigmoid and softmax routers, shared experts, the aux-free
# bias, a routed scale, dense first layers). The
# exported PyTorch model's per-token log-probabilities equal `attnres score`
# within 1e-5 relative (fp32), its greedy 32-token KV-cache generation equals
# `attnres generate --temperature 0`, the bf16 and sharded exports load, and
# `attnres eval --task hellaswag` equals acc / acc_norm computed in Python.
# Then the commands' rejections of bad input.
# ATTNRES_TEST_PART=transformers (its own CTest test): the same exports loaded
# by transformers' AutoModelForCausalLM instead, skipped (exit code 77) where
# transformers is not installed.
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
part="${ATTNRES_TEST_PART:-}"
case "$part" in
  ""|transformers) ;;
  *) fail "unknown ATTNRES_TEST_PART '$part' (transformers, or unset)" ;;
esac
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "skipped: $PY cannot import torch (apt-get install python3-torch; scripts/install_deps.sh)"
  exit 77
fi
if [[ $part == transformers ]] && ! "$PY" -c "import transformers" 2>/dev/null; then
  echo "skipped: $PY cannot import transformers: AutoModelForCausalLM.from_pretrained(dir," \
    "trust_remote_code=True) was not checked"
  exit 77
fi
make_corpus

# HellaSwag-format questions (tests/cli/make_hellaswag.py): contexts longer
# than a sequence, endings of different byte lengths, a non-ASCII ending.
"$PY" "$SRC/tests/cli/make_hellaswag.py" hellaswag.jsonl 12 corpus/doc1.txt

base='{"vocab_size": 320, "d_model": 32, "n_heads": 4, "d_ff": 64}'
cat > cfg.json <<JSON
{"model": $base,
 "optimizer": {"lr": 1e-2},
 "training": {"steps": 40, "micro_batch_size": 3, "seq_len": 32, "seed": 5},
 "data": {"train": "shards/tiny_train_*.bin", "tokenizer": "tok.json"},
 "run": {"dir": "run"}}
JSON

cases=()
# run_case NAME OVERRIDES...: train, export three ways, score, generate, eval.
run_case() {
  local name="$1"; shift
  "$BIN" train cfg.json --checkpoint.dir="ck_$name" --run.dir="run_$name" "$@" 2>"train_$name.log" \
    || { cat "train_$name.log"; fail "$name: training"; }
  local ck="ck_$name/step_00000040"
  "$BIN" export hf --checkpoint "$ck" --out "hf_$name" 2>/dev/null || fail "$name: export fp32"
  "$BIN" export hf --checkpoint "$ck" --out "hf16_$name" --dtype bf16 2>/dev/null || fail "$name: export bf16"
  "$BIN" export hf --checkpoint "$ck" --out "hfs_$name" --max-shard-size 20KB 2>/dev/null \
    || fail "$name: export sharded"
  ls "hfs_$name"/model-00001-of-*.safetensors "hfs_$name"/model.safetensors.index.json >/dev/null \
    || fail "$name: no shards"
  for f in config.json configuration_attnres.py modeling_attnres.py generation_config.json \
           attnres_tokenizer.json README.md model.safetensors; do
    [[ -f "hf_$name/$f" ]] || fail "$name: export lacks $f"
  done
  # Our own BPE format is not a Hugging Face tokenizers file: not named tokenizer.json.
  [[ ! -e "hf_$name/tokenizer.json" ]] || fail "$name: an attnres-bpe tokenizer exported as tokenizer.json"
  # Every config.json field against the checkpoint's config (the export's,
  # and the one the checkpoint itself carries).
  for dir in "hf_$name" "$ck"; do
    "$PY" "$SRC/tests/cli/hf_config_check.py" "$ck" "$dir" || fail "$name: $dir/config.json"
  done
  if [[ $* == *model.kda* || $* == *model.mla* ]]; then
    grep -q '"model_type": "kimi_linear"' "hf_$name/config.json" || fail "$name: model_type"
  else
    grep -q '"model_type": "attnres"' "hf_$name/config.json" || fail "$name: model_type"
  fi
  "$BIN" score --checkpoint "$ck" --text "The quick brown fox jumps over the lazy dog while the jury said that" \
    > "score1_$name.json" 2>/dev/null || fail "$name: score"
  "$BIN" score --checkpoint "$ck" --text "Document 3 line 17: the election was fair. \
Document 4 line 1: the quick" > "score2_$name.json" 2>/dev/null || fail "$name: score 2"
  "$BIN" generate --checkpoint "$ck" --prompt "The jury" --tokens 32 --temperature 0 --json \
    > "gen1_$name.json" 2>/dev/null || fail "$name: generate"
  "$BIN" generate --checkpoint "$ck" --prompt "Document 2 line" --tokens 32 --temperature 0 --json \
    > "gen2_$name.json" 2>/dev/null || fail "$name: generate 2"
  "$BIN" eval --checkpoint "$ck" --task hellaswag --data hellaswag.jsonl --per-example \
    > "eval_$name.json" 2>/dev/null || fail "$name: eval --task"
  "$BIN" eval --checkpoint "$ck" --task hellaswag --data hellaswag.jsonl --per-example --scoring llm.c \
    > "eval_llmc_$name.json" 2>/dev/null || fail "$name: eval --task --scoring llm.c"
  cases+=("{\"name\": \"$name\", \"fp32\": \"hf_$name\", \"bf16\": \"hf16_$name\",
    \"sharded\": \"hfs_$name\", \"checkpoint_tokenizer\": \"$ck/tokenizer.json\",
    \"score\": [\"score1_$name.json\", \"score2_$name.json\"],
    \"generate\": [\"gen1_$name.json\", \"gen2_$name.json\"], \"tokens\": 32,
    \"eval\": \"eval_$name.json\", \"eval_llmc\": \"eval_llmc_$name.json\", \"tasks\": \"hellaswag.jsonl\", \"seq_len\": 32}")
  pass "$name: trained, exported (fp32, bf16, sharded), scored, generated, evaluated"
}
run_case baseline_tied_mha --model.n_layers=2 --model.tie_embeddings=true
run_case full_gqa --model.n_layers=3 --model.n_kv_heads=2 --model.residual='{"mode": "full"}'
# L = 3, S = 4: blocks of 4 and 2 sublayers; the final Mix reads a partial sum.
run_case block_uneven_tied --model.n_layers=3 --model.n_kv_heads=2 --model.tie_embeddings=true \
  --model.residual='{"mode": "block", "block_size": 4}'
# L = 4, N = 3: S = ceil(8 / 3) = 3, blocks of 3, 3 and 2.
run_case block_nblocks_gqa --model.n_layers=4 --model.n_kv_heads=1 \
  --model.residual='{"mode": "block", "n_blocks": 3}'
grep -q '"n_blocks": 3' hf_block_nblocks_gqa/config.json || fail "n_blocks missing from config.json"
# The residual variants (docs/model.md "Residual variants"), each key away
# from its default in one export at least: an input query with sigmoid
# weights over 2 heads in Block mode; scalar weights in Full; raw keys with a
# depth window of 3 over 4 heads in Full.
run_case variant_block_input_sigmoid_heads --model.n_layers=3 \
  --model.residual='{"mode": "block", "block_size": 2, "query": "input", "score": "sigmoid", "heads": 2}'
run_case variant_full_scalars --model.n_layers=2 --model.residual='{"mode": "full", "weights": "scalars"}'
run_case variant_full_window_raw_keys --model.n_layers=3 --model.n_kv_heads=2 \
  --model.residual='{"mode": "full", "key_norm": false, "window": 3, "heads": 4}'
grep -q '"window": 3' hf_variant_full_window_raw_keys/config.json || fail "window missing from config.json"
# DenseFormer (docs/model.md "DenseFormer"), its averages trained away from
# their start, with GQA and tied embeddings.
run_case denseformer_tied --model.n_layers=3 --model.n_kv_heads=2 --model.tie_embeddings=true \
  --model.residual='{"mode": "denseformer"}'
# Mixture-of-experts models under DeepSeek-V3's names: sigmoid routing with a
# shared expert and the aux-free bias (a rate that moves the choice within 40
# steps: the export must carry the bias and the modeling code use it); softmax
# routing with the auxiliary loss; a routed scale, no balancing and two dense
# layers of three.
run_case moe_baseline_sigmoid --model.n_layers=2 --model.tie_embeddings=true \
  --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 16, "shared_experts": 1, "bias_rate": 0.01}'
run_case moe_full_softmax --model.n_layers=2 --model.n_kv_heads=2 --model.residual='{"mode": "full"}' \
  --model.moe='{"experts": 3, "top_k": 2, "expert_d_ff": 24, "router": "softmax",
                "balance": "aux_loss", "dense_layers": 0}'
run_case moe_block_scaled --model.n_layers=3 --model.residual='{"mode": "block", "block_size": 4}' \
  --model.moe='{"experts": 5, "top_k": 3, "expert_d_ff": 8, "routed_scale": 2.5, "balance": "none",
                "dense_layers": 2}'
# One export per MoE option the cases above leave at its default, each
# compared with our logits: a capacity factor that drops slots on every scored
# text (0.5: half the slots fit) in Block mode; two shared experts with a
# routed scale other than 1 and softmax routing in the baseline.
run_case moe_block_capacity --model.n_layers=2 --model.residual='{"mode": "block", "block_size": 2}' \
  --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 16, "capacity_factor": 0.5, "bias_rate": 0.01}'
run_case moe_baseline_shared_scaled --model.n_layers=2 \
  --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 12, "shared_experts": 2, "routed_scale": 1.7,
                "router": "softmax", "balance": "none"}'
"$PY" - hf_moe_baseline_sigmoid <<'PYEOF' || fail "the MoE export's names or bias"
import json, sys
sys.path.insert(0, sys.argv[1])
from modeling_attnres import read_weights
w, cfg = read_weights(sys.argv[1]), json.load(open(sys.argv[1] + "/config.json"))
assert cfg["model_type"] == "attnres" and cfg["n_routed_experts"] == 4, cfg
assert cfg["topk_method"] == "noaux_tc" and cfg["first_k_dense_replace"] == 1, cfg
b = w["model.layers.1.mlp.gate.e_score_correction_bias"]
assert b.dtype.is_floating_point and b.abs().max() > 0.005, b
for n in ["model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight",
          "model.layers.1.mlp.experts.3.down_proj.weight",
          "model.layers.1.mlp.shared_experts.up_proj.weight"]:
    assert n in w, n
print(f"  MoE export: DeepSeek-V3 names, bias range {b.min():.3f}..{b.max():.3f}")
PYEOF

# Kimi Linear hybrids (model.kda; the softmax layers GQA or MLA) under Kimi
# Linear's config fields and MoE names; the modeling code runs KDA token by
# token in plain torch. Sequences of 32 tokens, KDA chunks of 64: the score
# and generate texts stay within one chunk of the trainer's chunkwise form.
kda='{"heads": 2, "head_dim": 8, "conv_size": 3}'
run_case kda_block_gqa --model.n_layers=4 --model.n_kv_heads=2 \
  --model.residual='{"mode": "block", "block_size": 3}' --model.kda="$kda"
run_case kda_full_mla_moe --model.n_layers=4 --model.residual='{"mode": "full"}' \
  --model.kda='{"heads": 2, "head_dim": 8, "conv_size": 4, "full_attention_layers": [2, 4]}' \
  --model.mla='{"kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6}' \
  --model.moe='{"experts": 4, "top_k": 2, "expert_d_ff": 16, "shared_experts": 1, "bias_rate": 0.01}'
run_case kda_baseline_mla_rope --model.n_layers=3 --model.kda="$kda" \
  --model.mla='{"kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 8, "rope": true}'
"$PY" - hf_kda_full_mla_moe <<'PYEOF' || fail "the Kimi Linear export's config or names"
import json, sys
sys.path.insert(0, sys.argv[1])
from modeling_attnres import read_weights
w, cfg = read_weights(sys.argv[1]), json.load(open(sys.argv[1] + "/config.json"))
lac = cfg["linear_attn_config"]
assert cfg["model_type"] == "kimi_linear", cfg
assert lac == {"kda_layers": [1, 3], "full_attn_layers": [2, 4], "num_heads": 2, "head_dim": 8,
               "short_conv_kernel_size": 4}, lac
want = {"kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6,
        "mla_use_nope": True, "q_lora_rank": None, "num_experts": 4, "num_experts_per_token": 2,
        "num_shared_experts": 1, "moe_intermediate_size": 16, "first_k_dense_replace": 1,
        "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 1.0}
for k, v in want.items():
    assert cfg.get(k) == v, (k, cfg.get(k), v)
assert "n_routed_experts" not in cfg, "DeepSeek's MoE names beside Kimi's"
for n in ["model.layers.0.mlp.gate_proj.weight", "model.layers.1.block_sparse_moe.gate.weight",
          "model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
          "model.layers.1.block_sparse_moe.experts.3.w1.weight",
          "model.layers.1.block_sparse_moe.experts.3.w2.weight",
          "model.layers.1.block_sparse_moe.experts.3.w3.weight",
          "model.layers.1.block_sparse_moe.shared_experts.up_proj.weight",
          "model.layers.0.self_attn.q_conv1d.weight", "model.layers.0.self_attn.A_log",
          "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"]:
    assert n in w, n
assert not any(".mlp.experts." in n for n in w), "an expert under DeepSeek's name"
readme = open(sys.argv[1] + "/README.md").read()
assert "kv_a_layernorm" in readme and "Attention Residuals" in readme, readme[-800:]
print(f"  Kimi Linear export: config fields, {len(w)} tensors under Kimi's names, README's differences")
PYEOF

( IFS=,; echo "[${cases[*]}]" ) > cases.json
if [[ $part == transformers ]]; then
  "$PY" "$SRC/tests/cli/hf_export_check.py" --transformers cases.json \
    || fail "AutoModelForCausalLM disagrees with the binary"
  echo "all transformers export checks passed"
  exit 0
fi
"$PY" "$SRC/tests/cli/hf_export_check.py" cases.json || fail "the exported models disagree"

# Rejections: exit 2 and a message naming the problem.
ck=ck_full_gqa/step_00000040
expect_error "export: unknown format" "unknown format 'onnx'" "$BIN" export onnx --checkpoint "$ck" --out x
expect_error "export: bad dtype" "--dtype" "$BIN" export hf --checkpoint "$ck" --out x --dtype fp16
expect_error "export: bad shard size" "--max-shard-size" "$BIN" export hf --checkpoint "$ck" --out x \
  --max-shard-size lots
expect_error "export: no --out" "--out" "$BIN" export hf --checkpoint "$ck"
expect_error "export: into an earlier export" "not empty" "$BIN" export hf --checkpoint "$ck" --out hf_full_gqa
expect_error "export: into the checkpoint" "checkpoint itself" "$BIN" export hf --checkpoint "$ck" \
  --out "$ck" --force
[[ ! -e x ]] || fail "a rejected export wrote files"
"$BIN" export hf --checkpoint "$ck" --out hfs_full_gqa --force 2>/dev/null || fail "export --force"
[[ -f hfs_full_gqa/model.safetensors && ! -e hfs_full_gqa/model.safetensors.index.json ]] \
  || fail "--force left the earlier shards behind"
pass "export --force replaced a sharded export by one file"
expect_error "score: empty text" "--text is empty" "$BIN" score --checkpoint "$ck" --text ""
expect_error "score: missing tokenizer" "nope.json" "$BIN" score --checkpoint "$ck" --text hi \
  --tokenizer nope.json
expect_error "eval: unknown task" "unknown --task 'piqa'" "$BIN" eval --checkpoint "$ck" --task piqa \
  --data hellaswag.jsonl
head -3 hellaswag.jsonl > bad.jsonl
echo '{"ctx": "A man", "endings": ["runs.", "sits."], "label": 2}' >> bad.jsonl
expect_error "eval: label outside the endings" "bad.jsonl:4" "$BIN" eval --checkpoint "$ck" \
  --task hellaswag --data bad.jsonl
echo '{"ctx": "A man", "endings": ["runs."' > bad2.jsonl
expect_error "eval: a line that is not JSON" "bad2.jsonl:1" "$BIN" eval --checkpoint "$ck" \
  --task hellaswag --data bad2.jsonl
expect_error "eval: an ending longer than a sequence" "--seq-len" "$BIN" eval --checkpoint "$ck" \
  --task hellaswag --data hellaswag.jsonl --seq-len 2
expect_error "eval: --batches with --task" "--batches" "$BIN" eval --checkpoint "$ck" \
  --task hellaswag --data hellaswag.jsonl --batches 3
echo "all export checks passed"
