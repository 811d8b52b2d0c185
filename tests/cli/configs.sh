#!/usr/bin/env bash
# Every shipped config (configs/*.json) validates, and the GPU ones describe
# the CUDA issue's models: 124M (d 768, L 12, T 1024) and 350M (d 1024, L 24,
# T 2048) on cuda in bf16.
source "$(dirname "$0")/lib.sh"
for c in "$SRC"/configs/*.json; do
  "$BIN" inspect config "$c" > "$(basename "$c").out" 2> err.txt || { cat err.txt; fail "$c does not validate"; }
  pass "$(basename "$c") validates"
done
expect_keys() {  # expect_keys FILE key=value...
  local f="$1"; shift
  for kv in "$@"; do
    grep -qE "\"${kv%%=*}\": ${kv#*=}(,|$)" "$f" || fail "$f: expected ${kv%%=*} = ${kv#*=}"
  done
}
expect_keys gpu_124m.json.out d_model=768 n_layers=12 n_heads=12 d_ff=2048 vocab_size=50304 \
  seq_len=1024 'device="cuda"' 'precision="bf16"'
expect_keys gpu_350m.json.out d_model=1024 n_layers=24 n_heads=16 d_ff=2816 vocab_size=50304 \
  seq_len=2048 'device="cuda"' 'precision="bf16"'
pass "gpu_124m.json and gpu_350m.json are the issue's 124M and 350M models on cuda in bf16"
