#!/usr/bin/python3
"""The race: a whole training step of attnres against the PyTorch peer
(scripts/peer_torch.py), same config, same card, same work, per residual mode.

    scripts/race_torch.py CONFIG.json [--modes baseline,block,full] [--steps N]
                          [--skip K] [--device cpu|cuda] [--compile] [--attnres BIN]
                          [--section.key=value ...]

For each mode (model.residual set to {"mode": "baseline"}, {"mode": "full"} or
the config's own Block settings, N = 8 blocks when it has none), `attnres train` runs the config's first N steps (run.stop_after, into a
fresh temporary folder: no resume, no evaluation) and the peer its first N
steps of the same run. Each side's speed is the median tokens/s of steps K+1..N
(the first steps carry warm-up, allocation and the peer's compilation), from
attnres's metrics.jsonl and the peer's JSON lines. The losses of the two must
be those of the same work: their largest relative difference is printed
(fp32: ~1e-7, bf16: bf16's rounding; the peer keeps fp32 weights under
autocast).

Output: a table, one row per mode,
  mode   attnres tok/s   peer tok/s   attnres / peer   max loss rel diff
which scripts/gpu_targets.py reads (race_P.txt of a gpu_check.sh report).
Exit status 1 when a side fails (its error is shown), 2 on bad arguments.
Standard library only (torch is the peer's).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def mode_override(mode, model):
    """The model.residual override of a mode, given the config's model section:
    Block keeps the config's own settings, or takes N = 8 blocks (at most one
    per sublayer)."""
    if mode == "block":
        if model["residual"].get("mode") == "block":
            return dict(model["residual"])
        return {"mode": "block", "n_blocks": min(8, 2 * model["n_layers"])}
    return {"mode": mode}


def run(cmd, what):
    """(stdout, stderr) of cmd; exits 1 with its stderr when it fails."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        sys.exit(f"race_torch: {what} failed (exit code {p.returncode}): {' '.join(cmd)}")
    return p.stdout, p.stderr


def median_speed(records, skip, what):
    speeds = [r["tokens_per_sec"] for r in records if r["step"] > skip]
    if not speeds:
        sys.exit(f"race_torch: {what}: no step after the first {skip}")
    return statistics.median(speeds)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--modes", default="baseline,block,full")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=5, help="steps left out of the median")
    ap.add_argument("--device", choices=["cpu", "cuda"])
    ap.add_argument("--compile", action="store_true", help="the peer under torch.compile")
    ap.add_argument("--attnres", default=os.path.join(HERE, "..", "build", "attnres"))
    args, overrides = ap.parse_known_args(argv)
    modes = args.modes.split(",")
    if any(m not in ("baseline", "block", "full") for m in modes):
        ap.error(f"--modes takes baseline, block and full, got {args.modes}")
    if not 0 <= args.skip < args.steps:
        ap.error(f"--skip {args.skip} must be in [0, --steps = {args.steps})")
    for o in overrides:
        if not o.startswith("--") or "=" not in o:
            ap.error(f"unknown argument '{o}' (overrides are --section.key=value)")
    device = [f"--training.device={args.device}"] if args.device else []
    cfg = json.loads(run([args.attnres, "inspect", "config", args.config] + overrides + device,
                         "resolving the config")[0])

    rows, notes = [], []
    for mode in modes:
        mode_args = overrides + device + [
            "--model.residual=" + json.dumps(mode_override(mode, cfg["model"]), separators=(",", ":"))]
        with tempfile.TemporaryDirectory(prefix="attnres-race-") as work:
            run([args.attnres, "train", args.config] + mode_args +
                [f"--run.stop_after={args.steps}", f"--run.dir={work}/run",
                 f"--checkpoint.dir={work}/ckpt", "--checkpoint.every=0", "--eval.every=0",
                 "--run.log_every=1"],
                f"attnres train ({mode})")
            with open(os.path.join(work, "run", "metrics.jsonl"), encoding="utf-8") as f:
                ours = [r for r in map(json.loads, filter(str.strip, f))
                        if "loss" in r and "event" not in r]
        peer_cmd = [sys.executable, os.path.join(HERE, "peer_torch.py"), args.config,
                    "--steps", str(args.steps), "--attnres", args.attnres] + mode_args
        if args.compile:
            peer_cmd.append("--compile")
        out, err = run(peer_cmd, f"the peer ({mode})")
        peer = [json.loads(l) for l in out.splitlines() if l.strip()]
        # What the peer ran (torch, device, attention, compiled or eager, and
        # why not compiled): it goes under the table.
        notes += [f"peer ({mode}): {l[len('peer_torch: '):]}" for l in err.splitlines()
                  if l.startswith("peer_torch: torch ") or "torch.compile" in l]
        diff = max(abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), abs(b["loss"]), 1e-30)
                   for a, b in zip(ours, peer))
        a, b = median_speed(ours, args.skip, "attnres"), median_speed(peer, args.skip, "the peer")
        rows.append((mode, a, b, diff))
        print(f"race_torch: {mode}: attnres {a:.0f} tok/s, peer {b:.0f} tok/s", file=sys.stderr)

    print(f"race: {args.config}{' ' + ' '.join(overrides) if overrides else ''}, "
          f"device {args.device or cfg['training']['device']}, "
          f"{cfg['training']['precision']}, median tokens/s of steps {args.skip + 1}..{args.steps}, "
          f"peer {'with' if args.compile else 'without'} torch.compile")
    print(f"{'mode':<10} {'attnres tok/s':>14} {'peer tok/s':>12} {'attnres / peer':>15} "
          f"{'max loss rel diff':>18}")
    for mode, a, b, diff in rows:
        print(f"{mode:<10} {a:14.0f} {b:12.0f} {a / b:14.2f}x {diff:18.2e}")
    for n in notes:
        print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
