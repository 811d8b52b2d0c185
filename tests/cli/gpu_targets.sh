#!/usr/bin/env bash
# scripts/gpu_targets.py on a real gpu_check.sh report (the H100 run kept in
# docs/measurements/2026-11-22-h100-2, fp32 logits) and on a made-up 1b3
# report (bf16 logits, run one mode at a time; the numbers are inputs for the
# parser, not measurements): every target row with its measured value, goal
# and verdict, the goal raised to 1.3x the trimmed traffic floor where that
# is higher than the issue's, the floor of a step from the report's measured
# ceilings in the report's logit dtype, and the AttnRes overheads against the
# traffic floor of their depth Mix; on an empty report, "not measured" rows
# and no floor.
# The expected rows are not pasted from the script's output: expected.py below
# computes them from the report's input files (bench_*.txt, kernels_*.txt,
# attention_torch.txt) with the issue's targets (docs/cuda.md), the matmul
# parameter count of docs/model.md and the byte and pass counts the script
# documents, written out independently (the passes by simulating the sources
# sublayer by sublayer, not with the script's closed forms).
# Usage: gpu_targets.sh BIN SRC (BIN unused: the script is Python)
source "$(dirname "$0")/lib.sh"
expect() { grep -qF -- "$1" <<<"$out" || fail "output lacks: $1"; }

cat > expected.py <<'PYEOF'
import math, os, re, sys

# Inputs as gpu_check.sh writes them (see the script's doc); everything else
# is arithmetic written out here from docs/cuda.md and the script's documented
# counts, not imported from it.
TARGETS = {"124m": ("124M", 40, 8, 18), "350m": ("350M", 42, 5, 20), "1b3": ("1.3B", 50, 3, 10)}
PEAK = 989.0  # TFLOP/s, the H100's dense bf16 peak that MFU divides by


def lines(path):
    try:
        return open(path).read().splitlines()
    except OSError:
        return []


def bench(path):
    """mode -> (step ms, MFU %, vs-base text); the model's shape; the logits' bytes."""
    rows, shape, logit_bytes = {}, None, 4
    for ln in lines(path):
        w = ln.split()
        if ln.startswith("attnres GPU benchmark") and ln.endswith(", bf16 logits"):
            logit_bytes = 2
        if ln.startswith("model:"):
            shape = {k: int(v) for k, v in (t.split("=") for t in w if "=" in t and t.split("=")[1].isdigit())}
        if w and w[0] in ("baseline", "full") or (len(w) > 1 and w[0] == "block" and w[1].startswith("N=")):
            label = " ".join(w[:2]) if w[0] == "block" else w[0]
            rest = w[2:] if w[0] == "block" else w[1:]
            if len(rest) >= 5 and rest[3].endswith("%"):
                rows[label] = (float(rest[0]), float(rest[3][:-1]), rest[4])
    return rows, shape, logit_bytes


def ceilings(d):
    for p in ("124m", "350m", "1b3"):
        for ln in lines(os.path.join(d, f"kernels_{p}.txt")):
            if ln.startswith("measured ceilings:"):
                w = ln.split()
                return float(w[w.index("GB/s") - 1]), float(w[w.index("TFLOP/s") - 1])
    return None


def cudnn_ms(d, B, H, T, hd):
    for ln in lines(os.path.join(d, "attention_torch.txt")):
        if ln.strip().startswith(f"({B}, {H}, {T}, {hd})") and " cudnn " in ln:
            return float(ln.split(")")[1].split()[3])  # backend, fwd ms, fwd TF/s, f+b ms
    return None


