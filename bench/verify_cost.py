"""python -m bench.verify_cost: what verifying M tokens in one forward costs, against one token.

For each model, BLAS thread count, weight layout and matmul strategy of npspec.model, the median time t(M) of one cached forward over M = 1..16 new tokens after a
`--context`-token prefix, and v(M) = t(M) / t(1). Next to it the roofline measured in the same
run: t_roof(M) = max(weight bytes / read bandwidth, FLOPs(M) / GEMM peak), the best a forward
could do if it streamed the weights once at full bandwidth and computed at full GEMM speed.
Speculative decoding pays only where v(gamma + 1) stays well below gamma + 1.
Layouts: "C", the matrices as loaded (row-major), timed with "rows" (npspec's invariant
default on them) and "gemm"; "panel" (npspec.model.panel_layout: column-major, so each column
panel is contiguous), timed with every strategy. vs_ar divides by t(1) of the invariant default
of the panel layout ("panels"), the AR decode the benchmarks use.

Writes verify_cost.csv/.md (every point), verify_cost_summary.csv/.md (t(1), v(5) and the
roofline fraction per model, threads and strategy) and verify_cost.png.
"""

import sys

import numpy as np

from npspec.model import INVARIANT_MATMULS, MATMULS, gpt2, panel_layout

from . import common, models

FULL_MODELS = ["shipped:target", "random:distilgpt2", "random:gpt2", "random:gpt2-medium", "random:gpt2-large"]
QUICK_MODELS = ["shipped:target", "random:distilgpt2"]


def time_forward(model, m, matmul, repeats, context):
    """Median seconds of one forward over m new tokens after `context` cached ones (then rolled back).

    matmul: a strategy of npspec.model.MATMULS, or None for what the model decodes with (`model.matmul`,
    else the layout's invariant default).
    """
    matmul = matmul or getattr(model, "matmul", None)
    cache = model.new_cache()
    rng = np.random.default_rng(m)
    model.forward(rng.integers(0, model.config.n_vocab, context), cache, invariant=False)
    ids = rng.integers(0, model.config.n_vocab, m)
    invariant = matmul is None or matmul in INVARIANT_MATMULS  # None: the model's invariant default

    def once():
        gpt2(ids, model.params, model.config, cache, invariant=invariant, matmul=matmul)
        cache.rollback(context)

    return common.median(common.time_call(once, repeats, warmup=1))


C_STRATEGIES = ("rows", "gemm")  # timed on the matrices as loaded (row-major)


def measure(model_names, threads, strategies, ms, repeats, context, log, quick=False):
    rows, summary, roof = [], [], {}
    for n in threads:
        with common.blas_threads(n):  # --quick: smaller probes (the 256 MiB array may sit partly in cache)
            roof[n] = ((common.read_bandwidth(1 << 28, 3), common.gemm_peak(1024, 3)) if quick
                       else (common.read_bandwidth(), common.gemm_peak()))
            log(f"threads {n}: read bandwidth {roof[n][0] / 1e9:.1f} GB/s, GEMM peak {roof[n][1] / 1e9:.0f} GFLOP/s")
    m5 = 5 if 5 in ms else ms[-1]
    for name in model_names:
        model = models.get(name, layout="C")
        nbytes = models.matrix_bytes(model)
        t = {n: {} for n in threads}
        for layout in ("C", "panel"):
            if layout == "panel":
                panel_layout(model.params)  # in place, one matrix at a time
            for n in threads:
                with common.blas_threads(n):
                    for s in strategies:
                        if layout == "C" and s not in C_STRATEGIES:
                            continue
                        t[n][layout, s] = {m: time_forward(model, m, s, repeats, context) for m in ms}
                        log(f"{name} threads {n} {layout:5s} {s:12s} t(1) {1e3 * t[n][layout, s][1]:8.2f} ms  "
                            + " ".join(f"{m}:{t[n][layout, s][m] / t[n][layout, s][1]:.2f}" for m in ms))
        for n in threads:
            bw, peak = roof[n]
            t_roof = {m: max(nbytes / bw, models.matmul_flops(model, m, context) / peak) for m in ms}
            t_ar = t[n]["panel", "panels"][1] if ("panel", "panels") in t[n] else min(v[1] for v in t[n].values())
            for (layout, s), ts in t[n].items():
                common_cols = {"model": name, "threads": n, "layout": layout, "strategy": s,
                               "invariant": s in INVARIANT_MATMULS}
                for m in ms:
                    rows.append({**common_cols, "M": m, "seconds": ts[m], "v": ts[m] / ts[1], "vs_ar": ts[m] / t_ar,
                                 "roofline_seconds": t_roof[m], "roofline_v": t_roof[m] / t_roof[1]})
                summary.append({**common_cols, "weight_MB": nbytes / 1e6, "t1_ms": 1e3 * ts[1], "tok_s": 1 / ts[1],
                                "roofline_tok_s": 1 / t_roof[1], "of_roofline": t_roof[1] / ts[1],
                                f"v{m5}": ts[m5] / ts[1], f"v{m5}_vs_ar": ts[m5] / t_ar,
                                f"roofline_v{m5}": t_roof[m5] / t_roof[1]})
        del model
        models.release()
    return rows, summary, roof


