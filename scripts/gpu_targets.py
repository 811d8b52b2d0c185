#!/usr/bin/env python3
"""Prints the CUDA issue's performance targets against a gpu_check.sh report.

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
"""
import os
import re
import sys


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def bench_rows(text):
    """mode -> (MFU %, vs-base %) from an `attnres bench` table."""
    rows = {}
    for line in (text or "").splitlines():
        m = re.match(r"^(baseline|block N=\d+|full)\s+([\d.]+)\s+\d+\s+[\d.]+\s+([\d.]+)%\s+(\S+)", line)
        if m:
            vs = m.group(4)
            rows[m.group(1).split()[0]] = (float(m.group(3)),
                                           None if vs == "-" else float(vs.rstrip("%")))
    return rows


def kernel_ms(text, op):
    for line in (text or "").splitlines():
        if line.startswith(op + " "):
            return float(line[len(op):].split()[0])
    return None


def cudnn_fb_ms(text, shape="(16, 12, 1024, 64)"):
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


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    rows = []  # (target, measured text, goal text, met or None)
    for size in ("124m", "350m"):
        b = bench_rows(read(os.path.join(d, f"bench_{size}.txt")))
        label = size.upper()
        mfu = b.get("baseline", (None, None))[0]
        rows.append((f"{label} baseline MFU", mfu and f"{mfu:.1f}%", ">= 50%",
                     None if mfu is None else mfu >= 50))
        for mode, goal in (("block", 2.0), ("full", 5.0)):
            vs = b.get(mode, (None, None))[1]
            rows.append((f"{label} {mode} step vs baseline", vs is not None and f"{vs:+.1f}%" or None,
                         f"<= +{goal:.0f}%", None if vs is None else vs <= goal))
    torch_text = read(os.path.join(d, "attention_torch.txt"))
    for size, shape in (("124m", "(16, 12, 1024, 64)"), ("350m", "(8, 16, 2048, 64)")):
        kt = read(os.path.join(d, f"kernels_{size}.txt"))
        fwd, bwd = kernel_ms(kt, "attention fwd"), kernel_ms(kt, "attention bwd")
        ref = cudnn_fb_ms(torch_text, shape)
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
        hd = shape["d"] // shape["H"]
        attn = cudnn_fb_ms(torch_text, f"({shape['B']}, {shape['H']}, {shape['T']}, {hd})")
        if attn is None:
            continue
        ms, tflop = floor_step(shape, ceil[0], ceil[1], attn)
        if not printed:
            print(f"\nfloor of a step from the measured ceilings (copy {ceil[0]:.0f} GB/s, "
                  f"GEMM {ceil[1]:.0f} TFLOP/s, cuDNN attention), an estimate:")
            printed = True
        print(f"  {size.upper()}: {ms:.1f} ms for {tflop:.1f} TFLOP, i.e. at most "
              f"{100 * tflop / (989 * ms * 1e-3):.1f}% MFU (50% needs "
              f"{tflop / (0.5 * 989) * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
