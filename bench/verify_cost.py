"""python -m bench.verify_cost: what verifying M tokens in one forward costs, against one token.

For each model, thread count, weight layout and kernel of npspec.kernels.registry (compiled-panels with the fast extra), the
median time t(M) of
one cached forward over M = 1..16 new tokens after a `--context`-token prefix, and
v(M) = t(M) / t(1), the median over passes that time every M of every kernel in turn (time_sweeps), so that a read
rate that drifts during the sweep moves t(1) as much as t(16), and every kernel alike. Next to it the roofline
measured in the same run:
t_roof(M) = max(weight bytes / read bandwidth, FLOPs(M) / GEMM peak), the best a forward could do if it streamed the
weights once at full bandwidth and computed at full GEMM speed; the read bandwidth is the best
measured (common.best_read_rate: the probe, or the fastest forward's own rate), so no kernel sits
above it. Speculative decoding pays only where v(gamma + 1) stays well below gamma + 1.
Layouts: "column-major", as every npspec Model stores its block matrices (so each column panel
is contiguous), timed with every kernel; "row-major", the matrices as in the file, timed with
"gemv-rows" and "gemm" on a row-major copy of the parameters (bench.models.row_major), through
npspec.model.gpt2.gpt2 directly. Invariant kernels run with per-row attention, the others with masked
attention, as Model.forward and Model.prefill do, and BLAS runs as a Model runs it (npspec.kernels.blas: one
thread under a panel kernel). vs_ar divides by the smallest t(1) of the model and thread count: the
fastest one-token forward npspec has.

Writes verify_cost.csv/.md (every point), verify_cost_summary.csv/.md (t(1), v(5) and the
roofline fraction per model, threads, layout and kernel) and verify_cost.png (`--replot --out FOLDER` redraws
FOLDER's from its verify_cost.csv, timing nothing).
"""

import argparse
import sys
import time

import numpy as np

from npspec.model.gpt2 import attention, attention_masked, gpt2
from npspec.kernels.blas import BlasThreads
from npspec.kernels.compiled import CompiledPanels
from npspec.kernels.registry import REGISTRY, names

from . import common, models
from .figures import verify_axes
from .report import curves_of

FULL_MODELS = ["shipped:target", "random:distilgpt2", "random:gpt2", "random:gpt2-medium", "random:gpt2-large"]
QUICK_MODELS = ["shipped:target", "random:distilgpt2"]
KERNELS = tuple(k for k in names(codes=False) if REGISTRY[k].available())  # compiled-panels: with the fast extra
LAYOUT_KERNELS = {"row-major": ("gemv-rows", "gemm"), "column-major": KERNELS}  # timed first: row-major


def time_forward(model, m, repeats, context, forward=None):
    """Median seconds of one forward over m new tokens after `context` cached ones (then rolled back): time_sweep
    over the one row count m.

    forward(ids, cache): default `model.forward` (the model's kernel and threads). The cached
    prefix is filled once with `model.prefill`.
    """
    seconds, _ = time_sweep(model, [m], repeats, context, forward)
    return seconds[m]


def time_sweep(model, ms, repeats, context, forward=None):  # -> ({m: median seconds}, {m: median t(m) / t(ms[0])})
    """Forwards over m new tokens for every m in `ms`, timed in turn: after one untimed pass, each of `repeats` passes
    times one forward for every m (after `context` cached tokens, rolled back after each), so that a read rate that
    drifts during the sweep (a virtual machine's host: bench/results/kernels-by-cpu/README.md) moves every m alike instead
    of the last ones. Returns the median seconds of each m, and the median over passes of t(m) / t(ms[0]) in the same
    pass (v(M) when ms[0] is 1). forward(ids, cache): default `model.forward`. time_sweeps with one forward."""
    return time_sweeps(model, ms, repeats, context, {None: forward or model.forward})[None]


PAUSE = 0.5  # seconds before each forward's part of a pass when several are swept in turn (time_sweeps): a BLAS
# kernel's threads spin for a while after its forwards, on the cores the next kernel's threads need (npspec.kernels.probe)


