"""python -m bench.panels: how the compiled kernel "compiled-panels" is laid out and shares its panels, measured.

On one GPT-2 block's four matrices (default gpt2-large's; --quick: gpt2's), repeated to 3 blocks so that they do not
sit in the cache, for M = 1, 2, 3, 4, 5, 6, 8, 16 rows: the best-of-`--repeats` seconds of
  * the kernel itself (npspec.kernels.compiled.CompiledPanels: numba's prange with the threading layer `--layer`, which
    numba loads once per process, so each layer is its own run) with panels of 16 columns (the register blocks of
    256-bit vectors, compiled.blocks) and of 32, 64 (compiled.PANEL) and 96 columns (the 512-bit tiles);
  * the same compiled loop over 64-column panels on npspec's own worker threads (npspec.kernels.workers.Workers, what the
    kernel ran before it took numba's threads: `workers-64`);
  * OpenBLAS' GEMV over the same matrices for one row (the bandwidth reference, BLAS with the run's threads).
And (table panels_split) one-row products over matrices of 192 KiB to 4 MiB, as many copies as fill 400 MB (40 MB
with --quick) so that they come from memory, each product one call on the calling thread or cut into the run's
threads' runs (with more than one thread): where sharing a matrix out starts to pay (npspec.kernels.compiled.SPLIT_BYTES).
The compiled configurations run with BLAS at one thread and are interleaved per repeat, so a change in the machine's
load hits all alike; the GEMV runs after them, in its own pass, because OpenBLAS' idle threads spin for a while
after a call and would take a core from the next configuration.

And (table panels_codes) compiled-quant's two loop nests over the same matrices quantized int8-ch and int4-g64
(npspec.sources.quantize; codes one a byte and two a byte): the 512-bit tiles and the 256-bit register blocks
(npspec.kernels.compiled.qtiles), for M = 1, 2, 3, 4, 5, 8 rows, beside compiled-panels on the host's panels over the
float32 matrices, interleaved per repeat; `--codes` measures that table alone. Writes panels.csv/.md,
panels_split.csv/.md and panels_codes.csv/.md; bench/results/kernels-by-cpu/README.md says what was chosen and why.
"""

import sys
import time

import numpy as np

from npspec.kernels import compiled
from npspec.kernels.workers import Workers, run_cuts
from npspec.sources import SHAPES
from npspec.sources.quantize import parse_scheme, quantize_tensor

from . import common

ROWS = (1, 2, 3, 4, 5, 6, 8, 16)
WIDTHS = (16, 32, 64, 96)


def block_matrices(shape, copies=3, seed=0):
    """[d_in, d_out] column-major float32 matrices of `copies` GPT-2 blocks of `shape` (c_attn, c_proj, c_fc, c_proj)."""
    d = SHAPES[shape].n_embd
    rng = np.random.default_rng(seed)
    shapes = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * copies
    return [np.asfortranarray(rng.standard_normal(s, dtype=np.float32)) for s in shapes]


def products(kernel):  # a linear(x, w) -> f(xs, ws) over the matrices
    return lambda xs, ws: [kernel(x, w) for x, w in zip(xs, ws)]


def configurations(threads, layer, ws):
    """{name: f(xs, ws)} of every compiled way timed (module docstring); layer: numba's threading layer."""
    try:
        out = {f"{layer}-{p}": products(compiled.CompiledPanels(threads, panel=p, layers=(layer,))) for p in WIDTHS}
        out[f"{layer}-64"]([np.zeros((1, ws[0].shape[0]), np.float32)], ws[:1])  # loads the layer (or raises)
    except Exception as e:  # the layer may be missing here (no TBB, no OpenMP runtime)
        common.log(f"{layer}: not available here ({type(e).__name__}: {e})")
        out = {}
    out["workers-64"] = workers_products(threads)
    return out


