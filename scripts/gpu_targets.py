#!/usr/bin/env python3
"""Prints the CUDA issue's performance targets against a gpu_check.sh report.

    scripts/gpu_targets.py REPORT_DIR

REPORT_DIR holds what scripts/gpu_check.sh writes: bench_124m.txt and
bench_350m.txt (`attnres bench` tables), kernels_124m.txt (`--kernels`) and,
when PyTorch was there, attention_torch.txt. Missing files give "not measured"
rows. Standard library only.
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
    k = read(os.path.join(d, "kernels_124m.txt"))
    fwd, bwd = kernel_ms(k, "attention fwd"), kernel_ms(k, "attention bwd")
    ref = cudnn_fb_ms(read(os.path.join(d, "attention_torch.txt")))
    ratio = fwd and bwd and ref and (fwd + bwd) / ref
    rows.append(("attention fwd+bwd vs cuDNN SDPA (124M shape)", ratio and f"{ratio:.2f}x",
                 "<= 1.30x", None if not ratio else ratio <= 1.3))

    print(f"{'target':46} {'measured':>10} {'goal':>9}  met")
    for name, got, goal, met in rows:
        print(f"{name:46} {got or 'not measured':>10} {goal:>9}  "
              f"{'-' if met is None else ('yes' if met else 'no')}")


if __name__ == "__main__":
    main()
