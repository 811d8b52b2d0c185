#!/usr/bin/env python3
"""Prints the GPU performance targets (docs/cuda.md) against a gpu_check.sh report.

    scripts/gpu_targets.py REPORT_DIR [--json]

REPORT_DIR holds what scripts/gpu_check.sh --bench and --1b3 write: per preset P (124m,
350m, 1b3) bench_P.txt (`attnres bench --preset P`) and kernels_P.txt
(`--kernels`), and, when PyTorch was there, attention_torch.txt. A missing file
gives "not measured" rows, never an error. Standard library only.

The targets, per preset: the baseline's MFU (model/flops.cpp's FLOPs against
989 TFLOP/s); the baseline step within 1.1x of its floor (below); and each
AttnRes mode's step over the baseline's of the same run, where the goal is the
larger of the owner's number and 1.3 x the overhead floor "dw fused, no zero
fill" (below): the table says which applied.

The floor of a baseline step, from the ceilings measured on the same machine
(kernels_*.txt's `measured ceilings:` line): the GEMMs at the measured GEMM
rate, attention at cuDNN's measured speed at the model's shape
(attention_torch.txt), and the memory-bound bytes counted from the shapes
(norms, SwiGLU, RoPE, the residual epilogues, the LM head's logit traffic,
AdamW) at the measured copy bandwidth: an estimate. The LM head's logits are
counted in the dtype the report's header names ("..., bf16, bf16 logits";
reports from before training.logits existed had fp32 logits and no such word).

The floor of an AttnRes overhead: the extra passes over a [B*T, d] bf16 tensor
that its depth Mix makes beyond the baseline's residual add and RMSNorm
(forward and backward, the schedule of model.cpp), at the measured copy
bandwidth. Two counts: the traffic our kernels are designed to (each kernel
reads its inputs from DRAM once), and the same schedule with the Mix's dw
summed in its row passes and no zero-filled gradient buffers. Estimates from
the shapes, not measurements.

The floor of a Mix kernel: the bytes it must move, every input read once and
every output written once (kernels/mix_traffic.h; `bench --kernels` prints them
in its MB column), at the measured copy bandwidth: its "floor ms". Per preset,
the target holds the slowest Mix row (the rows named "mix ...", not the "...
warp" rows of the kernel kept for comparison) to 1.3x its floor. Reports from
before the MB column counted the kernels' designed traffic instead: for them
the target is "not measured".

The race (124M and 350M): race_P.txt (scripts/race_torch.py on the preset's
config) gives attnres's and the PyTorch peer's tokens/s per residual mode; the
baseline must be at least the torch.compile peer's, Block and Full 1.25x the
peer's (a peer that ran eager is said so).

Information, not targets: our attention against cuDNN's SDPA at the kernel
benchmark's shape, every Mix row against its floor, and each kernel row timed twice (every Mix row in bf16:
the default (rows) kernels, then the same row "... warp" with ATTNRES_MIX_KERNELS=warp).
"""
import argparse
import json
import math
import os
import re

PEAK_TFLOPS = 989  # the H100's dense bf16 peak, which train/config.h takes for MFU
FLOOR_RATIO = 1.1  # the baseline step may be this much slower than its floor
FLOOR_FACTOR = 1.3  # an overhead goal is at least this times its trimmed floor
MIX_FLOOR_RATIO = 1.3  # a Mix kernel may be this much slower than its traffic floor


RACE_BASELINE = 1.0  # our baseline tokens/s over the torch.compile peer's, at least
RACE_ATTNRES = 1.25  # our Block / Full tokens/s over the peer's Block / Full, at least


class Preset:
    def __init__(self, name, label, mfu, block, full, race):
        self.name, self.label = name, label
        self.mfu, self.block, self.full = mfu, block, full  # the owner's targets, %
        self.race = race  # the race against the PyTorch peer is a target here


