"""python -m bench.figures [NAME ...] [--out DIR]: the pictures notes/ teach with, drawn from npspec and committed runs.

NAMES, each written to DIR/NAME.png (default notes/figures/):
  overlap   p, q, min(p, q) and the residual of walkthrough section 1's 3-token example (npspec.decode.sampling)
  quantized 1 - beta against bits, log scale, for round-to-nearest per-channel drafts of the shipped target, with the
            first-order law C / qmax(b) (notes/quantized.md) fitted from 3 to 8 bits
            (bench/results/quantized-epyc/quantized_beta.csv)
  verify    v(M) of every kernel against its OWN one-token forward, gpt2-large at 2 threads, with the bandwidth
            roofline v = 1 and the compiled kernel's max(1, M / M*) (bench/results/run_all-xeon-spr/verify_cost.csv)
No timing runs here: every figure is drawn from fixed numbers or committed tables. Needs matplotlib (the bench extra).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from npspec.decode.sampling import residual

from . import common
from .report import verify_curves

OUT = Path(__file__).resolve().parent.parent / "notes" / "figures"
QUANTIZED = common.RESULTS / "quantized-epyc" / "quantized_beta.csv"
VERIFY_RUN = common.RESULTS / "run_all-xeon-spr"
P, Q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.5, 0.3])  # walkthrough section 1: target, draft


def qmax(bits):  # the largest code of a symmetric b-bit grid (npspec.sources.quantize)
    return 2 ** (bits - 1) - 1


def overlap(plt):
    """Bars of p, q, min(p, q) (kept proposals: beta = 0.7) and (1 - beta) * residual (what a rejection emits)."""
    keep = np.minimum(P, Q)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    x = np.arange(3)
    axes[0].bar(x - 0.2, P, 0.4, label="p (target)")
    axes[0].bar(x + 0.2, Q, 0.4, label="q (draft)")
    axes[0].set_title("p and q")
    axes[1].bar(x, keep, 0.6, label=f"min(p, q): kept drafts, sum {keep.sum():.1f}")
    axes[1].bar(x, (1 - keep.sum()) * residual(P, Q), 0.6, bottom=keep, label="(1 - beta) residual: after a rejection")
    axes[1].set_title("what comes out: min(p, q) + (1 - beta) residual = p")
    for ax in axes:
        ax.set_xticks(x, [f"token {i}" for i in x])
        ax.legend(fontsize=8)
    axes[0].set_ylabel("probability")
    return fig


def quantized_points(path=QUANTIZED, column="beta_t1.0"):
    """[(bits, 1 - beta)] of the shipped target's per-channel round-to-nearest schemes, and C of the law C / qmax
    fitted (a geometric mean of (1 - beta) qmax) over 3 to 8 bits."""
    rows, _ = common.read_table(path)
    points = sorted((int(r["bits"]), 1 - float(r[column])) for r in rows
                    if r["draft"] == "shipped target" and r["granularity"] == "ch" and r["method"] == "rtn"
                    and r["emb"] == "False")
    fit = [(b, lost) for b, lost in points if 3 <= b <= 8]
    return points, float(np.exp(np.mean([np.log(lost * qmax(b)) for b, lost in fit])))


def quantized(plt):
    fig, ax = plt.subplots(figsize=(6, 4))
    for column, label in (("beta_t1.0", "temperature 1"), ("beta_greedy", "greedy")):
        points, c = quantized_points(column=column)
        bits = [b for b, _ in points]
        line = ax.semilogy(bits, [lost for _, lost in points], "o", label=f"1 - beta, {label}")[0]
        ax.semilogy(bits, [c / qmax(b) for b in bits], "--", color=line.get_color(), label=f"{c:.2f} / qmax(b)")
    ax.set_xlabel("bits b (per-channel round to nearest; qmax = 2^(b-1) - 1)")
    ax.set_ylabel("1 - beta (log scale)")
    ax.set_title("one bit fewer: 1 - beta times qmax(b) / qmax(b - 1)")
    ax.legend(fontsize=8)
    return fig


def verify(plt, run=VERIFY_RUN, model="random:gpt2-large", threads=2):
    curves, _ = verify_curves(model, threads, run)
    rows, _ = common.read_table(Path(run) / "verify_cost.csv")
    m_star = next(float(r["panels_m_star"]) for r in rows if r["model"] == model)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, v in curves.items():
        if key != "roofline":
            layout, kernel = key
            ax.plot(range(1, len(v) + 1), v, "o-", ms=3, label=kernel + (" (row-major)" if layout == "row-major" else ""))
    m = np.arange(1, len(curves["roofline"]) + 1)
    ax.plot(m, np.ones_like(m), "k-", lw=2, label="bandwidth roofline: v = 1")
    ax.plot(m, np.maximum(1, m / m_star), "k:", label=f"compiled kernel's roofline max(1, M / M*), M* = {m_star:.1f}")
    ax.set_xlabel("M, rows of the verify forward (gamma + 1)")
    ax.set_ylabel("v(M) = t(M) / t(1) of the same kernel")
    ax.set_title(f"{model.split(':')[-1]}, {threads} threads: {Path(run).name}")
    ax.legend(fontsize=7)
    return fig


NAMES = {"overlap": overlap, "quantized": quantized, "verify": verify}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.figures", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", choices=[[], *NAMES], default=[], metavar="NAME",
                    help=f"figures to draw, of {', '.join(NAMES)} (default: all)")
    ap.add_argument("--out", default=str(OUT), help="the folder for NAME.png (default: %(default)s)")
    args = ap.parse_args(argv)
    plt = common.pyplot()
    if plt is None:
        print("bench.figures: error: matplotlib is not installed (pip install -e .[bench])", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names or NAMES:
        print(common.save_figure(NAMES[name](plt), out / f"{name}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
