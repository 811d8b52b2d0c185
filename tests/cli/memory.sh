#!/usr/bin/env bash
# `attnres inspect memory`: the fit search agrees with the planner itself (the
# reported largest n_layers and micro_batch_size fit, one more does not), a
# small budget does not fit, and bad flags are refused. (The planner against
# measured memory: tests/mpi/memory.sh.)
#
# On configs/gpu_350m.json: as shipped (training.device = "cuda", bf16) with
# ATTNRES_TEST_PART=cuda, which needs a build with CUDA (not a GPU) and
# reports itself skipped (exit code 77) in one without; otherwise on the CPU
# in fp32 (the same config with the device and precision overridden), which
# every build runs.
source "$(dirname "$0")/lib.sh"
cfg="$SRC/configs/gpu_350m.json"
case "${ATTNRES_TEST_PART:-}" in
  cuda) dev=() ;;
  "") dev=(--training.device=cpu --training.precision=fp32) ;;
  *) fail "unknown ATTNRES_TEST_PART '$ATTNRES_TEST_PART' (cuda, or unset)" ;;
esac
inspect() { "$BIN" inspect memory "$cfg" "${dev[@]}" "$@"; }

rc=0
inspect --gpu-memory 80 > out.txt 2> err.txt || rc=$?
if ((rc != 0)) && grep -q "this build has no CUDA backend" err.txt; then
  echo "skipped: $cfg asks for training.device = \"cuda\", and this build has no CUDA backend"
  exit 77
fi
((rc == 0)) || { cat out.txt err.txt; fail "inspect memory (exit code $rc)"; }
grep -q "needs .* GiB: fits" out.txt || { cat out.txt; fail "350M on 80 GiB should fit"; }
L=$(sed -nE 's/.*largest model.n_layers that fits.*: ([0-9]+)$/\1/p' out.txt)
B=$(sed -nE 's/.*largest training.micro_batch_size that fits: ([0-9]+)$/\1/p' out.txt)
[[ -n "$L" && -n "$B" ]] || { cat out.txt; fail "no largest n_layers / micro_batch_size"; }
# total OVERRIDES...: GiB of the largest rank. Its caller must check its exit
# status: inside $(...) a failure does not stop the script by itself (an
# argument such as `awk -v t="$(total ...)"` swallowed it, and an empty total
# then "fitted").
total() {
  local json
  json=$(inspect --json "$@") || fail "inspect memory --json $*"
  /usr/bin/python3 -c "import json,sys; print(max(r['total'] for r in json.load(sys.stdin)) / 2**30)" \
    <<< "$json" || fail "inspect memory --json $*: unreadable output"
}
fits() {
  local t
  t=$(total "$@") || exit 1
  awk -v t="$t" 'BEGIN { exit !(t <= 80) }'
}
fits --model.n_layers=$L || fail "n_layers = $L reported to fit, but needs $(total --model.n_layers=$L) GiB"
fits --model.n_layers=$((L + 1)) && fail "n_layers = $((L + 1)) fits too: $L is not the largest"
fits --training.micro_batch_size=$B || fail "micro_batch_size = $B does not fit"
fits --training.micro_batch_size=$((B + 1)) && fail "micro_batch_size = $((B + 1)) fits too"
pass "fit search: n_layers <= $L, micro_batch_size <= $B on 80 GiB, each the largest that fits"

inspect --gpu-memory 4 > small.txt || { cat small.txt; fail "inspect memory --gpu-memory 4"; }
grep -q "does NOT fit" small.txt || { cat small.txt; fail "350M fits in 4 GiB?"; }
# Recomputation and ZeRO-1 shrink what they should.
none=$(total --parallel.data=4 --training.recompute=none) || exit 1
layer=$(total --parallel.data=4 --training.recompute=layer) || exit 1
zero=$(total --parallel.data=4 --parallel.zero=1) || exit 1
awk -v n="$none" -v l="$layer" -v z="$zero" 'BEGIN { exit !(l < n && z < n) }' \
  || fail "recompute=layer ($layer GiB) and zero=1 ($zero GiB) should need less than $none GiB"
pass "350M at D=4: $none GiB, recompute=layer $layer GiB, zero=1 $zero GiB"

expect_error "--gpu-memory not a number" "gpu-memory" inspect --gpu-memory lots
expect_error "--gpu-memory negative" "positive number of GiB" inspect --gpu-memory -1
expect_error "unknown flag" "unknown" inspect --gpus 8
echo "all inspect memory checks passed"