PRESETS = (Preset("124m", "124M", 40, 8, 18, True), Preset("350m", "350M", 42, 5, 20, True),
           Preset("1b3", "1.3B", 50, 3, 10, False))


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def bench_rows(text):
    """mode -> (MFU %, vs-base %, step ms, blocks or None) from an `attnres bench` table."""
    rows = {}
    for line in (text or "").splitlines():
        m = re.match(r"^(baseline|block N=(\d+)|full)\s+([\d.]+)\s+\d+\s+[\d.]+\s+([\d.]+)%\s+(\S+)",
                     line)
        if m:
            vs = m.group(5)
            rows[m.group(1).split()[0]] = (float(m.group(4)),
                                           None if vs == "-" else float(vs.rstrip("%")),
                                           float(m.group(3)), m.group(2) and int(m.group(2)))
    return rows


def kernel_ms(text, op):
    for line in (text or "").splitlines():
        if line.startswith(op + " "):
            return float(line[len(op):].split()[0])
    return None


def race_rows(text):
    """mode -> (attnres tok/s, peer tok/s, max loss rel diff), and whether the peer ran
    under torch.compile, from a scripts/race_torch.py table (race_P.txt)."""
    rows, compiled = {}, None
    for line in (text or "").splitlines():
        m = re.match(r"^(baseline|block|full)\s+(\d+)\s+(\d+)\s+[\d.]+x\s+(\S+)$", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)), float(m.group(4)))
        if line.startswith("race: "):
            compiled = "with torch.compile" in line
        if line.startswith("peer (") and ("torch.compile failed" in line or
                                          "has no torch.compile" in line):
            compiled = False
    return rows, compiled


def kernel_rows(text):
    """op -> (ms, floor ms, MB or None) for each row of a `bench --kernels` report: op, ms,
    floor ms, [MB,] GB/s, TFLOP/s, of floor (bound). Reports from before the MB column
    (the bytes the op must move) have none."""
    rows = {}
    for line in (text or "").splitlines():
        m = re.match(r"^(.+?)\s+([\d.]+)\s+([\d.]+)(?:\s+([\d.]+))?\s+\d+\s+[\d.]+\s+[\d.]+% "
                     r"\(\w+\)$", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)),
                                m.group(4) and float(m.group(4)))
    return rows


def kernel_pairs(text, suffix=" warp"):
    """(op, ms, other ms, floor ms) for each kernel row timed twice, the second time with
    `suffix` on its name (bench --kernels: each Mix row's default (rows) kernels, then the
    warp kernels with ATTNRES_MIX_KERNELS=warp)."""
    rows = kernel_rows(text)
    return [(op, ms, rows[op + suffix][0], floor) for op, (ms, floor, _) in rows.items()
            if op + suffix in rows]


def mix_floor_rows(text, suffix=" warp"):
    """(op, ms, MB, floor ms) of each Mix kernel row with its traffic floor (the MB
    column): the rows named "mix ...", not those of the kernel kept for comparison."""
    return [(op, ms, mb, floor) for op, (ms, floor, mb) in kernel_rows(text).items()
            if op.startswith("mix ") and not op.endswith(suffix) and mb is not None]


def cudnn_fb_ms(text, shape):
    """cuDNN's forward + backward ms at `shape` (see attention_shape) in attention_torch.txt."""
    for line in (text or "").splitlines():
        if shape in line and " cudnn " in line:
            return float(line.split(")")[1].split()[3])  # backend, fwd ms, fwd TF/s, f+b ms
    return None


def model_shape(text):
    """The `model:` line of an `attnres bench` report as a dict of ints."""
    for line in (text or "").splitlines():
        if line.startswith("model:"):
            return {k: int(v) for k, v in re.findall(r"\b(d|L|H|Hkv|d_ff|V|T|B)=(\d+)", line)}
    return None