def workers_products(threads):
    """The compiled loop over each matrix's 64-column panels, in `threads` runs of whole panels on npspec's own
    workers (the first `threads - 1` runs on the workers, the last on the calling thread): f(xs, ws)."""
    product, workers, kernel = compiled.compiled_product(), Workers(threads - 1), compiled.CompiledPanels(1)

    def run(xs, ws):
        out = []
        for x, w in zip(xs, ws):
            panels = kernel.entry(w)[1]
            y = np.empty((x.shape[0], w.shape[1]), np.float32)
            cuts = run_cuts(len(panels), threads)
            runs = list(zip(cuts, cuts[1:]))[::-1]
            workers.run([lambda a=a, b=b: product(x, panels, y, a, b) for a, b in runs])
            out.append(y)
        return out
    return run


def best_of(runs, xs, ws, repeats):
    """{name: best seconds} of each f(xs, ws) in `runs`, after one untimed call each, interleaved per repeat."""
    for f in runs.values():
        f(xs, ws)
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, f in runs.items():
            start = time.perf_counter()
            f(xs, ws)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def measure(shape, threads, repeats, layer=compiled.LAYERS[0]):
    ws = block_matrices(shape)
    nbytes = sum(w.nbytes for w in ws)
    rng = np.random.default_rng(1)
    runs = configurations(threads, layer, ws)
    rows = []
    for m in common.steps(ROWS, "rows"):
        xs = [rng.standard_normal((m, w.shape[0]), dtype=np.float32) for w in ws]
        with common.blas_threads(1):
            best = best_of(runs, xs, ws, repeats)
        if m == 1:
            with common.blas_threads(threads):
                best.update(best_of({"blas-gemv": lambda xs, ws: [x @ w for x, w in zip(xs, ws)]}, xs, ws, repeats))
        for name, s in best.items():
            rows.append({"shape": shape, "threads": threads, "M": m, "way": name, "ms": 1e3 * s,
                         "GBps": nbytes / s / 1e9, "GFMAps": m * nbytes / 4 / s / 1e9,
                         "load_average": common.load_average()})
            common.log(f"M={m} {name:18s} {1e3 * s:8.2f} ms {nbytes / s / 1e9:6.1f} GB/s")
    return rows


SPLIT_SHAPES = ((128, 384), (256, 768), (512, 512), (384, 1152), (768, 768), (512, 1536), (1024, 1024))