def time_sweeps(model, ms, repeats, context, forwards, pause=PAUSE):
    """time_sweep for several forwards at once, in turn: each pass times every forward of `forwards` ({key:
    forward(ids, cache)}) over every m of `ms`, so that the host's drift during the sweeps moves every forward alike
    and "the fastest one-token forward" compares forwards timed in the same minutes. Swept one kernel after another
    on an Intel Sapphire Rapids, gpt2-large's one-token forward took 151.8 to 178.9 ms with five kernels and 128.7 ms
    with `gemm`, timed last, while plain decoding in the same run was fastest with compiled-panels
    (bench/results/kernels-by-cpu/README.md, section `intel2/`). With more than one forward, `pause` seconds pass
    before each forward's part of a pass. Returns {key: ({m: median seconds}, {m: median t(m) / t(ms[0])})}.
    One cache, its `context` tokens filled once by `model.prefill` on ONE BLAS thread, serves every forward: a
    threaded prefill left OpenBLAS's threads spinning into the first forwards timed after it (npspec.kernels.probe.
    time_forwards), which for a draft's one-token forwards was every pass (bench/results/kernels-by-cpu/README.md, section
    `intel3/`: distilgpt2 timed at 0.22 of a gpt2-large forward, and at 1.22 of a gpt2 one)."""
    cache = model.new_cache()
    model.prefill(np.random.default_rng(0).integers(0, model.config.n_vocab, context), cache, threads=1)
    ids = {m: np.random.default_rng(m).integers(0, model.config.n_vocab, m) for m in ms}
    passes = {key: [] for key in forwards}
    for p in range(repeats + 1):
        for key, forward in forwards.items():
            if len(forwards) > 1:
                time.sleep(pause)
            times = {}
            for m in ms:
                t0 = time.perf_counter()
                forward(ids[m], cache)
                times[m] = time.perf_counter() - t0
                cache.rollback(context)
            if p:  # the first pass warms up
                passes[key].append(times)
    return {key: ({m: common.median([t[m] for t in runs]) for m in ms},
                  {m: common.median([t[m] / t[ms[0]] for t in runs]) for m in ms}) for key, runs in passes.items()}


def kernel_forward(params, config, kernel, threads):
    """A forward(ids, cache) over `params` with `kernel` (npspec.model.gpt2.gpt2).

    Per-row attention if the kernel is invariant, masked attention otherwise (as Model.forward
    and Model.prefill pair them); BLAS with one thread under a panel kernel, else `threads` (as Model.forward).
    """
    spec = REGISTRY[kernel]
    linear = spec.build(threads)
    attend = attention if spec.invariant else attention_masked
    blas, blas_threads = BlasThreads(), spec.blas_threads(threads)

    def forward(ids, cache):
        with blas.limit(blas_threads):
            return gpt2(ids, params, config, cache, linear, attend)
    return forward


FMA_ROWS = 32  # rows of the product panels_fma_rate times: compute bound (4 B per weight read for 32 FMAs)


def panels_fma_rate(threads, rows=FMA_ROWS, repeats=5):
    """compiled-panels' own multiply-add rate, FMA/s: a product of `rows` rows over a [1024, 1024] matrix (4 MiB,
    shared out to `threads`), where its multiply-adds, not the weight read, bound it."""
    rng = np.random.default_rng(0)
    w = np.asfortranarray(rng.standard_normal((1024, 1024), dtype=np.float32))
    x = rng.standard_normal((rows, 1024), dtype=np.float32)
    kernel = CompiledPanels(threads)
    return rows * w.size / min(common.time_call(lambda: kernel(x, w), repeats))


def m_star(fma_rate, read_rate):
    """The row count where a kernel of `fma_rate` FMA/s reading float32 weights at `read_rate` bytes/s turns compute
    bound: M weights' FMAs take as long as reading the weight, M* = 4 fma_rate / read_rate."""
    return 4 * fma_rate / read_rate