def precision(text):
    """(precision, logits) from the bench header ('... on GPU, bf16, bf16 logits');
    logits fp32 where the header predates them; (None, None) when absent."""
    m = re.search(r"^attnres GPU benchmark on .*?, (bf16|fp32)(?:, (bf16|fp32) logits)?$",
                  text or "", re.M)
    return (m.group(1), m.group(2) or "fp32") if m else (None, None)


def attention_shape(shape):
    """A model_shape's attention shape as attention_torch.txt names it: (B, H, T, head dim)."""
    return f"({shape['B']}, {shape['H']}, {shape['T']}, {shape['d'] // shape['H']})"


def ceilings(text):
    """(copy GB/s, GEMM TFLOP/s) from the `measured ceilings:` line."""
    m = re.search(r"copy (\d+) GB/s.*GEMM \S+ (\d+) TFLOP/s", text or "")
    return (float(m.group(1)), float(m.group(2))) if m else None


def lm_head_bytes_per_logit(logit_bytes):
    """DRAM bytes per [N, V] logit of the LM head + cross-entropy (cuda/cross_entropy.cu):
    the GEMM writes the logit and the row pass reads it once (its second read hits L2),
    then the bf16 dlogit is written once and read by the dh and dw GEMMs. fp32 logits:
    14 bytes; bf16 logits: 10 (the logits' own traffic halves, the dlogits were bf16)."""
    return 2 * logit_bytes + 3 * 2


def floor_step(shape, copy_gbs, gemm_tfs, attn_fb_ms, logit_bytes):
    """(floor ms, model TFLOP) of one bf16 training step; see the module doc."""
    d, L, H, Hkv, F, V, T, B = (shape[k] for k in ("d", "L", "H", "Hkv", "d_ff", "V", "T", "B"))
    hd, N = d // H, B * T
    matmul_params = L * (2 * d * H * hd + 2 * d * Hkv * hd + 3 * d * F) + V * d
    gemm_flops = 6.0 * matmul_params * N
    model_flops = gemm_flops + 6.0 * L * T * d * N  # as model/flops.cpp (baseline)
    e = 2  # bytes per bf16 element
    per_layer = e * N * (2 * (2 + 3) * d            # two RMSNorms, forward 2 and backward 3 passes
                         + 2 * 2 * d                # residual read by two GEMM epilogues, stream grad
                         + (3 + 5) * F              # SwiGLU forward 3, backward 5 passes
                         + 4 * (H + Hkv) * hd)      # RoPE on q and k, forward and backward
    lm_head = float(lm_head_bytes_per_logit(logit_bytes)) * N * V
    adamw = 34.0 * (matmul_params + V * d)          # master, grad, m, v, bf16 copy; grad norm
    mem_bytes = L * per_layer + lm_head + adamw
    ms = gemm_flops / (gemm_tfs * 1e9) + L * attn_fb_ms + mem_bytes / (copy_gbs * 1e6)
    return ms, model_flops / 1e12


