#!/usr/bin/env bash
# `attnres inspect attention`: one row per depth Mix (2L sublayers, then the
# final one) over the sources it reads, the mean weights over a batch's
# tokens: in Block mode each row sums to one over e, the completed blocks and
# the partial sum; with a residual variant's depth window the row covers the
# embedding and the W most recent outputs, which "sources" names; sigmoid
# weights (2 heads, averaged) are each in (0, 1) and need not sum to one; a
# baseline checkpoint is refused (exit 2).
source "$(dirname "$0")/lib.sh"
make_corpus
write_base_json 3 4 1 0 1
run() {  # run NAME RESIDUAL: train 4 steps, inspect the last checkpoint
  "$BIN" train base.json --checkpoint.dir="ck_$1" --run.dir="run_$1" --model.residual="$2" 2>"log_$1.txt" \
    || { cat "log_$1.txt"; fail "$1: train"; }
  "$BIN" inspect attention --checkpoint "ck_$1/step_00000004" --data 'shards/tiny_val_*.bin' \
    > "attn_$1.json" 2>"err_$1.txt" || { cat "err_$1.txt"; fail "$1: inspect attention"; }
}
run block '{"mode": "block", "block_size": 4}'
run window '{"mode": "full", "window": 2, "score": "sigmoid", "heads": 2}'
"$PY" - attn_block.json attn_window.json <<'PY' || fail "inspect attention's rows"
import json, sys
block, window = (json.load(open(f)) for f in sys.argv[1:3])
# Block S = 4 over 6 sublayers: [e] [e, p] x3 | [e, b_1] [e, b_1, p] | final [e, b_1, p]
assert [len(r) for r in block["rows"]] == [1, 2, 2, 2, 2, 3, 3], block
assert all(abs(sum(r) - 1) < 1e-6 and min(r) > 0 for r in block["rows"]), block
# W = 2: e and the 2 most recent outputs, b_j = y_{j-1}
want = [[0], [0, 1], [0, 1, 2], [0, 2, 3], [0, 3, 4], [0, 4, 5], [0, 5, 6]]
assert window["window"] == 2 and window["sources"] == want, window
assert [len(r) for r in window["rows"]] == [len(s) for s in want], window
assert window["score"] == "sigmoid" and all(0 < a < 1 for r in window["rows"] for a in r), window
assert any(abs(sum(r) - 1) > 0.2 for r in window["rows"]), "sigmoid weights summing to one"
print("  rows and sources as the Mixes read them")
PY
pass "inspect attention: Block rows, a window's sources, sigmoid weights"
"$BIN" train base.json --checkpoint.dir=ck_base --run.dir=run_base --model.residual.mode=baseline \
  --model.residual.block_size=0 2>log_base.txt || { cat log_base.txt; fail "baseline: train"; }
expect_error "inspect attention of a baseline checkpoint" "baseline residuals (no depth attention)" \
  "$BIN" inspect attention --checkpoint ck_base/step_00000004 --data 'shards/tiny_val_*.bin'