def measure(model_names, threads, kernels, ms, repeats, context, quick=False):
    rows, summary, roof, fma_rate = [], [], {}, {}
    # compiled-panels' rate first, for every thread count, before any BLAS GEMM: timed after a GEMM at one thread and
    # another at two (the loop below), its two-thread product ran at 4.2 GFMA/s on an AMD Zen 4, a twenty-sixth of its
    # rate here (bench/results/kernels-by-cpu/README.md, section zen4-fma/)
    for n in threads if "compiled-panels" in kernels else ():
        with common.blas_threads(n):
            fma_rate[n] = panels_fma_rate(n)
            common.log(f"threads {n}: compiled-panels {fma_rate[n] / 1e9:.1f} GFMA/s at {FMA_ROWS} rows")
    for n in threads:
        with common.blas_threads(n):  # --quick: smaller probes (the 256 MiB array may sit partly in cache)
            roof[n] = ((common.read_bandwidth(1 << 28, 3), common.gemm_peak(1024, 3)) if quick
                       else (common.read_bandwidth(), common.gemm_peak()))
            common.log(f"threads {n}: read bandwidth {roof[n][0] / 1e9:.1f} GB/s, "
                       f"GEMM peak {roof[n][1] / 1e9:.0f} GFLOP/s")
    m5 = 5 if 5 in ms else ms[-1]
    pause = 0.0 if quick else PAUSE  # between kernels (time_sweeps); --quick: a smoke run, its figures not read
    for name in common.steps(model_names, "verify cost, model"):
        model = models.get(name)
        nbytes = models.matrix_bytes(model)
        t = {n: {} for n in threads}  # (layout, kernel) -> {M: median seconds}
        ratios = {n: {} for n in threads}  # (layout, kernel) -> {M: median over passes of t(M) / t(1)}
        timed = [(layout, k) for layout, allowed in LAYOUT_KERNELS.items() for k in kernels if k in allowed]
        params = {layout: (models.row_major if layout == "row-major" else models.column_major)(model.params)
                  for layout in dict.fromkeys(layout for layout, _ in timed)}  # arrays every kernel reads
        for n in threads:
            with common.blas_threads(n):  # every kernel in turn within each pass (time_sweeps)
                forwards = {(layout, k): kernel_forward(model.params if layout == "column-major" and REGISTRY[k].packs
                                                        else params[layout], model.config, k, n)  # panels held once
                            for layout, k in timed}
                for key, (ts, vs) in time_sweeps(model, ms, repeats, context, forwards, pause).items():
                    t[n][key], ratios[n][key] = ts, vs
                    common.log(f"{name} threads {n} {key[0]:12s} {key[1]:11s} t(1) {1e3 * ts[1]:8.2f} ms  "
                               + " ".join(f"{m}:{vs[m]:.2f}" for m in ms))
                del forwards  # compiled-panels' packed copy
        del params  # the row-major copy
        models.release()
        for n in threads:
            t_ar = min(v[1] for v in t[n].values())  # the fastest one-token forward
            bw, peak = common.best_read_rate(roof[n][0], nbytes, t_ar), roof[n][1]
            t_roof = {m: max(nbytes / bw, models.matmul_flops(model, m, context) / peak) for m in ms}
            # compiled-panels' own roofline: the same read, its own FMA rate (FMAs = FLOPs / 2)
            t_panels = {m: max(nbytes / bw, models.matmul_flops(model, m, context) / 2 / fma_rate[n]) for m in ms} \
                if n in fma_rate else {}
            for (layout, k), ts in t[n].items():
                common_cols = {"model": name, "threads": n, "layout": layout, "kernel": k,
                               "invariant": REGISTRY[k].invariant}
                for m in ms:
                    rows.append({**common_cols, "M": m, "seconds": ts[m], "v": ratios[n][layout, k][m],
                                 "vs_ar": ts[m] / t_ar,
                                 "roofline_seconds": t_roof[m], "roofline_v": t_roof[m] / t_roof[1],
                                 **({"panels_roofline_v": t_panels[m] / t_panels[1],
                                     "panels_m_star": m_star(fma_rate[n], bw)} if t_panels else {})})
                summary.append({**common_cols, "weight_MB": nbytes / 1e6, "t1_ms": 1e3 * ts[1], "tok_s": 1 / ts[1],
                                "read_GBps": bw / 1e9, "roofline_tok_s": 1 / t_roof[1], "of_roofline": t_roof[1] / ts[1],
                                f"v{m5}": ratios[n][layout, k][m5], f"v{m5}_vs_ar": ts[m5] / t_ar,
                                f"roofline_v{m5}": t_roof[m5] / t_roof[1],
                                **({"panels_m_star": m_star(fma_rate[n], bw)} if n in fma_rate else {})})
        del model
        models.release()
    return rows, summary, roof, fma_rate