def passes(L, S):
    """Passes over a [B*T, d] tensor by the residual machinery of one step (S None:
    the baseline), simulated sublayer by sublayer with explicit source lists (the
    counts of docs/cuda.md / the script's depth_passes doc); (ours, trimmed)."""
    n = 2 * L
    if S is None:
        t = n * (2 + 1 + 4) + 2 + 3  # norm fwd 2, epilogue read 1, norm bwd 4; final norm
        return t, t
    G = S if S > 1 else min(8, next(g for g in range(1, n + 1) if g * g >= n))
    out = []
    for dw_and_zero in (True, False):
        per_src_bwd = 4 if dw_and_zero else 3  # read, read-add-write (, dw re-read)
        done, partial, t = ["e"], None, 1  # the embedding's rstd
        for s in range(n):
            visible = done + ([partial] if partial else [])
            if s % G == 0:  # phase 1 of the group over the sources present now
                snapshot, Q = len(visible), min(G, n - s)
                t += (snapshot + Q) + (per_src_bwd * snapshot + Q)
            m = len(visible) - snapshot  # recent sources, merged in phase 2
            t += (2 + m) + (3 + per_src_bwd * m)
            if partial:
                t += 1  # the partial sum read by the output GEMM's epilogue
            partial = f"p{s}" if partial is None else partial + "+"
            if s % S == S - 1:
                done.append(partial)
                partial = None
                t += 1  # the new source's rstd
        k, m = len(done), 1 if partial else 0  # the final Mix
        t += (k + 1) + (per_src_bwd * k + 1) + (2 + m) + (3 + per_src_bwd * m)
        if dw_and_zero:
            t += k + m  # its zero-filled source gradients
        out.append(t)
    return tuple(out)


