#!/usr/bin/env python3
"""Writes the Markdown report of one GPU session from its logs.

    scripts/gpu_report.py DIR [--commit SHA] [--date YYYY-MM-DD] > DIR/README.md

DIR holds what the session's scripts wrote (unpack their $OUT archives into
it, in stage order): scripts/gpu_check.sh's stages (gpu.txt, steps.txt, the
GPU tests' gpu_tests_<family>.log, or gpu_tests.log of an earlier session or
of --only, nccl.log, nccl_all_to_all.log, moe_ep_cuda.log, cuda_graphs.log,
resume.log, pipeline_cuda.log, zero_bf16.log, bench_*.txt, kernels_*.txt,
attention_torch.txt), scripts/gpu_logits_compare.sh (logits_compare.txt) and
scripts/gpu_profile.sh (profile_*.md). A missing file is reported as "not
run", a test log without its success line as FAILED: the report never says
more than the logs do. Standard library only.
"""
import argparse
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_targets  # noqa: E402  (the target table, from the same files)


def read(d, name):
    try:
        with open(os.path.join(d, name)) as f:
            # Catch2 colours its output when mpirun hands it a terminal.
            return re.sub(r"\x1b\[[0-9;]*m", "", f.read())
    except OSError:
        return None


def catch2_result(text):
    """(verdict, summary) of a Catch2 run's log: a test that found no device or
    no NCCL says "skipped: ..." and asserts nothing, which Catch2 counts as passed."""
    m = re.search(r"^(SKIPPED: .*)$", text, re.M)  # test_gpu without a device
    if m:
        return "skipped", m.group(1)
    m = re.search(r"^No test cases matched .*$", text, re.M)  # -w NoTests: exit 2
    if m:
        return "FAILED", m.group(0)
    m = re.search(r"^All tests passed \(.*\)$", text, re.M)
    if m:
        skip = re.search(r"skipped: .*$", text, re.M)
        return ("skipped", skip.group(0)) if skip else ("passed", m.group(0))
    m = re.search(r"^test cases:.*$", text, re.M)
    return "FAILED", m.group(0) if m else "no summary line (the run did not finish)"


def script_result(text, success):
    """(verdict, the ok/skipped/not run/FAIL lines) of a tests/cli or tests/gpu script's log."""
    lines = [l for l in text.splitlines() if re.match(r"^(ok|skipped|not run)\b", l)]
    failed = [l for l in text.splitlines() if l.startswith("FAIL")]
    if failed:
        return "FAILED", lines + failed
    if success in text:
        return "passed", lines
    skipped = lines and all(l.startswith("skipped") for l in lines)
    return ("skipped" if skipped else "FAILED"), lines


