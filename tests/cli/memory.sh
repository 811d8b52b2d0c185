#!/usr/bin/env bash
# `attnres inspect memory`: the fit search agrees with the planner itself (the
# reported largest n_layers and micro_batch_size fit, one more does not), a
# small budget does not fit, and bad flags are refused. (The planner against
# measured memory: tests/mpi/memory.sh.)
source "$(dirname "$0")/lib.sh"
cfg="$SRC/configs/gpu_350m.json"

"$BIN" inspect memory "$cfg" --gpu-memory 80 > out.txt || { cat out.txt; fail "inspect memory"; }
grep -q "needs .* GiB: fits" out.txt || { cat out.txt; fail "350M on 80 GiB should fit"; }
L=$(sed -nE 's/.*largest model.n_layers that fits.*: ([0-9]+)$/\1/p' out.txt)
B=$(sed -nE 's/.*largest training.micro_batch_size that fits: ([0-9]+)$/\1/p' out.txt)
[[ -n "$L" && -n "$B" ]] || { cat out.txt; fail "no largest n_layers / micro_batch_size"; }
total() {  # total GiB of the largest rank under overrides
  "$BIN" inspect memory "$cfg" --json "$@" | /usr/bin/python3 -c \
    "import json,sys; print(max(r['total'] for r in json.load(sys.stdin)) / 2**30)"
}
fits() { awk -v t="$(total "$@")" 'BEGIN { exit !(t <= 80) }'; }
fits --model.n_layers=$L || fail "n_layers = $L reported to fit, but needs $(total --model.n_layers=$L) GiB"
fits --model.n_layers=$((L + 1)) && fail "n_layers = $((L + 1)) fits too: $L is not the largest"
fits --training.micro_batch_size=$B || fail "micro_batch_size = $B does not fit"
fits --training.micro_batch_size=$((B + 1)) && fail "micro_batch_size = $((B + 1)) fits too"
pass "fit search: n_layers <= $L, micro_batch_size <= $B on 80 GiB, each the largest that fits"

"$BIN" inspect memory "$cfg" --gpu-memory 4 | grep -q "does NOT fit" || fail "350M fits in 4 GiB?"
# Recomputation and ZeRO-1 shrink what they should.
none=$(total --parallel.data=4 --training.recompute=none)
layer=$(total --parallel.data=4 --training.recompute=layer)
zero=$(total --parallel.data=4 --parallel.zero=1)
awk -v n="$none" -v l="$layer" -v z="$zero" 'BEGIN { exit !(l < n && z < n) }' \
  || fail "recompute=layer ($layer GiB) and zero=1 ($zero GiB) should need less than $none GiB"
pass "350M at D=4: $none GiB, recompute=layer $layer GiB, zero=1 $zero GiB"

expect_error "--gpu-memory not a number" "gpu-memory" "$BIN" inspect memory "$cfg" --gpu-memory lots
expect_error "--gpu-memory negative" "positive number of GiB" "$BIN" inspect memory "$cfg" --gpu-memory -1
expect_error "unknown flag" "unknown" "$BIN" inspect memory "$cfg" --gpus 8
echo "all inspect memory checks passed"