def expected(d):
    ceil = ceilings(d)
    for p, (label, mfu_goal, block_goal, full_goal) in TARGETS.items():
        rows, sh, logit_bytes = bench(os.path.join(d, f"bench_{p}.txt"))
        base = rows.get("baseline")
        yield (f"| {label} baseline MFU | " + (f"{base[1]:.1f}%" if base else "not measured") +
               f" | >= {mfu_goal}% | issue | " + ("-" if not base else "yes" if base[1] >= mfu_goal else "no") + " |")
        floor = None
        if sh and ceil:
            dd, L, H, Hkv, F, V, T, B = (sh[k] for k in ("d", "L", "H", "Hkv", "d_ff", "V", "T", "B"))
            hd, N = dd // H, B * T
            attn = cudnn_ms(d, B, H, T, hd)
            if attn is not None:
                # Matmul weights (as docs/model.md counts them) and the memory-bound bytes:
                # per token and layer 2 norms x (2 + 3) d, residual 2 x 2 d, SwiGLU 8 F,
                # RoPE 4 (H + Hkv) hd bf16 elements; 2 E + 6 bytes per logit; AdamW 34
                # bytes per parameter.
                P = L * (dd * H * hd * 2 + dd * Hkv * hd * 2 + 3 * dd * F) + V * dd
                per_token = 2 * L * (10 * dd + 4 * dd + 8 * F + 4 * (H + Hkv) * hd) + (2 * logit_bytes + 6) * V
                mem = per_token * N + 34 * (P + V * dd)
                floor = 6.0 * P * N / (ceil[1] * 1e9) + L * attn + mem / (ceil[0] * 1e6)
                tflop = (6.0 * P + 6.0 * L * T * dd) * N / 1e12
                got = f"{base[0]:.1f} ms | {base[0] / floor:.2f}x |" if base else "- | - |"
                yield (f"| {label} | {B} x {T} | {'fp32' if logit_bytes == 4 else 'bf16'} | {tflop:.1f} | "
                       f"{floor:.1f} ms | {100 * tflop / (PEAK * floor * 1e-3):.1f}% | "
                       f"{tflop / (mfu_goal / 100 * PEAK) * 1e3:.1f} ms ({mfu_goal}%) | " + got)
        r = base and floor and base[0] / floor
        yield (f"| {label} baseline step / floor | " +
               (f"{r:.2f}x ({base[0]:.1f} / {floor:.1f} ms)" if r else "not measured") +
               " | <= 1.10x | issue | " + ("-" if not r else "yes" if r <= 1.1 else "no") + " |")
        for mode, goal in (("block", block_goal), ("full", full_goal)):
            name = next((k for k in rows if k.split()[0] == mode), None)
            row = rows.get(name)
            goal_from = "issue"
            if not (row and base and sh and ceil):
                goal_from = "issue (floor not measured)"
            else:
                S = 1 if mode == "full" else -(-2 * sh["L"] // int(name.split("=")[1]))
                pass_ms = 2.0 * sh["B"] * sh["T"] * sh["d"] / (ceil[0] * 1e6)
                ours = passes(sh["L"], S)[0] - passes(sh["L"], None)[0]
                low = passes(sh["L"], S)[1] - passes(sh["L"], None)[1]
                low_pct = 100 * low * pass_ms / base[0]
                ms = row[0] - base[0]
                yield (f"| {label} | {name} | {ms:+.1f} ms ({float(row[2][:-1]):+.1f}%) | {ours} passes, "
                       f"{ours * pass_ms:.2f} ms | {ms / (ours * pass_ms):.1f}x | {low} passes, "
                       f"{low * pass_ms:.2f} ms | {low_pct:+.1f}% |")
                if 1.3 * low_pct > goal:
                    goal, goal_from = 1.3 * low_pct, f"1.3 x floor {low_pct:+.1f}%"
            vs = row and float(row[2][:-1])
            yield (f"| {label} {name or mode} step vs baseline | " + (f"{vs:+.1f}%" if row else "not measured") +
                   f" | <= +{goal:.1f}% | {goal_from} | " + ("-" if not row else "yes" if vs <= goal else "no") + " |")
        # Ours against cuDNN at the kernel benchmark's attention shape.
        k = lines(os.path.join(d, f"kernels_{p}.txt"))
        ks = next(({kk: int(v) for kk, v in (t.split("=") for t in ln.split() if "=" in t and t.split("=")[1].isdigit())}
                   for ln in k if ln.startswith("model:")), None)
        # (the rows "attention fwd" and "attention bwd"; "attention fwd (cudnn)" is another row)
        ops = {m.group(1): float(m.group(2)) for m in
               (re.match(r"^(attention (?:fwd|bwd)(?: \(cudnn\))?)\s+([\d.]+)\s", ln) for ln in k) if m}
        for suffix, name in (("", label), (" (cudnn)", label + ", attnres on cuDNN")):
            if ks and "attention fwd" + suffix in ops and "attention bwd" + suffix in ops:
                ref = cudnn_ms(d, ks["B"], ks["H"], ks["T"], ks["d"] // ks["H"])
                if ref:
                    ours = ops["attention fwd" + suffix] + ops["attention bwd" + suffix]
                    yield (f"| {name} | ({ks['B']}, {ks['H']}, {ks['T']}, {ks['d'] // ks['H']}) | "
                           f"{ours:.3f} | {ref:.3f} | {ours / ref:.2f}x |")
        # The Mix kernels against their traffic floor (MB column: op ms floor MB GB/s
        # TFLOP/s pct (bound); reports without it count as not measured).
        worst = None
        for ln in k:
            w = ln.split()
            if not (ln.startswith("mix ") and len(w) >= 8 and w[-1] in ("(memory)", "(compute)")):
                continue
            try:
                ms, fl, mb = float(w[-7]), float(w[-6]), float(w[-5])
            except ValueError:
                continue  # no MB column: w[-7] is the op's name
            op = " ".join(w[:-7])
            if op.endswith(" warp"):
                continue
            yield f"| {label} | {op} | {mb:.1f} | {ms:.3f} | {fl:.3f} | {ms / fl:.2f}x |"
            if worst is None or ms / fl > worst[1]:
                worst = (op, ms / fl)
        yield (f"| {label} Mix kernels / traffic floor | " +
               (f"{worst[1]:.2f}x ({worst[0]})" if worst else "not measured") + " | <= 1.30x | issue | " +
               ("-" if not worst else "yes" if worst[1] <= 1.3 else "no") + " |")
        # The race against the PyTorch peer, 124M and 350M only: race_P.txt rows
        # "mode attnres peer ratio diff"; a peer that did not compile is eager.
        if p != "1b3":
            race, eager = {}, False
            for ln in lines(os.path.join(d, f"race_{p}.txt")):
                w = ln.split()
                if len(w) == 5 and w[0] in ("baseline", "block", "full"):
                    race[w[0]] = (float(w[1]), float(w[2]))
                if ln.startswith("race: ") and "without torch.compile" in ln:
                    eager = True
                if ln.startswith("peer (") and ("compile failed" in ln or "no torch.compile" in ln):
                    eager = True
            for mode, goal in (("baseline", 1.0), ("block", 1.25), ("full", 1.25)):
                r = race.get(mode)
                got = (f"{r[0] / r[1]:.2f}x ({r[0]:.0f} / {r[1]:.0f}, "
                       f"{'the peer (eager)' if eager else 'the torch.compile peer'})") if r else "not measured"
                yield (f"| {label} {mode} tokens/s vs the PyTorch peer's | {got} | >= {goal:.2f}x | issue | " +
                       ("-" if not r else "yes" if r[0] / r[1] >= goal else "no") + " |")
    if ceil:
        yield f"(copy {ceil[0]:.0f} GB/s, GEMM {ceil[1]:.0f} TFLOP/s, cuDNN attention)"


for line in expected(sys.argv[1]):
    print(line)
PYEOF

# Every row expected.py derives for report $1 must be in the script's output
# (at least $2 of them: a parser that reads nothing must not pass).
expect_derived() {
  local n=0 line
  while IFS= read -r line; do
    expect "$line"
    n=$((n + 1))
  done < <($PY expected.py "$1")
  [[ $n -ge $2 ]] || fail "expected.py derived only $n rows from $1"
  echo "$n rows as derived from the inputs"
}

h100="$SRC/docs/measurements/2026-11-22-h100-2"
out=$($PY "$SRC/scripts/gpu_targets.py" "$h100")
echo "$out"
# 12 target rows, 2 floors, 4 overheads, 2 attention rows and the ceilings.
expect_derived "$h100" 30
# The case docs/cuda.md describes for this run: 350M Block's goal is 1.3 x its
# trimmed floor (+3.85%, just above the issue's +5%), the others the issue's.
[[ $(grep -c "step vs baseline .* 1.3 x floor" <<<"$out") -eq 1 ]] &&
  grep -q "| 350M block N=8 step vs baseline .* 1.3 x floor" <<<"$out" ||
  fail "only 350M Block should take 1.3 x its floor as the goal"

# A 1b3 report (bench --preset 1b3: bf16 logits, B from the planner) beside the
# H100's ceilings, with cuDNN's time at its attention shape (all 16 heads as
# query heads, head dim 128).
mkdir r1b3
cp "$h100/kernels_124m.txt" "$h100/attention_torch.txt" r1b3/
echo "     (12, 16, 2048, 128)      cudnn    1.000     300.0    4.000    3.000     200.0" \
  >> r1b3/attention_torch.txt
cat > r1b3/bench_1b3.txt <<'REPORT'
attnres GPU benchmark on NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB, 132 SMs), bf16, bf16 logits
model: d=2048 L=24 H=16 Hkv=8 d_ff=5504 V=50304 | T=2048 B=12 A=1 | median of 5 timed steps after 2 warm-up
modes one after another (together they need 120.0 GiB by the planner with its margins; 78.6 GiB free)
mode                    step ms     tokens/s      TFLOP/s      MFU    vs base    act MiB
baseline                  400.0        61440        485.6    49.1%          -   40000.00
block N=8                 410.0        59941        473.8    47.9%      +2.5%   42000.00
full                      450.0        54613        431.7    43.6%     +12.5%   50000.00
REPORT
out=$($PY "$SRC/scripts/gpu_targets.py" r1b3)
echo "$out"
# 1.3B's 4 target rows, its floor and both overheads; 8 "not measured" rows of
# 124M and 350M and 124M's attention row (its kernels file is there); the ceilings.
expect_derived r1b3 26
# At 1b3 the traffic floors are above the issue's +3% / +10%: 1.3 x floor applies.
[[ $(grep -c "| 1.3B .* step vs baseline .* 1.3 x floor" <<<"$out") -eq 2 ]] ||
  fail "both 1.3B overhead goals should be 1.3 x their floor"
floor_bf16=$(grep "^| 1.3B | 12 x 2048 |" <<<"$out" | cut -d'|' -f6)
# The same report read as fp32 logits (a header from before training.logits):
# 14 instead of 10 bytes per logit, a higher floor.
sed -i 's/, bf16 logits$//' r1b3/bench_1b3.txt
out=$($PY "$SRC/scripts/gpu_targets.py" r1b3)
expect_derived r1b3 26
grep -q "^| 1.3B | 12 x 2048 | fp32 |" <<<"$out" || fail "an old header should read as fp32 logits"
floor_fp32=$(grep "^| 1.3B | 12 x 2048 |" <<<"$out" | cut -d'|' -f6)
awk -v a="$floor_bf16" -v b="$floor_fp32" 'BEGIN { exit !(b + 0 > a + 0) }' ||
  fail "fp32 logits should raise the floor ($floor_bf16 -> $floor_fp32)"

# cuDNN's engines run by attnres (bench --kernels' "attention fwd (cudnn)" rows,
# training.attention_kernel = auto): a second attention row beside ours.
cat >> r1b3/kernels_124m.txt <<'ROWS'
attention fwd (cudnn)           0.100      0.033        710     181.8   33.0% (memory)
attention bwd (cudnn)           0.300      0.084        493     126.2   28.0% (memory)
ROWS
out=$($PY "$SRC/scripts/gpu_targets.py" r1b3)
expect_derived r1b3 27
grep -q "^| 124M, attnres on cuDNN | .* | 0.400 | " <<<"$out" ||
  fail "the cuDNN attention rows (0.100 + 0.300 ms) should have their own attention row"

# The Mix phase-1 backward timed with both kernels (bench --kernels prints the
# warp kernel's row, named "... warp", after the default kernel's): a row per
# pair, default / warp and the default's share of the floor, by hand from the
# input: 0.400 / 0.637 = 0.63x, 0.293 / 0.400 = 73.2%; 1.000 / 2.011 = 0.50x,
# 0.736 / 1.000 = 73.6%. A row without its pair is not listed.
mkdir rmix
cat > rmix/kernels_124m.txt <<'REPORT'
model: d=768 L=12 H=12 Hkv=12 d_ff=2048 V=50304 | T=1024 B=16 A=1 | median of 5 timed steps after 1 warm-up
measured ceilings: copy 3009 GB/s (read+write), BF16 GEMM 8192^3 775 TFLOP/s

op                                 ms   floor ms       GB/s   TFLOP/s  of floor (bound)
mix phase-1 fwd (k=8, Q=3)      0.185      0.092       1500       6.5   49.8% (memory)
mix phase-1 bwd (k=8, Q=3)      0.400      0.293       2000       7.0   73.3% (memory)
mix phase-1 bwd (k=8, Q=3) warp      0.637      0.293       1382       4.7   45.9% (memory)
mix phase-1 bwd (full, k=21, Q=4)      1.000      0.736       1101       5.3   73.6% (memory)
mix phase-1 bwd (full, k=21, Q=4) warp      2.011      0.736       1101       5.3   36.6% (memory)
REPORT
out=$($PY "$SRC/scripts/gpu_targets.py" rmix)
expect "| 124M | mix phase-1 bwd (k=8, Q=3) | 0.400 | 0.637 | 0.293 | 0.63x | 73.2% |"
expect "| 124M | mix phase-1 bwd (full, k=21, Q=4) | 1.000 | 2.011 | 0.736 | 0.50x | 73.6% |"
[[ $(grep -c "^| 124M | mix phase-1" <<<"$out") -eq 2 ]] || fail "only the two timed pairs should be listed"
grep -q "default kernel against the warp kernel" <<<"$($PY "$SRC/scripts/gpu_targets.py" "$h100")" &&
  fail "a report without '... warp' rows should print no kernel comparison"

# The step as one CUDA graph (bench --cuda-graphs' table beside the eager one):
# a row per mode in both, by hand: 37.3 - 35.1 = 2.2 ms of 37.3 = 5.9%;
# 50.3 - 47.0 = 3.3 ms = 6.6%. No row for a mode the graphed table lacks.
mkdir rgraph
cat > rgraph/bench_124m.txt <<'REPORT'
attnres GPU benchmark on NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB, 132 SMs), bf16, bf16 logits
model: d=768 L=12 H=12 Hkv=12 d_ff=2048 V=50304 | T=1024 B=16 A=1 | median of 10 timed steps after 3 warm-up
mode                          step ms     tokens/s      TFLOP/s      MFU    vs base    act MiB
baseline                         37.3       439345        350.6    35.5%          -    5742.16
block N=8                        43.5       376979        301.3    30.5%     +16.5%    6322.53
full                             50.3       325776        261.0    26.4%     +34.9%    6337.59
REPORT
cat > rgraph/bench_124m_graphs.txt <<'REPORT'
mode                          step ms     tokens/s      TFLOP/s      MFU    vs base    act MiB
baseline                         35.1       466874        372.6    37.7%          -    5742.16
full                             47.0       348596        279.3    28.2%     +33.9%    6337.59
REPORT
out=$($PY "$SRC/scripts/gpu_targets.py" rgraph)
expect "| 124M | baseline | 37.3 | 35.1 | +2.2 ms (+5.9%) |"
expect "| 124M | full | 50.3 | 47.0 | +3.3 ms (+6.6%) |"
[[ $(grep -cE '^\| 124M \| (baseline|full|block N=8) \| [0-9.]+ \| [0-9.]+ \| ' <<<"$out") -eq 2 ]] ||
  { echo "$out"; fail "only the modes both tables have should be listed"; }