def depth_passes(L, S, lower_bound=False):
    """Passes over a [B*T, d] tensor made by the residual machinery of one
    training step (forward + backward) with L layers: the baseline's (S None)
    or AttnRes's with block size S (Full: 1), as model.cpp schedules it.

    Baseline, per sublayer: RMSNorm forward (read x, write u), the residual
    read by the GEMM epilogue, RMSNorm backward (read du and x, read-add-write
    the stream's gradient); the final norm 2 + 3. AttnRes (kernels/mix.h): per
    Mix group of Q sublayers over k sources, phase 1 forward (k + Q) and
    backward (read k sources and Q output gradients, read-add-write k source
    gradients, and mix_dw_kernel reads the k sources again); per sublayer the
    merge + RMSNorm with m recent sources, forward (read o and the m, write u)
    and backward (read du, o and the m, write d o, read-add-write m gradients,
    the m again for dw), or a plain RMSNorm where m = 0; the partial sum read
    by the epilogue after a block's first sublayer; each new source's rstd
    (one read); the final Mix the same way, and its zero-filled source
    gradients. lower_bound drops the dw re-reads and the zero fills."""
    n = 2 * L
    if S is None:
        return n * (2 + 1 + 4) + 2 + 3
    # The source counts are src/model/config.h's, written again here (this
    # script reads benchmark files, not the binary): ModelConfig::mix_sources
    # is 1 + s // S + (s % S > 0), the count the FLOPs and the planner use.
    G = S if S > 1 else min(math.isqrt(n - 1) + 1, 8)  # ModelConfig::mix_group_size
    first = lambda s: 1 + (s // G * G) // S     # ModelConfig::phase1_sources
    recent = lambda s: 1 + s // S - first(s) + (s % S > 0)  # ModelConfig::recent_sources
    rw = 3 if lower_bound else 4  # backward passes per source: read, read-add-write (, dw)
    mix = lambda k, Q: (k + Q) + (rw * k + Q)  # phase 1 forward + backward
    merge = lambda m: (2 + m) + (3 + rw * m) if m else 2 + 3  # merge + norm, or norm
    t = 1  # the embedding's rstd
    for s in range(n):
        if s % G == 0:
            t += mix(first(s), min(G, n - s))
        t += merge(recent(s)) + (s % S > 0) + (s % S == S - 1)
    k, m = 1 + n // S, int(n % S > 0)  # the final Mix: ModelConfig::mix_sources(2L) = k + m
    t += mix(k, 1) + merge(m)
    if not lower_bound:
        t += k + m
    return t


def depth_floors(shape, bench, copy_gbs):
    """Per measured AttnRes mode: its overhead against the traffic floors of its depth Mix."""
    base = bench.get("baseline")
    if not base:
        return []
    d, L, N = shape["d"], shape["L"], shape["B"] * shape["T"]
    pass_ms = 2.0 * N * d / (copy_gbs * 1e6)
    out = []
    for mode in ("block", "full"):
        row = bench.get(mode)
        if not row or row[1] is None:
            continue
        S = 1 if mode == "full" else (2 * L + row[3] - 1) // row[3]
        ours, low = (depth_passes(L, S, lb) - depth_passes(L, None) for lb in (False, True))
        out.append({"mode": mode, "label": "full" if mode == "full" else f"block N={row[3]}",
                    "ms": row[2] - base[2], "pct": row[1],
                    "ours_passes": ours, "ours_ms": ours * pass_ms,
                    "low_passes": low, "low_ms": low * pass_ms,
                    "low_pct": 100 * low * pass_ms / base[2]})
    return out


def evaluate(d):
    """Everything the report prints, as plain data (the --json output)."""
    torch_text = read(os.path.join(d, "attention_torch.txt"))
    texts = {p.name: (read(os.path.join(d, f"bench_{p.name}.txt")),
                      read(os.path.join(d, f"kernels_{p.name}.txt"))) for p in PRESETS}
    # One machine, one set of ceilings: the first kernel report's.
    ceil = next((c for c in (ceilings(k) for _, k in texts.values()) if c), None)
    out = {"ceilings": ceil and {"copy_gbs": ceil[0], "gemm_tflops": ceil[1]},
           "targets": [], "floors": [], "overheads": [], "attention": [], "mix_kernels": [],
           "mix_floors": [], "race": [], "graphs": []}

    def target(name, measured, goal, goal_from, met):
        out["targets"].append({"target": name, "measured": measured, "goal": goal,
                               "goal_from": goal_from, "met": met})

    for p in PRESETS:
        text, ktext = texts[p.name]
        bench, shape = bench_rows(text), model_shape(text)
        base = bench.get("baseline")
        mfu = base and base[0]
        target(f"{p.label} baseline MFU", mfu and f"{mfu:.1f}%", f">= {p.mfu}%", "issue",
               None if mfu is None else mfu >= p.mfu)

        # The baseline's floor (needs the ceilings and cuDNN's time at this shape).
        floor = None
        attn = shape and cudnn_fb_ms(torch_text, attention_shape(shape))
        prec, logits = precision(text)
        if ceil and shape and attn is not None and prec == "bf16":
            ms, tflop = floor_step(shape, ceil[0], ceil[1], attn, 4 if logits == "fp32" else 2)
            floor = {"preset": p.name, "label": p.label, "B": shape["B"], "T": shape["T"],
                     "logits": logits,
                     "tflop": tflop, "floor_ms": ms,
                     "floor_mfu": 100 * tflop / (PEAK_TFLOPS * ms * 1e-3),
                     "target_mfu": p.mfu, "target_ms": tflop / (p.mfu / 100 * PEAK_TFLOPS) * 1e3,
                     "baseline_ms": base and base[2]}
            out["floors"].append(floor)
        ratio = base and floor and base[2] / floor["floor_ms"]
        target(f"{p.label} baseline step / floor",
               ratio and f"{ratio:.2f}x ({base[2]:.1f} / {floor['floor_ms']:.1f} ms)",
               f"<= {FLOOR_RATIO:.2f}x", "issue", None if not ratio else ratio <= FLOOR_RATIO)

        # The overheads: goal max(the owner's, 1.3 x the trimmed floor).
        floors = {f["mode"]: f for f in (depth_floors(shape, bench, ceil[0])
                                         if ceil and shape else [])}
        for f in floors.values():
            out["overheads"].append(dict(f, preset=p.name, label_model=p.label))
        for mode, issue in (("block", p.block), ("full", p.full)):
            row = bench.get(mode)
            label = f"block N={row[3]}" if mode == "block" and row else mode
            f = floors.get(mode)
            goal, goal_from = float(issue), "issue"
            if f and FLOOR_FACTOR * f["low_pct"] > issue:
                goal = FLOOR_FACTOR * f["low_pct"]
                goal_from = f"{FLOOR_FACTOR} x floor {f['low_pct']:+.1f}%"
            elif not f:
                goal_from = "issue (floor not measured)"
            vs = row and row[1]
            target(f"{p.label} {label} step vs baseline", vs is not None and f"{vs:+.1f}%" or None,
                   f"<= +{goal:.1f}%", goal_from, None if vs is None else vs <= goal)

        # The race against the PyTorch peer (scripts/race_torch.py, same config and card).
        if p.race:
            race, compiled = race_rows(read(os.path.join(d, f"race_{p.name}.txt")))
            peer = "the torch.compile peer" if compiled is not False else "the peer (eager)"
            for mode, goal in (("baseline", RACE_BASELINE), ("block", RACE_ATTNRES),
                               ("full", RACE_ATTNRES)):
                r = race.get(mode)
                ratio = r and r[0] / r[1]
                target(f"{p.label} {mode} tokens/s vs the PyTorch peer's",
                       r and f"{ratio:.2f}x ({r[0]:.0f} / {r[1]:.0f}, {peer})", f">= {goal:.2f}x",
                       "issue", None if r is None else ratio >= goal)
                if r:
                    out["race"].append({"preset": p.name, "label": p.label, "mode": mode,
                                        "attnres": r[0], "peer": r[1], "ratio": ratio,
                                        "loss_diff": r[2], "compiled": compiled})

        # Information: the step as one CUDA graph (bench --cuda-graphs, its own table
        # beside the eager one): what replaying saves, the launch and wait gaps it removed.
        graphed = bench_rows(read(os.path.join(d, f"bench_{p.name}_graphs.txt")))
        for mode in ("baseline", "block", "full"):
            if mode in bench and mode in graphed:
                out["graphs"].append({"preset": p.name, "label": p.label,
                                      "mode": mode if mode != "block" else f"block N={bench[mode][3]}",
                                      "eager_ms": bench[mode][2], "graph_ms": graphed[mode][2]})

        # Every Mix kernel within 1.3x of its traffic floor: the slowest decides.
        worst = None
        for op, ms, mb, fl in mix_floor_rows(ktext):
            out["mix_floors"].append({"preset": p.name, "label": p.label, "op": op, "ms": ms,
                                      "mb": mb, "floor_ms": fl, "ratio": ms / fl})
            if worst is None or ms / fl > worst[1]:
                worst = (op, ms / fl)
        target(f"{p.label} Mix kernels / traffic floor",
               worst and f"{worst[1]:.2f}x ({worst[0]})", f"<= {MIX_FLOOR_RATIO:.2f}x", "issue",
               None if worst is None else worst[1] <= MIX_FLOOR_RATIO)

        # Information: our attention against cuDNN at the shape the kernels were timed at,
        # and cuDNN's engines run by attnres (training.attention_kernel = auto / cudnn: the
        # rows "attention fwd (cudnn)", "attention bwd (cudnn)") where the report has them.
        kshape = model_shape(ktext)
        ref = kshape and cudnn_fb_ms(torch_text, attention_shape(kshape))
        for suffix, label in (("", p.label), (" (cudnn)", p.label + ", attnres on cuDNN")):
            fwd = kernel_ms(ktext, "attention fwd" + suffix)
            bwd = kernel_ms(ktext, "attention bwd" + suffix)
            if fwd and bwd and ref:
                out["attention"].append({"preset": p.name, "label": label,
                                         "shape": attention_shape(kshape), "ours_ms": fwd + bwd,
                                         "cudnn_ms": ref, "ratio": (fwd + bwd) / ref})
        # Information: the Mix kernels' two families on the same rows.
        for op, ms, warp_ms, floor in kernel_pairs(ktext):
            out["mix_kernels"].append({"preset": p.name, "label": p.label, "op": op, "ms": ms,
                                       "warp_ms": warp_ms, "floor_ms": floor})
    return out


def markdown(r):
    """The report as Markdown, ready to paste."""
    lines = ["**Targets** (docs/cuda.md; overhead goal = max(the issue's, "
             f"{FLOOR_FACTOR} x the 'dw fused, no zero fill' floor); 'goal from' says which applied)",
             "", "| target | measured | goal | goal from | met |", "|---|---|---|---|---|"]
    for t in r["targets"]:
        met = "-" if t["met"] is None else ("yes" if t["met"] else "no")
        lines.append(f"| {t['target']} | {t['measured'] or 'not measured'} | {t['goal']} | "
                     f"{t['goal_from']} | {met} |")
    c = r["ceilings"]

    def section(title, columns, rows):
        """A blank line, the title, a blank line, then a markdown table."""
        return (["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                + ["| " + " | ".join(row) + " |" for row in rows])

    lines += section(
        f"**Floor of a bf16 baseline step** from the measured ceilings (copy "
        f"{c['copy_gbs']:.0f} GB/s, GEMM {c['gemm_tflops']:.0f} TFLOP/s, cuDNN attention), "
        "the LM head's logit traffic in the run's logit dtype (bf16: "
        f"{lm_head_bytes_per_logit(2)}, fp32: {lm_head_bytes_per_logit(4)} bytes per "
        "logit); an estimate:",
        ["model", "B x T", "logits", "model TFLOP", "floor step", "MFU at floor",
         "step for the MFU target", "measured baseline", "measured / floor"],
        [[f["label"], f"{f['B']} x {f['T']}", f["logits"], f"{f['tflop']:.1f}",
          f"{f['floor_ms']:.1f} ms", f"{f['floor_mfu']:.1f}%",
          f"{f['target_ms']:.1f} ms ({f['target_mfu']}%)"]
         + ([f"{f['baseline_ms']:.1f} ms", f"{f['baseline_ms'] / f['floor_ms']:.2f}x"]
            if f["baseline_ms"] else ["-", "-"])
         for f in r["floors"]]) if r["floors"] else []
    lines += section(
        "**AttnRes overhead against the traffic of its depth Mix** beyond the "
        f"baseline's residual + norm: passes over a [B*T, d] bf16 tensor at "
        f"{c['copy_gbs']:.0f} GB/s, an estimate (x: measured / floor; %: of the "
        "baseline step):",
        ["model", "mode", "measured", "our kernels' floor", "measured / floor",
         "dw fused, no zero fill", "of the baseline step"],
        [[o["label_model"], o["label"], f"{o['ms']:+.1f} ms ({o['pct']:+.1f}%)",
          f"{o['ours_passes']} passes, {o['ours_ms']:.2f} ms", f"{o['ms'] / o['ours_ms']:.1f}x",
          f"{o['low_passes']} passes, {o['low_ms']:.2f} ms", f"{o['low_pct']:+.1f}%"]
         for o in r["overheads"]]) if r["overheads"] else []
    lines += section(
        "**Attention** forward + backward against PyTorch's cuDNN SDPA at the "
        "kernel benchmark's shape (information, not a target):",
        ["model", "shape (B, H, T, hd)", "ours ms", "cuDNN ms", "ours / cuDNN"],
        [[a["label"], str(a["shape"]), f"{a['ours_ms']:.3f}", f"{a['cudnn_ms']:.3f}",
          f"{a['ratio']:.2f}x"] for a in r["attention"]]) if r["attention"] else []
    lines += section(
        "**The race**: a whole training step, attnres against the PyTorch peer "
        "(`scripts/race_torch.py`: the same config, initial weights and data on the "
        "same card; median tokens/s past the first steps):",
        ["model", "mode", "attnres tok/s", "peer tok/s", "attnres / peer", "peer compiled",
         "max loss rel diff"],
        [[x["label"], x["mode"], f"{x['attnres']:.0f}", f"{x['peer']:.0f}", f"{x['ratio']:.2f}x",
          "no" if x["compiled"] is False else "yes", f"{x['loss_diff']:.1e}"]
         for x in r["race"]]) if r["race"] else []
    lines += section(
        "**The step as one CUDA graph** (`bench --cuda-graphs` against the eager "
        "table of the same report; information):",
        ["model", "mode", "eager ms", "graph ms", "saved"],
        [[g["label"], g["mode"], f"{g['eager_ms']:.1f}", f"{g['graph_ms']:.1f}",
          f"{g['eager_ms'] - g['graph_ms']:+.1f} ms "
          f"({100 * (g['eager_ms'] - g['graph_ms']) / g['eager_ms']:+.1f}%)"]
         for g in r["graphs"]]) if r["graphs"] else []
    lines += section(
        "**Mix kernels against their traffic floor** (`bench --kernels`: the bytes "
        "each must move, every input once and every output once, at the measured copy "
        "bandwidth):",
        ["model", "row", "MB", "ms", "floor ms", "ms / floor"],
        [[k["label"], k["op"], f"{k['mb']:.1f}", f"{k['ms']:.3f}", f"{k['floor_ms']:.3f}",
          f"{k['ratio']:.2f}x"] for k in r["mix_floors"]]) if r["mix_floors"] else []
    lines += section(
        "**Mix kernels, the default (rows) kernels against the warp kernels** "
        "(`bench --kernels`: each row again with ATTNRES_MIX_KERNELS=warp; information):",
        ["model", "row", "default ms", "warp ms", "floor ms", "default / warp", "default of floor"],
        [[k["label"], k["op"], f"{k['ms']:.3f}", f"{k['warp_ms']:.3f}", f"{k['floor_ms']:.3f}",
          f"{k['ms'] / k['warp_ms']:.2f}x", f"{100 * k['floor_ms'] / k['ms']:.1f}%"]
         for k in r["mix_kernels"]]) if r["mix_kernels"] else []
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report_dir")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    a = ap.parse_args()
    r = evaluate(a.report_dir)
    print(json.dumps(r, indent=1) if a.json else markdown(r))


if __name__ == "__main__":
    main()
