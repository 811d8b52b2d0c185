#!/usr/bin/env python3
"""Prints the GPU performance targets (docs/cuda.md) against a gpu_check.sh report.

    scripts/gpu_targets.py REPORT_DIR

REPORT_DIR holds what scripts/gpu_check.sh writes: bench_124m.txt and
bench_350m.txt (`attnres bench` tables), kernels_124m.txt and kernels_350m.txt
(`--kernels`) and, when PyTorch was there, attention_torch.txt. Missing files give "not measured"
rows. Standard library only.

After the targets it prints, per model, the floor of a training step from the
ceilings measured on the same machine (docs/cuda.md, "What the targets need"):
the GEMMs at the measured GEMM rate, attention at cuDNN's measured speed, and
an estimate of the memory-bound bytes (norms, SwiGLU, RoPE, the residual
epilogues, the LM head's fp32 logits, AdamW) at the measured copy bandwidth.
The bytes are counted from the shapes, so the floor is an estimate.

Then, per AttnRes mode measured, the floor of its overhead: the extra passes
over a [B*T, d] bf16 tensor that its depth Mix makes beyond the baseline's
residual add and RMSNorm (forward and backward, the schedule of model.cpp),
at the measured copy bandwidth. Two counts: the traffic our kernels are
designed to (each kernel reads its inputs from DRAM once), and the same
schedule with the Mix's dw summed in its row passes and no zero-filled
gradient buffers. Each is an estimate from the shapes, not a measurement.
"""
import math
import os
import re
import sys

PEAK_TFLOPS = 989  # the H100's dense bf16 peak, which train/config.h takes for MFU


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


def attention_shape(shape):
    """A model_shape's attention shape as attention_torch.txt names it: (B, H, T, head dim)."""
    return f"({shape['B']}, {shape['H']}, {shape['T']}, {shape['d'] // shape['H']})"


def ceilings(text):
    """(copy GB/s, GEMM TFLOP/s) from the `measured ceilings:` line."""
    m = re.search(r"copy (\d+) GB/s.*GEMM \S+ (\d+) TFLOP/s", text or "")
    return (float(m.group(1)), float(m.group(2))) if m else None