grep -q "one CUDA graph" <<<"$($PY "$SRC/scripts/gpu_targets.py" "$h100")" &&
  fail "a report without bench_*_graphs.txt should print no graph table"
pass "the step as one CUDA graph: eager against graphed, per mode"

mkdir empty  # in $WORK, removed with it
out=$($PY "$SRC/scripts/gpu_targets.py" empty)
echo "$out"
expect_derived empty 21  # 5 targets x 3 presets and 3 race targets x 2, all "not measured"
[[ $(grep -c "not measured" <<<"$out") -eq 21 ]] || fail "an empty report should give 21 'not measured' rows"
grep -qE "Floor of a|AttnRes overhead" <<<"$out" && fail "an empty report should print no floor"
pass "gpu_targets.py"

# The Mix kernels against their traffic floor, from reports with bench's MB
# column (the bytes each must move): the slowest row decides, the " warp" rows
# (the kernel kept for comparison) do not count.
mkdir rfloor
cat > rfloor/kernels_124m.txt <<'REPORT'
model: d=768 L=12 H=12 Hkv=12 d_ff=2048 V=50304 | T=1024 B=16 A=1 | median of 5 timed steps after 1 warm-up

op                                 ms   floor ms         MB       GB/s   TFLOP/s  of floor (bound)
mix fwd (k=9)                   0.150      0.085      252.8       1685       0.3   56.7% (memory)
mix phase-1 fwd (k=8, Q=3)      0.120      0.093      279.1       2326       0.8   77.5% (memory)
mix phase-1 bwd (k=8, Q=3)      0.400      0.226      681.8       1705       1.0   56.5% (memory)
mix phase-1 bwd (k=8, Q=3) warp      0.900      0.226      681.8        758       0.4   25.1% (memory)
REPORT
cat > rfloor/kernels_350m.txt <<'REPORT'
op                                 ms   floor ms         MB       GB/s   TFLOP/s  of floor (bound)
mix fwd (k=9)                   0.100      0.085      252.8       2528       0.4   85.0% (memory)
mix phase-1 fwd (k=8, Q=3)      0.110      0.093      279.1       2537       0.9   84.5% (memory)
REPORT
out=$($PY "$SRC/scripts/gpu_targets.py" rfloor)
echo "$out"
expect_derived rfloor 26
expect "| 124M Mix kernels / traffic floor | 1.77x (mix phase-1 bwd (k=8, Q=3)) | <= 1.30x | issue | no |"
expect "| 350M Mix kernels / traffic floor | 1.18x (mix phase-1 fwd (k=8, Q=3)) | <= 1.30x | issue | yes |"
expect "| 124M | mix phase-1 bwd (k=8, Q=3) | 681.8 | 0.400 | 0.226 | 1.77x |"
grep -q "| 124M | mix phase-1 bwd (k=8, Q=3) warp |" <<<"$out" && fail "a warp row counted against its floor"
pass "Mix kernels against their traffic floor: the slowest row decides, warp rows left out"

