#!/usr/bin/python3
"""Figures for an `attnres sweep` output directory (docs/sweeps.md).

usage: plot_sweep.py OUT_DIR [--attnres BIN] [--size NAME --budget TOKENS] [--batches N]
                      [--plots DIR]

Reads OUT_DIR/results.csv, OUT_DIR/fits.json and the runs' metrics.jsonl /
depth_stats.jsonl / checkpoints, and writes OUT_DIR/plots/ (or --plots DIR):
  loss_vs_compute.png   final loss against compute C = 6ND per mode, with the
                        fitted lines L = A C^-alpha, and the compute multiplier
                        of each AttnRes mode over the baseline
  loss_curves.png       training loss (smoothed) against tokens, one panel per size
  depth_stats.png       per-sublayer output RMS and gradient norm across depth,
                        one line per mode (the paper's Figure 5 view)
  depth_attention.png   depth-attention weights, sources x sublayers, averaged
                        over tokens, one panel per AttnRes mode (via
                        `attnres inspect attention` on the final checkpoint)
The depth figures use one (size, budget) point for every mode: by default the
one with the most compute; --size/--budget pick another.

Needs numpy and matplotlib (Debian: python3-matplotlib, run with /usr/bin/python3).
Exits with code 3 when matplotlib is missing, so callers can say so.
"""
import argparse
import csv
import json
import math
import os
import subprocess
import sys

try:
    import numpy as np
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import (FixedLocator, FormatStrFormatter, MaxNLocator,
                                   NullFormatter)
except ImportError as e:  # the caller (attnres sweep, the tests) reports this
    print(f"plot_sweep.py: {e}; install python3-matplotlib and run with /usr/bin/python3",
          file=sys.stderr)
    sys.exit(3)