def plot(rows, path):
    plt = common.pyplot()
    if plt is None:
        return None
    names = list(dict.fromkeys(r["model"] for r in rows))
    threads = sorted({r["threads"] for r in rows})
    fig, axes = plt.subplots(len(threads), len(names), figsize=(3.2 * len(names), 3.0 * len(threads)),
                             squeeze=False, sharex=True)
    for i, n in enumerate(threads):
        for j, name in enumerate(names):
            ax = axes[i][j]
            sel = [r for r in rows if r["model"] == name and r["threads"] == n]
            for key in dict.fromkeys((r["layout"], r["strategy"]) for r in sel):
                pts = [r for r in sel if (r["layout"], r["strategy"]) == key]
                ax.plot([r["M"] for r in pts], [r["vs_ar"] for r in pts], marker=".", label=f"{key[1]} ({key[0]})")
            pts = [r for r in sel if r["strategy"] == sel[0]["strategy"]]
            ax.plot([r["M"] for r in pts], [r["roofline_v"] for r in pts], "k--", label="roofline")
            ax.plot([1, 16], [1, 16], ":", color="grey", lw=0.8, label="M x t(1)")
            ax.set_title(f"{name.split(':')[1]}, {n} thread{'s' * (n > 1)}", fontsize=9)
            ax.set_ylim(0, 8)
            if j == 0:
                ax.set_ylabel("t(M) / t_panels(1)")
            if i == len(threads) - 1:
                ax.set_xlabel("M new tokens")
    axes[0][0].legend(fontsize=7)
    common.save_figure(fig, path)
    return path


def main(argv=None):
    ap = common.parser("bench.verify_cost", __doc__.split("\n")[0])
    ap.add_argument("--models", default=None,
                    help=f"comma-separated (default: {','.join(FULL_MODELS)}; --quick: {','.join(QUICK_MODELS)})")
    ap.add_argument("--strategies", default=",".join(MATMULS), help="matmul strategies (default: all)")
    ap.add_argument("--max-m", type=int, default=16, help="largest M (default 16)")
    ap.add_argument("--repeats", type=int, default=None, help="timed forwards per point (default 3; --quick: 2)")
    ap.add_argument("--context", type=int, default=32, help="cached tokens before the M new ones (default 32)")
    args = ap.parse_args(argv)
    out = common.output_dir(args)
    names = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else FULL_MODELS)
    strategies = args.strategies.split(",")
    bad = [s for s in strategies if s not in MATMULS]
    if bad:
        ap.error(f"unknown strategies {bad}; pick from {list(MATMULS)}")
    repeats = args.repeats or (2 if args.quick else 3)
    meta = common.machine_info()
    rows, summary, roof = measure(names, common.thread_counts(args), strategies, list(range(1, args.max_m + 1)),
                                  repeats, args.context, lambda s: print(s, file=sys.stderr, flush=True), args.quick)
    for n, (bw, peak) in roof.items():
        meta[f"read_bandwidth_GBps_{n}_threads"] = f"{bw / 1e9:.1f}"
        meta[f"gemm_peak_GFLOPs_{n}_threads"] = f"{peak / 1e9:.0f}"
    meta["command"] = "python -m bench.verify_cost " + " ".join(argv if argv is not None else sys.argv[1:])
    note = ("v = t(M) / t(1) of the same strategy and layout; vs_ar = t(M) / t(1) of \"panels\" on the panel layout "
            "(the AR decode of the benchmarks); "
            "roofline = max(weight bytes / read bandwidth, FLOPs / GEMM peak), both measured in this run. "
            f"Median of {repeats} forwards after a warm-up, {args.context} cached tokens.")
    common.write_table(out, "verify_cost", rows, meta, "Verify cost: one forward over M new tokens", note)
    common.write_table(out, "verify_cost_summary", summary, meta, "Verify cost summary", note)
    png = plot(rows, out / "verify_cost.png")
    print(f"wrote {out / 'verify_cost.csv'}, {out / 'verify_cost_summary.md'}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