def tests_section(d):
    out = ["## Tests", "", "| test | result | summary |", "|---|---|---|"]
    details = []
    # The GPU tests: one log (gpu_tests.log: earlier sessions, --only) or the
    # runs of gpu_check.sh's stages, each its own row (--first's and
    # --second's families; the recompute run of sessions before 2026-12-02,
    # now inside the model run, shown only where its log is).
    split = [("gpu_tests_moe_muon.log", 'GPU tests `"[moe],[muon]"` (grouped expert GEMMs)'),
             ("gpu_tests_moe_per_expert.log", 'GPU tests `"[moe]"`, a GEMM per expert'),
             ("gpu_tests_matmul.log", 'GPU tests `"[matmul]"` (cuBLASLt plans logged)'),
             ("gpu_tests_attention.log", 'GPU tests `"[attention]~[cudnn]"`'),
             ("gpu_tests_kda.log", 'GPU tests `"[kda],[mla]"` (Kimi Linear)'),
             ("gpu_tests_model.log", 'GPU tests `"[model]"`'),
             ("gpu_tests_graphs.log", 'GPU tests `"[graphs]"`'),
             ("gpu_tests_mix.log", 'GPU tests `"[mix]"`'),
             ("gpu_tests_cudnn.log", 'GPU tests `"[cudnn]"` (cuDNN\'s log)'),
             ("gpu_tests_ce_swiglu_store.log", 'GPU tests `"[cross_entropy],[swiglu],[store]"`'),
             ("gpu_tests_rest.log", 'GPU tests: the rest'),
             ("gpu_tests_recompute.log", 'GPU tests `"[recompute]"` (recomputation bit for bit)')]
    if read(d, "gpu_tests_recompute.log") is None:
        split = [r for r in split if r[0] != "gpu_tests_recompute.log"]
    runs = [("gpu_tests.log", "GPU tests (`test_gpu`)")]
    if read(d, "gpu_tests.log") is None or any(read(d, n) is not None for n, _ in split):
        runs = [r for r in runs if read(d, r[0]) is not None] + split
    for name, title in runs:
        text = read(d, name)
        if text is None:
            out.append(f"| {title} | not run | |")
            continue
        verdict, summary = catch2_result(text)
        head = re.search(r"^GPU tests on .*$", text, re.M)
        out.append(f"| {title} | {verdict} | {summary}"
                   f"{' (' + head.group(0) + ')' if head else ''} |")
    for name, title in (("nccl.log", "NCCL transport, 1 rank (`test_mpi [nccl]`)"),
                        ("nccl_all_to_all.log", "NCCL expert all-to-all, 2 ranks (`test_mpi [nccl2]`)")):
        text = read(d, name)
        if text is None:
            out.append(f"| {title} | not run | |")
        else:
            verdict, summary = catch2_result(text)
            out.append(f"| {title} | {verdict} | {summary} |")
    for name, title, success in (
            ("moe_ep_cuda.log", "MoE and expert parallelism on cuda (`tests/gpu/moe_ep_cuda.sh`)",
             "all moe_ep_cuda checks passed"),
            ("cuda_graphs.log", "CUDA graphs through attnres train (`tests/gpu/cuda_graphs_train.sh`)",
             "all cuda graphs checks passed"),
            ("resume.log", "exact resume and eval, bf16 (`tests/cli/resume.sh`)",
             "all resume checks passed"),
            ("pipeline_cuda.log", "pipeline and data parallelism on cuda (`tests/gpu/pipeline_cuda.sh`)",
             "all pipeline_cuda checks passed"),
            ("zero_bf16.log", "ZeRO-1 in bf16, 2 ranks (`tests/gpu/zero_bf16.sh`)",
             "all zero_bf16 checks passed")):
        text = read(d, name)
        if text is None:
            out.append(f"| {title} | not run | |")
            continue
        verdict, lines = script_result(text, success)
        out.append(f"| {title} | {verdict} | {len(lines)} line{'' if len(lines) == 1 else 's'} below |")
        details += ["", f"`{name}`:", "", "```"] + lines + ["```"]
    return out + details


def verbatim(title, texts):
    out = [f"## {title}", ""]
    if not texts:
        return out + ["not run"]
    for name, text in texts:
        out += [f"`{name}`:", "", "```", text.rstrip("\n"), "```", ""]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--commit", default="(not given)")
    ap.add_argument("--date", default="(not given)")
    a = ap.parse_args()
    d = a.dir
    gpu = (read(d, "gpu.txt") or "").strip().splitlines()
    lines = [f"# GPU session {a.date}", "",
             f"Commit {a.commit}; GPU: {gpu[-1] if gpu else 'gpu.txt missing'}. Written by "
             "`scripts/gpu_report.py` from the logs in this folder.", ""]
    lines += tests_section(d) + [""]
    steps = read(d, "steps.txt")
    if steps:
        lines += ["## Steps and their times (`steps.txt`: result, seconds, the plan's minutes)", "",
                  "```", steps.rstrip("\n"), "```", ""]
    lines += ["## Targets (`scripts/gpu_targets.py`)", "",
              gpu_targets.markdown(gpu_targets.evaluate(d)), ""]
    benches = [(os.path.basename(p), read(d, os.path.basename(p)))
               for p in sorted(glob.glob(os.path.join(d, "bench_*.txt")))]
    lines += verbatim("Training steps (`attnres bench`)", benches)
    logits = read(d, "logits_compare.txt")
    lines += verbatim("bf16 against fp32 logits (`scripts/gpu_logits_compare.sh`)",
                      logits and [("logits_compare.txt", logits)])
    profiles = [(os.path.basename(p), read(d, os.path.basename(p)))
                for p in sorted(glob.glob(os.path.join(d, "profile_*.md")))]
    lines += ["## Profiles (`scripts/gpu_profile.sh`, Nsight Compute)", ""]
    if not profiles:
        lines.append("not run")
    for name, text in profiles:
        lines += [f"### {name}", "", text.rstrip("\n"), ""]
    kernels = [(os.path.basename(p), read(d, os.path.basename(p)))
               for p in sorted(glob.glob(os.path.join(d, "kernels_*.txt")))]
    lines += verbatim("Per-kernel benchmarks (`attnres bench --kernels`)", kernels)
    print("\n".join(lines).rstrip("\n"))


if __name__ == "__main__":
    main()
