"""python -m bench.figures [NAME ...] [--out DIR]: the pictures notes/ teach with, drawn from npspec and committed runs.

NAMES, each written to DIR/NAME.png (default notes/figures/):
  overlap   p, q, min(p, q) and the residual of walkthrough section 1's 3-token example (npspec.decode.sampling)
  quantized 1 - beta against bits, log scale, for round-to-nearest per-channel drafts of the shipped target, with the
            first-order law C / qmax(b) (notes/quantized.md) fitted from 3 to 8 bits
            (bench/results/quantized-epyc/quantized_beta.csv)
  verify    v(M) of every kernel against its OWN one-token forward, gpt2-large at 2 threads, with the bandwidth
            roofline v = 1 and the compiled kernel's max(1, M / M*) (bench/results/run_all-xeon-spr/verify_cost.csv)
  gap       each tree rule's exact E[drafts kept] over the ceiling of its own drafts (npspec.testing.gap.tree_ot_bound),
            at one node and over whole trees, every case of bench/results/gap-exact/gap_node.csv and gap_tree.csv
No timing runs here: every figure is drawn from fixed numbers or committed tables. Needs matplotlib (the bench extra).
"""

import argparse
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

from npspec.decode.sampling import residual

from . import common
from .report import verify_curves

OUT = Path(__file__).resolve().parent.parent / "notes" / "figures"
QUANTIZED = common.RESULTS / "quantized-epyc" / "quantized_beta.csv"
VERIFY_RUN = common.RESULTS / "run_all-xeon-spr"
GAP = common.RESULTS / "gap-exact"
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


def verify_axes(ax, curves, m_star=None):
    """Draw on `ax` each kernel's v(M) of `curves` (bench.report.curves_of), the bandwidth roofline v = 1 and, given
    compiled-panels' M*, its roofline max(1, M / M*) (and M* marked, if within the rows). Shared with bench.verify_cost's
    plot."""
    for key, v in curves.items():
        if key != "roofline":
            layout, kernel = key
            ax.plot(range(1, len(v) + 1), v, "o-", ms=3, label=kernel + (" (row-major)" if layout == "row-major" else ""))
    m = np.arange(1, len(curves["roofline"]) + 1)
    ax.plot(m, np.ones_like(m), "k-", lw=2, label="bandwidth roofline: v = 1")
    if m_star not in (None, ""):
        m_star = float(m_star)
        ax.plot(m, np.maximum(1, m / m_star), "k:", label=f"compiled kernel's roofline max(1, M / M*), M* = {m_star:.1f}")
        if m_star <= m[-1]:
            ax.axvline(m_star, color="grey", lw=0.8)
    ax.set_xlabel("M, rows of the verify forward (gamma + 1)")
    ax.set_ylabel("v(M) = t(M) / t(1) of the same kernel")


def verify(plt, run=VERIFY_RUN, model="random:gpt2-large", threads=2):
    curves, _ = verify_curves(model, threads, run)
    rows, _ = common.read_table(Path(run) / "verify_cost.csv")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    verify_axes(ax, curves, next(r["panels_m_star"] for r in rows if r["model"] == model))
    ax.set_title(f"{model.split(':')[-1]}, {threads} threads: {Path(run).name}")
    ax.legend(fontsize=7)
    return fig


def gap_points(table):
    """{rule: [(case label, E[kept], ceiling)]} of TABLE.csv in bench/results/gap-exact/ (gap_node or gap_tree), in the
    table's order, as Fractions; a label is the case and its k (node) or its branching per level (tree)."""
    rows, _ = common.read_table(GAP / f"{table}.csv")
    points = {}
    for r in rows:
        label = f"{r['case']}, " + (f"k = {r['k']}" if "k" in r else f"tree {r['tree']}")
        points.setdefault(r["rule"], []).append((label, Fraction(r["kept"]), Fraction(r["ceiling"])))
    return points


def gap(plt):
    fig, axes = plt.subplots(2, 1, figsize=(10, 10), layout="constrained")
    titles = {"gap_node": "one node of k drafts: P(a draft is kept) / its ceiling",
              "gap_tree": "whole trees: E[drafts kept] / its ceiling (a chain 1,1 adds block verification)"}
    for ax, (table, title) in zip(axes, titles.items()):
        points = gap_points(table)
        labels = list(dict.fromkeys(label for rule in points.values() for label, _, _ in rule))
        for i, (rule, rows) in enumerate(points.items()):
            x = [labels.index(label) + 0.1 * (i - 2) for label, _, _ in rows]
            ax.plot(x, [float(kept / ceiling) for _, kept, ceiling in rows], "os^vD"[i % 5], ms=5, label=rule)
        ax.axhline(1, color="k", lw=1.5, label="ceiling C(T) of the rule's own drafts (tree_ot_bound)")
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_ylabel("kept / ceiling (exact)")
        ax.set_title(title, fontsize=9)
    fig.legend(*axes[1].get_legend_handles_labels(), loc="outside upper center", ncols=2, fontsize=8)
    return fig


NAMES = {"overlap": overlap, "quantized": quantized, "verify": verify, "gap": gap}


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