# The race against the PyTorch peer (scripts/race_torch.py's tables): the
# baseline at least the torch.compile peer's tokens/s, Block and Full 1.25x
# the peer's; a peer whose compile failed is said to be eager.
mkdir rrace
cat > rrace/race_124m.txt <<'REPORT'
race: configs/gpu_124m.json, device cuda, bf16, median tokens/s of steps 6..20, peer with torch.compile
mode        attnres tok/s   peer tok/s  attnres / peer  max loss rel diff
baseline           440000       410000           1.07x           2.10e-03
block              400000       300000           1.33x           2.50e-03
full               330000       280000           1.18x           2.40e-03
peer (baseline): torch 2.9.0 on cuda (NVIDIA H100 80GB HBM3), bf16 autocast, attention scaled_dot_product_attention, torch.compile, AdamW fused
REPORT
cat > rrace/race_350m.txt <<'REPORT'
race: configs/gpu_350m.json, device cuda, bf16, median tokens/s of steps 6..20, peer with torch.compile
mode        attnres tok/s   peer tok/s  attnres / peer  max loss rel diff
baseline           120000       130000           0.92x           1.90e-03
peer (baseline): torch.compile failed (BackendCompilerFailed: ...); running eager
REPORT
out=$($PY "$SRC/scripts/gpu_targets.py" rrace)
echo "$out"
expect_derived rrace 21
expect "| 124M baseline tokens/s vs the PyTorch peer's | 1.07x (440000 / 410000, the torch.compile peer) | >= 1.00x | issue | yes |"
expect "| 124M full tokens/s vs the PyTorch peer's | 1.18x (330000 / 280000, the torch.compile peer) | >= 1.25x | issue | no |"
expect "| 350M baseline tokens/s vs the PyTorch peer's | 0.92x (120000 / 130000, the peer (eager)) | >= 1.00x | issue | no |"
expect "| 350M block tokens/s vs the PyTorch peer's | not measured | >= 1.25x | issue | - |"
expect "| 124M | block | 400000 | 300000 | 1.33x | yes | 2.5e-03 |"
grep -q "1.3B .* PyTorch peer" <<<"$out" && fail "the race is no target at 1.3B"
pass "the race against the PyTorch peer: goals per mode, an eager peer said so"
