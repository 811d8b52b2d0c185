#!/usr/bin/env bash
# Every shipped config (configs/*.json) validates, and the GPU ones describe
# the GPU reference models: 124M (d 768, L 12, T 1024) and 350M (d 1024, L 24,
# T 2048) on cuda in bf16.
source "$(dirname "$0")/lib.sh"
# A build without CUDA refuses device "cuda": the GPU configs are then checked
# with the device and precision overridden (everything else as shipped).
for c in "$SRC"/configs/*.json; do
  out="$(basename "$c").out"
  if ! "$BIN" inspect config "$c" > "$out" 2> err.txt; then
    grep -q "this build has no CUDA backend" err.txt || { cat err.txt; fail "$c does not validate"; }
    "$BIN" inspect config "$c" --training.device=cpu --training.precision=fp32 > "$out" 2> err.txt \
      || { cat err.txt; fail "$c does not validate (device overridden to cpu)"; }
    echo "note: $(basename "$c") checked with training.device=cpu (this build has no CUDA backend)"
    no_cuda=1
  fi
  pass "$(basename "$c") validates"
done
expect_keys() {  # expect_keys FILE key=value...
  local f="$1"; shift
  for kv in "$@"; do
    grep -qE "\"${kv%%=*}\": ${kv#*=}(,|$)" "$f" || fail "$f: expected ${kv%%=*} = ${kv#*=}"
  done
}
gpu=('device="cuda"' 'precision="bf16"')
[[ -z "${no_cuda:-}" ]] || gpu=()  # overridden above
expect_keys gpu_124m.json.out d_model=768 n_layers=12 n_heads=12 d_ff=2048 vocab_size=50304 \
  seq_len=1024 "${gpu[@]}"
expect_keys gpu_350m.json.out d_model=1024 n_layers=24 n_heads=16 d_ff=2816 vocab_size=50304 \
  seq_len=2048 "${gpu[@]}"
pass "gpu_124m.json and gpu_350m.json are the 124M and 350M reference models${gpu:+ on cuda in bf16}"