def measure_split(threads, repeats, total_bytes):
    """Rows of the panels_split table (module docstring): for each [d_in, d_out] of SPLIT_SHAPES, the best-of-`repeats`
    seconds per product of one row over copies of such a matrix, in one call and cut into `threads` (> 1) runs."""
    kernel, rng, rows = compiled.CompiledPanels(threads), np.random.default_rng(2), []
    for d_in, d_out in SPLIT_SHAPES:
        ws = [np.asfortranarray(rng.standard_normal((d_in, d_out), dtype=np.float32))
              for _ in range(min(4096, max(1, total_bytes // (4 * d_in * d_out))))]
        x, y = rng.standard_normal((1, d_in), dtype=np.float32), np.empty((1, d_out), np.float32)
        panels = [kernel.entry(w)[1] for w in ws]
        cuts = np.array(run_cuts(len(panels[0]), threads), dtype=np.int64)
        ways = {"one call": lambda xs, ps: [kernel.product(x, p, y, 0, len(p)) for x, p in zip(xs, ps)],
                f"{threads} runs": lambda xs, ps: [kernel.runs(x, p, y, cuts, threads) for x, p in zip(xs, ps)]}
        with common.blas_threads(1):
            best = best_of(ways, [x] * len(panels), panels, repeats)
        for way, s in best.items():
            rows.append({"d_in": d_in, "d_out": d_out, "KiB": 4 * d_in * d_out // 1024, "threads": threads, "way": way,
                         "us": 1e6 * s / len(panels), "load_average": common.load_average()})
            common.log(f"{d_in}x{d_out} {way:8s} {1e6 * s / len(panels):8.1f} us a product")
        kernel.packed.clear()
    return rows


CODE_ROWS = (1, 2, 3, 4, 5, 8)
CODE_SCHEMES = ("int8-ch", "int4-g64")


def measure_codes(shape, threads, repeats):
    """Rows of the panels_codes table (module docstring): best-of-`repeats` ms of each way over the block matrices."""
    ws = block_matrices(shape)
    floats = compiled.CompiledPanels(threads, panel=compiled.host_panel())
    runs, sizes = {"compiled-panels (float32)": (products(floats), ws)}, {"compiled-panels (float32)": ws}
    for scheme in CODE_SCHEMES:
        codes = [compiled.QuantPanels.from_codes(*quantize_tensor(w, parse_scheme(scheme), 0)[:2]) for w in ws]
        for nest, panel in (("tiles", compiled.PANEL), ("blocks", compiled.blocks.PANEL)):
            runs[f"{scheme} {nest}"] = (products(compiled.CompiledQuant(threads, float_panel=panel)), codes)
    rng, rows = np.random.default_rng(3), []
    for m in common.steps(CODE_ROWS, "rows"):
        xs = [rng.standard_normal((m, w.shape[0]), dtype=np.float32) for w in ws]
        with common.blas_threads(1):
            for f, mats in runs.values():
                f(xs, mats)
            best = {name: float("inf") for name in runs}
            for _ in range(repeats):
                for name, (f, mats) in runs.items():
                    start = time.perf_counter()
                    f(xs, mats)
                    best[name] = min(best[name], time.perf_counter() - start)
        for name, s in best.items():
            nbytes = sum(w.nbytes for w in runs[name][1])
            rows.append({"shape": shape, "threads": threads, "M": m, "way": name, "ms": 1e3 * s, "MB": nbytes / 1e6,
                         "GBps": nbytes / s / 1e9, "of_float32": s / best["compiled-panels (float32)"],
                         "load_average": common.load_average()})
            common.log(f"M={m} {name:28s} {1e3 * s:8.2f} ms")
    return rows


def options(ap):
    ap.add_argument("--shape", default=None, help="GPT-2 shape (default gpt2-large; --quick: gpt2)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per configuration, best kept (default 7)")
    ap.add_argument("--layer", choices=compiled.LAYERS, default=compiled.LAYERS[0],
                    help=f"numba's threading layer of the kernel (one per process; default {compiled.LAYERS[0]})")
    ap.add_argument("--codes", action="store_true", help="only the table panels_codes (compiled-quant's two nests)")


def main(argv=None):
    run = common.command_line("bench.panels", __doc__, argv, options, threads=("2", "2"), many=False)
    if not compiled.available():
        print("bench.panels: needs the fast extra (numba): pip install 'npspec[fast]'", file=sys.stderr)
        return 1
    shape = run.args.shape or ("gpt2" if run.args.quick else "gpt2-large")
    codes = common.Table("panels_codes", measure_codes(shape, run.threads[0], run.args.repeats),
                         f"compiled-quant: its two loop nests over int codes ({shape})",
                         __doc__.split("\n\n")[2].replace("\n", " "))
    if run.args.codes:
        return common.finish(run, [codes])
    rows = measure(shape, run.threads[0], run.args.repeats, run.args.layer)
    tables = [common.Table("panels", rows, f"compiled-panels: panel widths and threads ({shape})",
                           __doc__.split("\n\n")[1].replace("\n", " ")), codes]
    if run.threads[0] > 1:  # one thread shares nothing out
        split = measure_split(run.threads[0], run.args.repeats, (40 if run.args.quick else 400) << 20)
        tables.append(common.Table("panels_split", split, "compiled-panels: one call or shared out, one row",
                                   measure_split.__doc__.replace("\n", " ")))
    return common.finish(run, tables)


if __name__ == "__main__":
    sys.exit(main())
