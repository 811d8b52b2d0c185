#!/usr/bin/env bash
# `attnres bench` on the CPU prints one row per residual mode with positive
# throughput, in any build (a CUDA build on a machine without a GPU included),
# and refuses what it cannot do with a clear message.
source "$(dirname "$0")/lib.sh"

small=(--steps 1 --warmup 0 --d-model 32 --layers 2 --heads 4 --kv-heads 2 --d-ff 64
       --vocab 97 --seq-len 16 --batch 2)
"$BIN" bench "${small[@]}" >out.txt 2>err.txt || { cat err.txt; fail "bench exited non-zero"; }
for mode in baseline "block S=4" full; do
  line=$(grep -E "^$mode " out.txt) || { cat out.txt; fail "no row for $mode"; }
  tps=$(awk '{print $(NF-4)}' <<<"${line/S=4/}")
  awk -v t="$tps" 'BEGIN { exit !(t > 0) }' || fail "$mode: tokens/s '$tps' is not positive"
done
pass "bench printed baseline, block and full rows"

# --recompute all: one row per recomputation mode; the measured activation
# high-water (last column) falls from none to mix to layer.
"$BIN" bench "${small[@]}" --d-model 64 --seq-len 64 --mode block --recompute all >out.txt 2>err.txt \
  || { cat err.txt; fail "bench --recompute all exited non-zero"; }
act=()
for r in none mix layer; do
  line=$(grep -E "^block S=4 rc=$r " out.txt) || { cat out.txt; fail "no row for recompute $r"; }
  act+=("$(awk '{print $NF}' <<<"$line")")
done
awk -v a="${act[0]}" -v b="${act[1]}" -v c="${act[2]}" 'BEGIN { exit !(a > b && b > c && c > 0) }' \
  || { cat out.txt; fail "activation MiB not none > mix > layer: ${act[*]}"; }
pass "bench --recompute all: activation MiB none ${act[0]} > mix ${act[1]} > layer ${act[2]}"

# The optimizer's share of each row's step, AdamW's and Muon's (Newton-Schulz
# on the layers' matrices): printed and a share of the step (figures, not
# compared: a timed assertion would depend on the machine).
share() {  # share OUT.TXT: the baseline row's optimizer share in %
  sed -nE 's/^optimizer update .* baseline [0-9.]+ \(([0-9.]+)%\).*/\1/p' "$1"
}
"$BIN" bench "${small[@]}" --mode baseline --d-model 64 >adam.txt 2>err.txt || { cat err.txt; fail "bench (adamw)"; }
"$BIN" bench "${small[@]}" --mode baseline --d-model 64 --optimizer muon >muon.txt 2>err.txt \
  || { cat err.txt; fail "bench --optimizer muon"; }
a=$(share adam.txt) m=$(share muon.txt)
grep -q "optimizer update (AdamW)" adam.txt && grep -q "optimizer update (Muon + AdamW)" muon.txt \
  && awk -v a="$a" -v m="$m" 'BEGIN { exit !(a > 0 && a < 100 && m > 0 && m < 100) }' \
  || { cat adam.txt muon.txt; fail "the optimizer's share: AdamW '$a'%, Muon '$m'%"; }
pass "bench: the optimizer update's share of the step, AdamW $a%, Muon $m%"
# A Kimi Linear hybrid (--hybrid: KDA layers, softmax every 4th and the last;
# --mla: those as MLA): its rows, and its layer kinds on the model line.
"$BIN" bench "${small[@]}" --layers 4 --hybrid 2,16 --mla 16,8,4,8 >hy.txt 2>err.txt \
  || { cat err.txt; fail "bench --hybrid --mla exited non-zero"; }
grep -q "KDA 2x16 conv=4 in 3 of 4 layers MLA r=16 dn=8 dr=4 dv=8" hy.txt && grep -qE "^full " hy.txt \
  || { cat hy.txt; fail "bench --hybrid: no hybrid model line or rows"; }
pass "bench --hybrid 2,16 --mla 16,8,4,8: a KDA + MLA hybrid's rows"
# --variants: Full, the Table 4 variants and DenseFormer, each against Full.
"$BIN" bench "${small[@]}" --layers 3 --variants >var.txt 2>err.txt || { cat err.txt; fail "bench --variants"; }
for row in "full" "full + input query" "full + scalar weights" "full + sigmoid" "full, raw keys" \
           "full, window 8" "block S=4" "block S=4 + 16 heads" "block S=4, raw keys" "denseformer"; do
  grep -qE "^$(sed 's/[+.]/\\&/g' <<<"$row") +[0-9.]+ " var.txt || { cat var.txt; fail "bench --variants: no row '$row'"; }
done
pass "bench --variants: Full, 8 variants and DenseFormer"
expect_error "--variants with --mode" "drop --mode" "$BIN" bench "${small[@]}" --variants --mode full
expect_error "bad --hybrid" "--hybrid takes H,K[,conv_size]" "$BIN" bench "${small[@]}" --hybrid 2
expect_error "bad --mla" "--mla takes r,dn,dr,dv" "$BIN" bench "${small[@]}" --mla 1,2,x,4
expect_error "unknown optimizer" "--optimizer must be adamw or muon" "$BIN" bench "${small[@]}" --optimizer sgd

expect_error "bf16 on the cpu" "bf16 is a CUDA precision" "$BIN" bench "${small[@]}" --precision bf16
expect_error "unknown preset" "unknown --preset" "$BIN" bench --preset 7b
expect_error "--only without --kernels" "--only selects rows of --kernels" "$BIN" bench "${small[@]}" --only mix
expect_error "--steps 0" "--steps must be at least 1" "$BIN" bench "${small[@]}" --steps 0
expect_error "unknown recompute" "unknown" "$BIN" bench "${small[@]}" --recompute some
echo "all bench checks passed"