COLORS = ["#444444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
DPI = 90


def read_jsonl(path):
    """Records of a .jsonl file; a torn last line (crash) is ignored."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out


def by_step(records, key):
    """{step: value} for records holding `key`; later records win (a resumed
    run logs the steps after its checkpoint again, with the same values)."""
    return {r["step"]: r[key] for r in records if key in r and r[key] is not None}


def mode_colors(modes):
    return {m: COLORS[i % len(COLORS)] for i, m in enumerate(modes)}


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    print(f"plot_sweep.py: wrote {path} ({os.path.getsize(path) // 1024} KB)")


def plot_loss_vs_compute(rows, fits, modes, out):
    colors = mode_colors(modes)
    has_mult = bool(fits.get("multipliers"))
    fig, axes = plt.subplots(1, 2 if has_mult else 1, figsize=(11 if has_mult else 6, 4.2),
                             squeeze=False)
    ax = axes[0][0]
    loss_key = fits.get("loss", "val_loss")
    for m in modes:
        # Every seed, small; the points' means over seeds with +-1 standard
        # error (fits.json), which the fitted line goes through.
        seeds = [(float(r["pflops_days"]), float(r[loss_key])) for r in rows
                 if r["mode"] == m and r["status"] == "done" and r[loss_key]]
        if not seeds:
            continue
        fit = fits["modes"].get(m, {})
        means = sorted((p["compute"], p["loss"], p.get("loss_se") or 0.0)
                       for p in fit.get("points", []))
        label = m
        if "A" in fit:
            label += f": {fit['A']:.4g}·C^-{fit['alpha']:.4f} (R²={fit['r2']:.3f})"
            c = [p[0] for p in means]
            cc = np.geomspace(min(c) / 1.3, max(c) * 1.3, 50)
            ax.plot(cc, fit["A"] * cc ** -fit["alpha"], color=colors[m], lw=1.2, alpha=0.8)
        if len(seeds) > len(means):
            ax.scatter(*zip(*seeds), color=colors[m], s=8, alpha=0.35, zorder=2)
        if means:
            c, l, se = zip(*means)
            ax.errorbar(c, l, yerr=se, fmt="o", ms=4.5, color=colors[m], capsize=2, label=label,
                        zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Losses span less than a decade: label round values (log scale keeps the
    # fitted power laws straight).
    lo, hi = ax.get_ylim()
    step = 0.1 if hi - lo < 1.0 else 0.2 if hi - lo < 2.5 else 0.5
    ticks = np.arange(math.ceil(lo / step) * step, hi, step)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.1f"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("compute C = 6ND (PFLOP/s-days)")
    ax.set_ylabel(f"final {loss_key.replace('_', ' ')}")
    ax.set_title("loss vs compute, fitted L = A·C^-α")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    if has_mult:
        ax = axes[0][1]
        base = fits.get("baseline", "baseline")
        for m in modes:
            pts = sorted((r["compute"], r["multiplier_measured"], r.get("ci95"))
                         for r in fits["multipliers"]
                         if r["mode"] == m and "multiplier_measured" in r)
            if not pts:
                continue
            c = [p[0] for p in pts]
            x = [p[1] for p in pts]
            # 95% bootstrap intervals over seeds, where the sweep has them.
            err = [[max(0.0, p[1] - p[2][0]) if p[2] else 0.0 for p in pts],
                   [max(0.0, p[2][1] - p[1]) if p[2] else 0.0 for p in pts]]
            summary = fits.get("summary", {}).get(m, {})
            label = f"{m} (mean loss)"
            if summary.get("ci95"):
                lo, hi = summary["ci95"]
                label += f": {summary['geomean_multiplier_measured']:.2f}x [{lo:.2f}, {hi:.2f}]"
            ax.errorbar(c, x, yerr=err, fmt="o", color=colors[m], capsize=2, label=label)
            fpts = sorted((r["compute"], r["multiplier_fit"]) for r in fits["multipliers"]
                          if r["mode"] == m and "multiplier_fit" in r)
            if fpts:
                ax.plot(*zip(*fpts), "-", color=colors[m], alpha=0.6, label=f"{m} (fitted line)")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("compute C (PFLOP/s-days)")
        ax.set_ylabel(f"compute multiplier over {base}")
        ax.set_title(f"{base} compute for the same loss / compute used")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    save(fig, out)


def smooth(y, window):
    if window <= 1 or len(y) < window:
        return np.asarray(y)
    kernel = np.ones(window) / window
    return np.convolve(y, kernel, mode="valid")


def plot_loss_curves(rows, modes, sweep_dir, out):
    colors = mode_colors(modes)
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.6 * len(sizes) + 0.6, 3.8), squeeze=False,
                             sharey=True)
    for ax, size in zip(axes[0], sizes):
        budgets = sorted({int(r["tokens"]) for r in rows if r["size"] == size})
        labelled = set()
        for r in rows:
            if r["size"] != size:
                continue
            recs = read_jsonl(os.path.join(sweep_dir, "runs", r["run"], "metrics.jsonl"))
            loss = by_step(recs, "loss")
            if not loss:
                continue
            steps = sorted(loss)
            tokens_per_step = int(r["tokens"]) / int(r["steps"])
            window = max(1, len(steps) // 25)
            y = smooth([loss[s] for s in steps], window)
            x = np.array(steps[window - 1:]) * tokens_per_step
            shade = 0.45 + 0.55 * (budgets.index(int(r["tokens"])) + 1) / len(budgets)
            first = int(r["tokens"]) == budgets[-1] and r["mode"] not in labelled
            if first:
                labelled.add(r["mode"])
            ax.plot(x, y, color=colors[r["mode"]], lw=1, alpha=shade,
                    label=r["mode"] if first else None)
            val = by_step(recs, "val_loss")
            if val:
                last = max(val)
                ax.plot(last * tokens_per_step, val[last], "x", color=colors[r["mode"]], ms=6)
        ax.set_xscale("log")
        ax.set_title(f"size {size}")
        ax.set_xlabel("tokens")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"train loss (moving average), x = final val loss")
    axes[0][0].legend(fontsize=7)
    save(fig, out)


def pick_point(rows, size, budget):
    """The (size, tokens) point the depth figures use."""
    done = [r for r in rows if r["status"] == "done"]
    if size:
        done = [r for r in done if r["size"] == size]
    if budget:
        # The budget as the run names give it ("500k": the point's name ends
        # with it), or the tokens actually trained (results.csv's "tokens").
        done = [r for r in done
                if r["tokens"] == budget or r.get("point", r["run"]).endswith("_" + budget)]
    if not done:
        return None
    best = max(done, key=lambda r: float(r["flops"]))
    return best["size"], best["tokens"]


def point_runs(rows, point, modes):
    """{mode: row} of the runs at `point`, in mode order (the first seed's run)."""
    out = {}
    for m in modes:
        for r in rows:
            if r["mode"] == m and (r["size"], r["tokens"]) == point and r["status"] == "done":
                out.setdefault(m, r)
    return out


def plot_depth_stats(runs, modes, sweep_dir, out):
    colors = mode_colors(modes)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    step_seen = None
    drawn = 0
    for m, r in runs.items():
        recs = read_jsonl(os.path.join(sweep_dir, "runs", r["run"], "depth_stats.jsonl"))
        if not recs:
            continue
        last = {}
        for rec in recs:  # later records win
            last[rec["step"]] = rec
        rec = last[max(last)]
        step_seen = rec["step"]
        s = np.arange(len(rec["output_rms"]))
        label = f"{m} ({r['residual']}" + (f", S={r['block_size']})" if r["block_size"] else ")")
        axes[0].plot(s, rec["output_rms"], "o-", ms=3, color=colors[m], label=label)
        axes[1].plot(s, rec["grad_norm"], "o-", ms=3, color=colors[m], label=label)
        drawn += 1
    if drawn == 0:
        plt.close(fig)
        print("plot_sweep.py: no depth_stats.jsonl (set run.depth_stats_every > 0): "
              "depth_stats.png skipped")
        return
    for ax, title in zip(axes, ["output RMS of each sublayer, RMS(y_s)",
                                "gradient norm ||dL/dy_s||"]):
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("sublayer s (even: attention, odd: MLP)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    first = next(iter(runs.values()))
    fig.suptitle(f"depth statistics at step {step_seen}, size {first['size']}, "
                 f"{int(first['tokens']):,} tokens", fontsize=10)
    save(fig, out)


def depth_attention(attnres_bin, run_dir, batches):
    """Mean Mix weights [sublayer][source] of the run's newest checkpoint."""
    ckpt = os.path.join(run_dir, "ckpt")
    steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step_")) if os.path.isdir(ckpt) else []
    if not steps:
        return None
    with open(os.path.join(run_dir, "config.json")) as f:
        data = json.load(f)["data"]
    cmd = [attnres_bin, "inspect", "attention", "--checkpoint", os.path.join(ckpt, steps[-1]),
           "--data", data["val"] or data["train"], "--batches", str(batches)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"plot_sweep.py: {' '.join(cmd)} failed:\n{res.stderr}", file=sys.stderr)
        return None
    return json.loads(res.stdout)


def attention_matrix(att):
    """Rows of `inspect attention` (sources in order: b_0 = embedding, the
    completed blocks, then the partial sum when present) as a matrix
    [source slot, consumer]: slot j < n = block j, the last slot = partial."""
    S = att["block_size"]
    rows = att["rows"]
    n_sub = len(rows) - 1
    n_blocks = 1 + n_sub // S  # b_0 and the blocks completed before the final Mix
    partial = S > 1
    mat = np.full((n_blocks + (1 if partial else 0), len(rows)), np.nan)
    for s, w in enumerate(rows):
        # Sublayer s (and the final Mix, s = n_sub) sees blocks 0..s//S, plus
        # the partial sum when it is inside a block (s % S != 0).
        completed = s // S + 1
        for j in range(min(completed, len(w))):
            mat[j, s] = w[j]
        if len(w) > completed:
            mat[-1, s] = w[-1]
    labels = ["emb"] + [f"b{j}" if S > 1 else f"y{j - 1}" for j in range(1, n_blocks)]
    if partial:
        labels.append("partial")
    return mat, labels, n_sub


def plot_depth_attention(runs, sweep_dir, attnres_bin, batches, out):
    panels = []
    for m, r in runs.items():
        if r["residual"] == "baseline":
            continue
        att = depth_attention(attnres_bin, os.path.join(sweep_dir, "runs", r["run"]), batches)
        if att:
            panels.append((m, r, att))
    if not panels:
        print("plot_sweep.py: no AttnRes checkpoint: depth_attention.png skipped")
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6), squeeze=False)
    for ax, (m, r, att) in zip(axes[0], panels):
        mat, labels, n_sub = attention_matrix(att)
        im = ax.imshow(np.ma.masked_invalid(mat), aspect="auto", cmap="viridis", vmin=0, vmax=1,
                       origin="upper", interpolation="nearest")
        xl = [("a" if s % 2 == 0 else "m") + str(s // 2) for s in range(n_sub)] + ["out"]
        ax.set_xticks(range(len(xl)))
        ax.set_xticklabels(xl, fontsize=7, rotation=90)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xlabel("consumer: sublayer (a = attention, m = MLP of layer l) and final output")
        ax.set_ylabel("source")
        S = att["block_size"]
        ax.set_title(f"{m}: {att['mode']}" + (f", S={S}" if att["mode"] == "block" else ""),
                     fontsize=10)
        if mat.shape[1] <= 14:  # small grids: print the weights
            for (j, s), v in np.ndenumerate(mat):
                if not math.isnan(v):
                    ax.text(s, j, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if v < 0.6 else "black")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    first = panels[0][1]
    fig.suptitle(f"depth attention (mean softmax weight over tokens), size {first['size']}, "
                 f"{int(first['tokens']):,} tokens", fontsize=10)
    save(fig, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", help="the sweep's out_dir")
    ap.add_argument("--attnres", default="build/attnres", help="the attnres binary")
    ap.add_argument("--size", help="size for the depth figures (default: the largest compute)")
    ap.add_argument("--budget", help="token budget for the depth figures (tokens or run suffix)")
    ap.add_argument("--batches", type=int, default=4,
                    help="validation batches for `inspect attention` (default 4)")
    ap.add_argument("--plots", help="output directory (default OUT_DIR/plots)")
    args = ap.parse_args()

    with open(os.path.join(args.out_dir, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(args.out_dir, "fits.json")) as f:
        fits = json.load(f)
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    plots = args.plots or os.path.join(args.out_dir, "plots")
    os.makedirs(plots, exist_ok=True)

    plot_loss_vs_compute(rows, fits, modes, os.path.join(plots, "loss_vs_compute.png"))
    plot_loss_curves(rows, modes, args.out_dir, os.path.join(plots, "loss_curves.png"))
    point = pick_point(rows, args.size, args.budget)
    if point is None:
        print("plot_sweep.py: no completed run for the depth figures", file=sys.stderr)
        return 1
    runs = point_runs(rows, point, modes)
    plot_depth_stats(runs, modes, args.out_dir, os.path.join(plots, "depth_stats.png"))
    plot_depth_attention(runs, args.out_dir, args.attnres, args.batches,
                         os.path.join(plots, "depth_attention.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
