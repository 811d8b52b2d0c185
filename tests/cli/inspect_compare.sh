#!/usr/bin/env bash
# `attnres inspect compare A B --rtol R`: equal checkpoints pass at --rtol 0; a
# NaN or an infinity in any tensor of either checkpoint fails, whichever
# tensor it is in (a NaN in an early tensor was once forgotten when a later
# tensor's finite difference replaced it as the worst); a real difference is
# reported with its size and fails below it.
source "$(dirname "$0")/lib.sh"

# write_ckpt DIR [TENSOR INDEX VALUE]: model.safetensors (a, b) and
# optimizer.safetensors (m) of fixed values, one element optionally replaced.
write_ckpt() {
  "$PY" - "$@" <<'PY'
import json, os, struct, sys
out, change = sys.argv[1], sys.argv[2:]
tensors = {"model": {"a": [1.0, -2.0, 0.5], "b": [3.0, 0.25]}, "optimizer": {"m": [0.125, 4.0, -1.0]}}
if change:
    name, index, value = change[0], int(change[1]), float(change[2])
    for group in tensors.values():
        if name in group:
            group[name][index] = value
os.makedirs(out, exist_ok=True)
for stem, group in tensors.items():
    header, data = {}, b""
    for name, values in group.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": [len(values)],
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, stem + ".safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
PY
}

write_ckpt ref
write_ckpt same
"$BIN" inspect compare ref same --rtol 0 > out.txt 2> err.txt || { cat out.txt err.txt; fail "equal checkpoints differ"; }
grep -q "3 tensors compared; largest relative difference 0$" out.txt || { cat out.txt; fail "equal: report"; }
pass "equal checkpoints: $(cat out.txt)"

# A non-finite value in each tensor (first, middle, last of the comparison),
# in the first checkpoint or in the second (the reference).
for t in a b m; do
  for v in nan inf -inf; do
    write_ckpt "bad_${t}_$v" "$t" 1 "$v"
    for order in "ref bad_${t}_$v" "bad_${t}_$v ref"; do
      rc=0
      "$BIN" inspect compare $order --rtol 1e-5 > out.txt 2> err.txt || rc=$?
      ((rc != 0)) || { cat out.txt; fail "$v in tensor $t ($order): compared equal"; }
      grep -q "tensor '$t' differs by" err.txt || { cat out.txt err.txt; fail "$v in $t ($order): not named"; }
    done
  done
done
pass "a NaN or an infinity in any tensor of either checkpoint fails, naming the tensor"

# b[0] = 3 -> 3.5: ||diff|| / ||b|| = 0.5 / sqrt(3.5^2 + 0.25^2) = 0.1425, in the
# second checkpoint's norm (here the changed one).
write_ckpt off b 0 3.5
"$BIN" inspect compare ref off --rtol 0.3 > out.txt || { cat out.txt; fail "within --rtol 0.3"; }
grep -q "largest relative difference 0.142 in b$" out.txt || { cat out.txt; fail "the size of the difference"; }
rc=0
"$BIN" inspect compare ref off --rtol 0.1 > out.txt 2> err.txt || rc=$?
((rc != 0)) && grep -q "tensor 'b' differs by 0.142" err.txt || { cat out.txt err.txt; fail "above --rtol 0.1"; }
pass "a real difference: $(head -1 out.txt)"
echo "all inspect compare checks passed"
