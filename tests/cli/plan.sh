#!/usr/bin/env bash
# `attnres inspect plan`: the cpu profile measures and predicts the config's
# layout; the h100 profile ranks every layout of N GPUs; bad input is refused.
source "$(dirname "$0")/lib.sh"
"$BIN" inspect plan "$SRC/configs/quickstart.json" --profile cpu --steps 1 \
  --model.n_layers=4 --parallel.pipeline=2 --parallel.virtual_stages=2 --training.grad_accum=2 \
  --training.steps=1 > cpu.txt
grep -q "measuring 4 chunks in one process" cpu.txt || { cat cpu.txt; fail "cpu profile: no measurement"; }
grep -qE "layout P2 V2 D1 cached, M=2: predicted step [0-9.]+ ms" cpu.txt || { cat cpu.txt; fail "cpu profile: no prediction"; }
pass "cpu profile predicts the config's layout"
"$BIN" inspect plan "$SRC/configs/gpu_350m.json" --profile h100 --gpus 8 \
  --training.device=cpu --training.precision=fp32 > gpu.txt
rows=$(grep -cE "^P[0-9]+ V[0-9] D[0-9]+ (naive|cached)" gpu.txt)
[[ $rows -ge 4 ]] || { cat gpu.txt; fail "h100 --gpus 8: only $rows layouts"; }
pass "h100 profile ranks $rows layouts of 8 GPUs"
expect_error "unknown profile" "unknown hardware profile 'tpu'" \
  "$BIN" inspect plan "$SRC/configs/quickstart.json" --profile tpu
expect_error "--gpus with the cpu profile" "--gpus ranks GPU layouts" \
  "$BIN" inspect plan "$SRC/configs/quickstart.json" --gpus 4
