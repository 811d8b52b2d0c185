#!/usr/bin/env bash
# What a new user meets first: `attnres bench --layers 1` builds a model its
# default block size fits (S = 4 cut to the model's 2 sublayers), while a
# block size given on the command line is still checked; and a switch given
# as --name=false is off, --name=true on, and any other value an error that
# names the switch.
source "$(dirname "$0")/lib.sh"

tiny=(--steps 1 --warmup 0 --d-model 32 --heads 4 --kv-heads 2 --d-ff 64 --vocab 97
      --seq-len 16 --batch 2)
"$BIN" bench "${tiny[@]}" --layers 1 >out.txt 2>err.txt \
  || { cat err.txt; fail "bench --layers 1 exited non-zero"; }
for mode in baseline "block S=2" full; do
  grep -qE "^$mode " out.txt || { cat out.txt; fail "bench --layers 1: no row for $mode"; }
done
pass "bench --layers 1: baseline, block S=2 and full rows"
expect_error "bench --layers 1 --block-size 4" "block_size: 4 exceeds the 2 sublayers" \
  "$BIN" bench "${tiny[@]}" --layers 1 --block-size 4
expect_error "bench --layers 1 --n-blocks 3" "n_blocks: 3 exceeds the 2 sublayers" \
  "$BIN" bench "${tiny[@]}" --layers 1 --n-blocks 3

# Switches, on `inspect memory`'s --json (a table without it, JSON with it).
config="$SRC/configs/quickstart.json"
"$BIN" inspect memory "$config" --json=false >table.txt 2>err.txt || { cat err.txt; fail "--json=false"; }
"$BIN" inspect memory "$config" >plain.txt 2>err.txt || { cat err.txt; fail "inspect memory"; }
cmp -s table.txt plain.txt || { diff plain.txt table.txt; fail "--json=false did not print the table"; }
"$BIN" inspect memory "$config" --json=true >json.txt 2>err.txt || { cat err.txt; fail "--json=true"; }
"$PY" -c 'import json, sys; json.load(open(sys.argv[1]))' json.txt || fail "--json=true did not print JSON"
"$BIN" inspect memory "$config" --json --json=false >last.txt 2>err.txt || { cat err.txt; fail "--json --json=false"; }
cmp -s last.txt plain.txt || fail "--json --json=false: the last one given does not win"
pass "--json=false is off, --json=true on, the last one given wins"
expect_error "--json=yes" "option --json is a switch" "$BIN" inspect memory "$config" --json=yes
expect_error "bench --cuda-graphs on the cpu" "--cuda-graphs needs --device cuda" "$BIN" bench --cuda-graphs
pass "bench --cuda-graphs on the cpu: refused"
echo "all bench and flag checks passed"
