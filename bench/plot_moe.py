#!/usr/bin/env python3
"""Plots bench/moe_bench.py's CSV: per shape, our tuned best and our untuned choice as a
ratio of the baseline's time (above 1 = ours faster), one panel per format pair and
activation that has a baseline.

  python3 bench/plot_moe.py compare.csv moe_bench.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["base_us"] not in ("", "None")]
    panels = sorted({(r["pair"], r["act"]) for r in rows})
    if not panels:
        print("plot_moe: no row with a baseline", file=sys.stderr)
        return 1
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
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