def floor_step(shape, copy_gbs, gemm_tfs, attn_fb_ms):
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
    lm_head = 14.0 * N * V                          # fp32 logits: see cuda/cross_entropy.cu
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
    G = S if S > 1 else math.isqrt(n - 1) + 1  # ModelConfig::mix_group_size
    first = lambda s: 1 + (s // G * G) // S     # Model::phase1_sources
    recent = lambda s: 1 + s // S - first(s) + (s % S > 0)  # Model::recent_sources
    rw = 3 if lower_bound else 4  # backward passes per source: read, read-add-write (, dw)
    mix = lambda k, Q: (k + Q) + (rw * k + Q)  # phase 1 forward + backward
    merge = lambda m: (2 + m) + (3 + rw * m) if m else 2 + 3  # merge + norm, or norm
    t = 1  # the embedding's rstd
    for s in range(n):
        if s % G == 0:
            t += mix(first(s), min(G, n - s))
        t += merge(recent(s)) + (s % S > 0) + (s % S == S - 1)
    k, m = 1 + n // S, int(n % S > 0)  # the final Mix: completed blocks, the partial
    t += mix(k, 1) + merge(m)
    if not lower_bound:
        t += k + m
    return t


def depth_floors(shape, bench, copy_gbs):
    """Lines on each measured AttnRes mode's overhead against its traffic floor."""
    base = bench.get("baseline")
    if not base:
        return []
    d, L, N = shape["d"], shape["L"], shape["B"] * shape["T"]
    pass_ms = 2.0 * N * d / (copy_gbs * 1e6)
    lines = []
    for mode in ("block", "full"):
        row = bench.get(mode)
        if not row or row[1] is None:
            continue
        S = 1 if mode == "full" else (2 * L + row[3] - 1) // row[3]
        got = row[2] - base[2]
        ours, low = (depth_passes(L, S, lb) - depth_passes(L, None) for lb in (False, True))
        label = "full" if mode == "full" else f"block N={row[3]}"
        lines.append(f"{label:10} {got:+8.1f} ms {row[1]:+6.1f}%   {ours:5d} {ours * pass_ms:6.2f} ms "
                     f"{got / (ours * pass_ms):4.1f}x   {low:5d} {low * pass_ms:6.2f} ms "
                     f"{100 * low * pass_ms / base[2]:+6.1f}%")
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    rows = []  # (target, measured text, goal text, met or None)
    for size in ("124m", "350m"):
        b = bench_rows(read(os.path.join(d, f"bench_{size}.txt")))
        label = size.upper()
        mfu = b.get("baseline", (None,) * 4)[0]
        rows.append((f"{label} baseline MFU", mfu and f"{mfu:.1f}%", ">= 50%",
                     None if mfu is None else mfu >= 50))
        for mode, goal in (("block", 2.0), ("full", 5.0)):
            vs = b.get(mode, (None,) * 4)[1]
            rows.append((f"{label} {mode} step vs baseline", vs is not None and f"{vs:+.1f}%" or None,
                         f"<= +{goal:.0f}%", None if vs is None else vs <= goal))
    torch_text = read(os.path.join(d, "attention_torch.txt"))
    for size in ("124m", "350m"):
        kt = read(os.path.join(d, f"kernels_{size}.txt"))
        fwd, bwd = kernel_ms(kt, "attention fwd"), kernel_ms(kt, "attention bwd")
        shape = model_shape(kt)  # the shape the kernels were timed at
        ref = shape and cudnn_fb_ms(torch_text, attention_shape(shape))
        ratio = fwd and bwd and ref and (fwd + bwd) / ref
        rows.append((f"attention fwd+bwd vs cuDNN SDPA ({size.upper()} shape)",
                     ratio and f"{ratio:.2f}x", "<= 1.30x", None if not ratio else ratio <= 1.3))
    k = read(os.path.join(d, "kernels_124m.txt"))

    print(f"{'target':46} {'measured':>10} {'goal':>9}  met")
    for name, got, goal, met in rows:
        print(f"{name:46} {got or 'not measured':>10} {goal:>9}  "
              f"{'-' if met is None else ('yes' if met else 'no')}")

    # Floors from this machine's ceilings (estimates; see the module doc).
    ceil = ceilings(k)
    printed = False
    for size in ("124m", "350m"):
        shape = model_shape(read(os.path.join(d, f"bench_{size}.txt")))
        if not ceil or not shape:
            continue
        attn = cudnn_fb_ms(torch_text, attention_shape(shape))
        if attn is None:
            continue
        ms, tflop = floor_step(shape, ceil[0], ceil[1], attn)
        if not printed:
            print(f"\nfloor of a step from the measured ceilings (copy {ceil[0]:.0f} GB/s, "
                  f"GEMM {ceil[1]:.0f} TFLOP/s, cuDNN attention), an estimate:")
            printed = True
        print(f"  {size.upper()}: {ms:.1f} ms for {tflop:.1f} TFLOP, i.e. at most "
              f"{100 * tflop / (PEAK_TFLOPS * ms * 1e-3):.1f}% MFU (50% needs "
              f"{tflop / (0.5 * PEAK_TFLOPS) * 1e3:.1f} ms)")

    # The AttnRes overheads against the traffic their depth Mix must move.
    printed = False
    for size in ("124m", "350m"):
        text = read(os.path.join(d, f"bench_{size}.txt"))
        shape = model_shape(text)
        if not ceil or not shape:
            continue
        lines = depth_floors(shape, bench_rows(text), ceil[0])
        if lines and not printed:
            print(f"\nAttnRes overhead against the traffic of its depth Mix beyond the baseline's "
                  f"residual + norm:\npasses over a [B*T, d] bf16 tensor at {ceil[0]:.0f} GB/s, "
                  f"an estimate (x: measured / floor; %: of the baseline step)")
            print(f"{'':5} {'mode':10} {'measured':>19}   {'our kernels floor':>20}   "
                  f"{'dw fused, no zero fill':>22}")
            printed = True
        for line in lines:
            print(f"{size.upper():5} {line}")


if __name__ == "__main__":
    main()
