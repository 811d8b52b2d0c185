#!/usr/bin/env python3
"""Where a training step's GPU time goes, from Nsight Compute's per-kernel CSV.

    scripts/ncu_summary.py [--steps N] [--step-ms MODE=MS ...] MODE=FILE.csv [MODE=FILE.csv ...]

Each FILE is what `ncu --csv --page raw --print-kernel-base function
--metrics gpu__time_duration.sum[,dram__bytes.sum,...] --log-file FILE`
wrote for N training steps of one residual mode (scripts/gpu_profile.sh makes
them). Kernels are grouped by function name (cuBLASLt's many GEMM kernels as
one "GEMM (cuBLASLt)" group: on Hopper cuBLAS names them nvjet_*, sm90_xmma_*) and the table gives, per mode, each group's time
per step and launches per step; with several modes, each later mode's time
over the first's (the first is normally the baseline), so the rows that make
an AttnRes mode's overhead stand out. --step-ms gives a mode's measured step
time (`attnres bench` without the profiler): the step minus the kernels' sum
is the time the GPU is not running our kernels (launch gaps, host work,
synchronisation), what CUDA graphs could remove. With dram__bytes.sum in the
CSV, a second table gives each group's DRAM bytes per step and the bandwidth
it reached. Standard library only.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

TIME = "gpu__time_duration.sum"
DRAM = "dram__bytes.sum"
# Unit -> factor to milliseconds / to bytes.
TIME_UNITS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
              "KB": 1e3, "MB": 1e6, "GB": 1e9}
GEMM = re.compile(r"(gemm|xmma|cutlass|nvjet|cublas|sm\d+_.*(hmma|gmma))", re.I)


def group_of(name):
    """A kernel's group: its function name, every cuBLAS/CUTLASS GEMM as one."""
    name = name.strip()
    if GEMM.search(name):
        return "GEMM (cuBLASLt)"
    # --print-kernel-base function leaves "ns::kernel_name"; drop what a
    # demangled name may still carry.
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"\(.*", "", name)
    return name.split("::")[-1] or "?"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_profile(path):
    """(group -> [ms, launches, bytes or None]) summed over the file's kernels."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's ==PROF== lines are not CSV
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{path}: no CSV rows (did ncu profile any kernel? is the profiler region set?)")
    head = rows[0]
    try:
        k_name, k_time = head.index("Kernel Name"), head.index(TIME)
    except ValueError:
        sys.exit(f"{path}: the CSV has no 'Kernel Name' or '{TIME}' column")
    k_dram = head.index(DRAM) if DRAM in head else None
    time_factor, byte_factor = 1e-6, 1.0  # ncu's defaults: nanoseconds, bytes
    groups = defaultdict(lambda: [0.0, 0, None])
    for row in rows[1:]:
        if len(row) <= k_time:
            continue
        if not row[k_name]:  # the units row
            time_factor = TIME_UNITS.get(row[k_time], time_factor)
            if k_dram is not None:
                byte_factor = BYTE_UNITS.get(row[k_dram], byte_factor)
            continue
        t = number(row[k_time])
        if t is None:
            continue
        g = groups[group_of(row[k_name])]
        g[0] += t * time_factor
        g[1] += 1
        if k_dram is not None and number(row[k_dram]) is not None:
            g[2] = (g[2] or 0.0) + number(row[k_dram]) * byte_factor
    return groups


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1, help="training steps each file holds")
    ap.add_argument("--step-ms", action="append", default=[], metavar="MODE=MS",
                    help="a mode's measured step time without the profiler")
    ap.add_argument("--top", type=int, default=25, help="rows shown (by largest time)")
    ap.add_argument("profiles", nargs="+", metavar="MODE=FILE")
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("--steps must be >= 1")
    modes, data = [], {}
    for item in a.profiles:
        mode, _, path = item.partition("=")
        if not path:
            sys.exit(f"'{item}': expected MODE=FILE")
        modes.append(mode)
        data[mode] = {g: [v[0] / a.steps, v[1] / a.steps, None if v[2] is None else v[2] / a.steps]
                      for g, v in read_profile(path).items()}
    step_ms = {}
    for item in a.step_ms:
        mode, _, ms = item.partition("=")
        if number(ms) is None:
            sys.exit(f"--step-ms '{item}': expected MODE=MS")
        step_ms[mode] = number(ms)

    base = modes[0]
    everything = set().union(*(data[m] for m in modes))
    # Largest first, by the time in any mode, so a group only an AttnRes mode
    # runs is not hidden below the baseline's.
    order = sorted(everything, key=lambda g: -max(data[m].get(g, [0])[0] for m in modes))
    cols = []
    for m in modes:
        cols += [f"{m} ms", "launches"]
        if m != base:
            cols.append(f"{m} - {base}")
    print("| kernel group | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")

    def cells(g):
        out = []
        for m in modes:
            ms, n, _ = data[m].get(g, [0.0, 0, None])
            out += [f"{ms:.3f}", f"{n:g}"]
            if m != base:
                out.append(f"{ms - data[base].get(g, [0.0])[0]:+.3f}")
        return out

    for g in order[:a.top]:
        print(f"| {g} | " + " | ".join(cells(g)) + " |")
    if len(order) > a.top:
        rest = order[a.top:]
        summed = []
        for m in modes:
            ms = sum(data[m].get(g, [0.0])[0] for g in rest)
            n = sum(data[m].get(g, [0, 0])[1] for g in rest)
            summed += [f"{ms:.3f}", f"{n:g}"]
            if m != base:
                summed.append(f"{ms - sum(data[base].get(g, [0.0])[0] for g in rest):+.3f}")
        print(f"| ({len(rest)} more groups) | " + " | ".join(summed) + " |")
    totals = {m: sum(v[0] for v in data[m].values()) for m in modes}
    row = []
    for m in modes:
        row += [f"**{totals[m]:.3f}**", f"{sum(v[1] for v in data[m].values()):g}"]
        if m != base:
            row.append(f"{totals[m] - totals[base]:+.3f}")
    print("| **all kernels** | " + " | ".join(row) + " |")

    if step_ms:
        print()
        print("| mode | step ms (bench) | kernels ms (ncu) | not in kernels ms | share |")
        print("|---|---|---|---|---|")
        for m in modes:
            if m in step_ms:
                gap = step_ms[m] - totals[m]
                print(f"| {m} | {step_ms[m]:.3f} | {totals[m]:.3f} | {gap:.3f} | "
                      f"{100 * gap / step_ms[m]:.1f}% |")
        print("(kernel times under ncu are each kernel alone with caches as the step left them; "
              "the gap is launch latency, host work and synchronisation between kernels)")

    if any(v[2] is not None for m in modes for v in data[m].values()):
        print()
        print("| kernel group | mode | ms | DRAM MB | GB/s |")
        print("|---|---|---|---|---|")
        for g in order[:a.top]:
            for m in modes:
                ms, _, b = data[m].get(g, [0.0, 0, None])
                if b is None or ms <= 0:
                    continue
                print(f"| {g} | {m} | {ms:.3f} | {b / 1e6:.1f} | {b / 1e9 / (ms * 1e-3):.0f} |")


if __name__ == "__main__":
    main()
