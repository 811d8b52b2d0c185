#!/usr/bin/env bash
# Every key of the model section away from its default (issue 43), through the
# trainer, the checkpoint, `attnres score` / `eval` and the Hugging Face export
# (tests/model/test_model_keys.cpp checks the same settings in the model
# against the literal reference). For each case (norm_eps, rope_theta,
# tie_embeddings, n_kv_heads < n_heads, each residual mode, block_size and
# n_blocks, model.init_from):
# - training starts from random weights written by tests/cli/hf_keys_check.py
#   (model.init_from, at lr 1e-30: the checkpoint holds them unchanged), and the
#   trainer's val loss equals `attnres eval` of its checkpoint (a key the
#   trainer dropped but the checkpoint carried would split them);
# - hf_keys_check.py: config.json holds each value of the training config it
#   came from, and every field it writes is checked (and
#   generation_config.json); the exported weights are the init file's, under
#   docs/model.md section 3's names and shapes; the exported PyTorch model's
#   log-probabilities equal `attnres score`'s within 1e-5 x max(1, |log p|);
#   and setting each of rms_norm_eps, rope_theta, attn_res back to another
#   value moves them by more than 1e-3, so the comparison sees each one.
# Without python3-torch: skipped (exit code 77).
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "skipped: $PY cannot import torch (apt-get install python3-torch; scripts/install_deps.sh)"
  exit 77
fi
CHECK="$SRC/tests/cli/hf_keys_check.py"
make_corpus

cat > cfg.json <<JSON
{"model": {"vocab_size": 320, "d_model": 32, "n_heads": 4, "d_ff": 64},
 "optimizer": {"lr": 1e-30},
 "training": {"steps": 1, "micro_batch_size": 2, "seq_len": 32, "seed": 5},
 "data": {"train": "shards/tiny_train_*.bin", "val": "shards/tiny_val_*.bin", "tokenizer": "tok.json"},
 "eval": {"every": 1, "batches": 2},
 "run": {"dir": "run"}}
JSON
TEXT1="The quick brown fox jumps over the lazy dog while the jury said that the election was fair"
TEXT2="Document 3 line 17: the election was fair. Document 4 line 1: the quick brown fox"

cases=()
# run_case NAME MODEL_JSON: the model section's keys beyond cfg.json's, as JSON.
run_case() {
  local name="$1" model="$2"
  # The whole model section as given: cfg.json's and the case's.
  "$PY" -c 'import json, sys; m = json.load(open("cfg.json"))["model"]; m.update(json.loads(sys.argv[1])); print(json.dumps(m))' \
    "$model" > "model_$name.json"
  "$PY" "$CHECK" init "model_$name.json" "init_$name.safetensors" || fail "$name: init weights"
  local flags=()
  mapfile -t flags < <("$PY" -c 'import json, sys
for k, v in json.loads(sys.argv[1]).items(): print(f"--model.{k}={json.dumps(v)}")' "$model")
  "$BIN" train cfg.json "${flags[@]}" --model.init_from="init_$name.safetensors" \
    --checkpoint.dir="ck_$name" --run.dir="run_$name" 2>"train_$name.log" \
    || { cat "train_$name.log"; fail "$name: training"; }
  local ck="ck_$name/step_00000001" want got
  want=$(grep val_loss "run_$name/metrics.jsonl" | tail -1 | sed -E 's/.*"val_loss":([^,}]*).*/\1/')
  got=$("$BIN" eval --checkpoint "$ck" --data 'shards/tiny_val_*.bin' --batches 2 2>/dev/null \
        | sed -E 's/.*"loss":([^,}]*).*/\1/')
  [[ -n "$want" && "$want" == "$got" ]] || fail "$name: attnres eval $got != the trainer's val loss $want"
  "$BIN" export hf --checkpoint "$ck" --out "hf_$name" 2>/dev/null || fail "$name: export"
  "$BIN" score --checkpoint "$ck" --text "$TEXT1" > "score1_$name.json" 2>/dev/null || fail "$name: score"
  "$BIN" score --checkpoint "$ck" --text "$TEXT2" > "score2_$name.json" 2>/dev/null || fail "$name: score 2"
  cases+=("{\"name\": \"$name\", \"model\": $(cat "model_$name.json"), \"seq_len\": 32, \"step\": 1,
    \"init\": \"init_$name.safetensors\", \"export\": \"hf_$name\",
    \"score\": [\"score1_$name.json\", \"score2_$name.json\"]}")
  pass "$name: trained from model.init_from, eval = the trainer's val loss ($got), exported, scored"
}
run_case baseline_eps_theta_tied '{"n_layers": 2, "n_kv_heads": 2, "norm_eps": 0.5, "rope_theta": 7.0,
  "tie_embeddings": true}'
# L = 3, N = 4: S = ceil(6 / 4) = 2 (not 1, not 4).
run_case block_nblocks_gqa1 '{"n_layers": 3, "n_kv_heads": 1, "norm_eps": 0.25, "rope_theta": 3.0,
  "residual": {"mode": "block", "n_blocks": 4}}'
# L = 3, S = 4: blocks of 4 and 2 sublayers, the final Mix reads a partial sum.
run_case block_size_tied '{"n_layers": 3, "n_kv_heads": 2, "norm_eps": 0.5, "rope_theta": 1000000.0,
  "tie_embeddings": true, "residual": {"mode": "block", "block_size": 4}}'
run_case full_mha '{"n_layers": 3, "n_kv_heads": 4, "norm_eps": 0.01, "rope_theta": 50.0,
  "residual": {"mode": "full"}}'

( IFS=,; echo "[${cases[*]}]" ) > cases.json
"$PY" "$CHECK" check cases.json || fail "the exports do not carry the model keys"
echo "all export key checks passed"
