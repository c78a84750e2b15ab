#!/usr/bin/env python3
"""Plots bench/moe_bench.py's CSV: per shape, our tuned best and our untuned choice as a
ratio of the baseline's time (above 1 = ours faster), one panel per format pair and
activation that has a baseline, and when the CSV has fp8-block rows one more panel per
activation: our fp8-block against our fp8 per tensor on the same shape (tuned best over
tuned best; the kernel issue's target is 0.9x). With --fp4: per decode shape, each FP4
pair's time as a multiple of the measured bytes floor (a copy of its weight and scale
bytes), one panel per activation, with the 1.5x target. With --fp4-prefill: per
prefill shape, mxfp4 x mxfp8's TFLOP/s as a fraction of our fp8 per tensor's (tuned best
over tuned best, the same run), one panel per activation, with the 0.8x target.

  python3 bench/plot_moe.py [--fp4 | --fp4-prefill] compare.csv out.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_fp4(path, out):
    rows = [r for r in csv.DictReader(open(path))
            if r["floor_us"] not in ("", "None") and "decode" in r["shape"]]
    acts = sorted({r["act"] for r in rows})
    pairs = sorted({r["pair"] for r in rows})
    if not rows:
        print("plot_moe: no FP4 decode row with a floor", file=sys.stderr)
        return 1
    fig, axes = plt.subplots(1, len(acts), figsize=(5.5 * len(acts), 4), squeeze=False)
    for ax, act in zip(axes[0], acts):
        shapes = sorted({r["shape"] for r in rows if r["act"] == act})
        width = 0.8 / len(pairs)
        for j, pair in enumerate(pairs):
            by_shape = {r["shape"]: r for r in rows if r["act"] == act and r["pair"] == pair}
            xs = [i + (j - (len(pairs) - 1) / 2) * width for i in range(len(shapes))]
            ys = [float(by_shape[s]["best_us"]) / float(by_shape[s]["floor_us"])
                  if s in by_shape else 0 for s in shapes]
            ax.bar(xs, ys, width=width, label=pair)
        ax.axhline(1.5, color="red", linewidth=0.8, linestyle="--", label="target 1.5x")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(range(len(shapes))))
        ax.set_xticklabels(shapes)
        ax.set_title(f"FP4 decode, {act}", fontsize=9)
        ax.set_ylabel("time / copy of the weight + scale bytes")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("FP4 moe_gemm decode on the H200 (median, L2 flushed; floor in the same run)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return 0


def plot_fp4_prefill(path, out):
    best = {(r["shape"], r["pair"], r["act"]): float(r["best_us"])
            for r in csv.DictReader(open(path)) if r["best_us"] not in ("", "None")}
    keys = [(s, a) for (s, p, a) in best if p == "mxfp4xmxfp8" and "decode" not in s and
            (s, "fp8xfp8", a) in best]
    if not keys:
        print("plot_moe: no prefill shape with both mxfp4xmxfp8 and fp8xfp8", file=sys.stderr)
        return 1
    acts = sorted({a for _, a in keys})
    fig, axes = plt.subplots(1, len(acts), figsize=(5 * len(acts), 4), squeeze=False)
    for ax, act in zip(axes[0], acts):
        shapes = sorted(s for s, a in keys if a == act)
        # Same flops per shape: the time ratio is the TFLOP/s ratio.
        ratio = [best[(s, "fp8xfp8", act)] / best[(s, "mxfp4xmxfp8", act)] for s in shapes]
        ax.bar(list(range(len(shapes))), ratio, width=0.6, label="mxfp4 x mxfp8, tuned best")
        ax.axhline(0.8, color="red", linewidth=0.8, linestyle="--", label="target 0.8x")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(range(len(shapes))))
        ax.set_xticklabels(shapes)
        ax.set_ylim(0, 1.1)
        ax.set_title(f"mxfp4 x mxfp8 {act} vs our fp8 per tensor", fontsize=9)
        ax.set_ylabel("TFLOP/s / our fp8's TFLOP/s")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("FP4 moe_gemm prefill on the H200 (median, L2 flushed, one run)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--fp4":
        return plot_fp4(sys.argv[2], sys.argv[3])
    if len(sys.argv) == 4 and sys.argv[1] == "--fp4-prefill":
        return plot_fp4_prefill(sys.argv[2], sys.argv[3])
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["base_us"] not in ("", "None")]
    panels = sorted({(r["pair"], r["act"]) for r in rows})
    if not panels:
        print("plot_moe: no row with a baseline", file=sys.stderr)
        return 1
    every = list(csv.DictReader(open(sys.argv[1])))
    ours = {(r["shape"], r["pair"], r["act"]): float(r["best_us"]) for r in every
            if r["best_us"] not in ("", "None")}
    block_acts = sorted({a for (_, p, a) in ours if p == "fp8-blockxfp8-block"})
    fig, axes = plt.subplots(1, len(panels) + len(block_acts),
                             figsize=(4.2 * (len(panels) + len(block_acts)), 4), squeeze=False)
    for ax, act in zip(axes[0][len(panels):], block_acts):
        shapes = [s for (s, p, a) in ours if p == "fp8-blockxfp8-block" and a == act and
                  (s, "fp8xfp8", act) in ours]
        ratio = [ours[(s, "fp8xfp8", act)] / ours[(s, "fp8-blockxfp8-block", act)]
                 for s in shapes]
        x = range(len(shapes))
        ax.bar(list(x), ratio, width=0.6, color="tab:green", label="fp8-block, tuned best")
        ax.axhline(0.9, color="red", linewidth=0.8, linestyle="--", label="target 0.9x")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(x))
        ax.set_xticklabels(shapes, rotation=30)
        ax.set_title(f"fp8-block {act}\nvs our fp8 per tensor", fontsize=9)
        ax.set_ylabel("speed relative to per-tensor fp8")
        ax.legend(fontsize=8, loc="lower right")
    for ax, (pair, act) in zip(axes[0], panels):
        rs = [r for r in rows if r["pair"] == pair and r["act"] == act]
        shapes = [r["shape"] for r in rs]
        best = [float(r["base_us"]) / float(r["best_us"]) for r in rs]
        untuned = [float(r["base_us"]) / float(r["untuned_us"]) for r in rs]
        x = range(len(shapes))
        ax.bar([i - 0.2 for i in x], best, width=0.4, label="cubist, tuned best")
        ax.bar([i + 0.2 for i in x], untuned, width=0.4, label="cubist, untuned choice")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(x))
        ax.set_xticklabels(shapes, rotation=30)
        ax.set_title(f"{pair} {act}\nvs {rs[0]['baseline']}", fontsize=9)
        ax.set_ylabel("speed-up over baseline")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("moe_gemm on the H200 (median, L2 flushed; same process as the baselines)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