def plot(rows, path):
    """verify_cost.png: one panel per model and thread count, each kernel's v(M) = t(M) / t(1) of the same kernel and
    layout, the bandwidth roofline and compiled-panels' max(1, M / M*) where it ran (bench.figures.verify_axes,
    as notes/figures/verify.png); None without matplotlib."""
    plt = common.pyplot()
    if plt is None:
        return None
    names = list(dict.fromkeys(r["model"] for r in rows))
    threads = sorted({int(r["threads"]) for r in rows})  # measure's ints, or verify_cost.csv's text (--replot)
    fig, axes = plt.subplots(len(threads), len(names), figsize=(3.2 * len(names) + 2.5, 3.0 * len(threads)),
                             squeeze=False, sharex=True, layout="constrained")
    for i, n in enumerate(threads):
        for j, name in enumerate(names):
            ax = axes[i][j]
            sel = [r for r in rows if r["model"] == name and int(r["threads"]) == n]
            verify_axes(ax, curves_of(sel), sel[0].get("panels_m_star"))
            ax.set_title(f"{name.split(':')[1]}, {n} thread{'s' * (n > 1)}", fontsize=9)
            ax.set_xlabel("")
            ax.set_ylabel("")
    fig.supxlabel("M, rows of the verify forward (gamma + 1)", fontsize=9)
    fig.supylabel("v(M) = t(M) / t(1) of the same kernel", fontsize=9)
    fig.legend(*axes[0][-1].get_legend_handles_labels(), loc="outside right upper", fontsize=7)
    return common.save_figure(fig, path)


def kernel_names(text):
    """Kernel names from "gemv-rows,gemm": a list of KERNELS (npspec.kernels.registry's, installed); else argparse.ArgumentTypeError."""
    names = text.split(",")
    bad = [k for k in names if k not in KERNELS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown kernels {bad}; pick from {list(KERNELS)}")
    return names


def options(ap):
    ap.add_argument("--models", default=None,
                    help=f"comma-separated (default: {','.join(FULL_MODELS)}; --quick: {','.join(QUICK_MODELS)})")
    ap.add_argument("--kernels", type=kernel_names, default=list(KERNELS), help="kernels to time (default: all)")
    ap.add_argument("--max-m", type=int, default=16, help="largest M (default 16)")
    ap.add_argument("--repeats", type=int, default=None, help="timed forwards per point (default 3; --quick: 2)")
    ap.add_argument("--context", type=int, default=32, help="cached tokens before the M new ones (default 32)")
    ap.add_argument("--replot", action="store_true",
                    help="times nothing: redraw --out's verify_cost.png from the verify_cost.csv already there")


def main(argv=None):
    run = common.command_line("bench.verify_cost", __doc__, argv, options)
    args = run.args
    if args.replot:
        rows, _ = common.read_table(run.out / "verify_cost.csv")
        print(plot(rows, run.out / "verify_cost.png"))
        return 0
    names = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else FULL_MODELS)
    repeats = args.repeats or (2 if args.quick else 3)
    rows, summary, roof, fma_rate = measure(names, run.threads, args.kernels, list(range(1, args.max_m + 1)), repeats,
                                         args.context, args.quick)
    for n, (bw, peak) in roof.items():
        run.meta[f"read_bandwidth_GBps_{n}_threads"] = f"{bw / 1e9:.1f}"
        run.meta[f"gemm_peak_GFLOPs_{n}_threads"] = f"{peak / 1e9:.0f}"
    for n, rate in fma_rate.items():
        run.meta[f"compiled_panels_GFMAs_{n}_threads"] = f"{rate / 1e9:.1f}"
    note = ("v = t(M) / t(1) of the same kernel and layout, the median over passes that time every M in turn; "
            "vs_ar = t(M) / the smallest t(1) of the model "
            "(the fastest one-token forward); "
            "roofline = max(weight bytes / read_GBps, FLOPs / GEMM peak), where read_GBps is the best read rate "
            "measured in this run (the bandwidth probe, or the model's fastest one-token forward if it read faster). "
            f"Median of {repeats} forwards after a warm-up, {args.context} cached tokens. "
            "panels_roofline_v: compiled-panels' own roofline, max(weight bytes / read_GBps, FMAs / its FMA rate "
            f"measured at {FMA_ROWS} rows); panels_m_star = 4 x that rate / read_GBps, the row count where it turns "
            "compute bound (the plot's vertical line).")
    return common.finish(run, [common.Table("verify_cost", rows, "Verify cost: one forward over M new tokens", note),
                               common.Table("verify_cost_summary", summary, "Verify cost summary", note)],
                         [plot(rows, run.out / "verify_cost.png")])


if __name__ == "__main__":
    sys.exit(main())
