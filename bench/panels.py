"""python -m bench.panels: how the compiled kernel "compiled-panels" is laid out and shares its panels, measured.

On one GPT-2 block's four matrices (default gpt2-large's; --quick: gpt2's), repeated to 3 blocks so that they do not
sit in the cache, for M = 1, 2, 3, 4, 8, 16 rows: the best-of-`--repeats` seconds of
  * npspec's own worker threads (npspec.kernels.Workers, what CompiledPanels runs) with panels of 32, 64 and 96
    columns (compiled.PANEL);
  * numba's prange over 64-column panels with the threading layer `--layer` (workqueue, omp or tbb; numba loads one
    per process, so each is its own run: npspec.compiled's bench variant);
  * OpenBLAS' GEMV over the same matrices for one row (the bandwidth reference, BLAS with the run's threads).
The compiled configurations run with BLAS at one thread and are interleaved per repeat, so a change in the machine's
load hits all alike; the GEMV runs after them, in its own pass, because OpenBLAS' idle threads spin for a while
after a call and would take a core from the next configuration. Writes panels.csv/.md; bench/results/README.md says
what was chosen and why.
"""

import sys
import time

import numpy as np

from npspec import compiled
from npspec.sources import SHAPES

from . import common

ROWS = (1, 2, 3, 4, 8, 16)
WIDTHS = (32, 64, 96)
LAYERS = ("workqueue", "omp", "tbb")  # numba loads one threading layer per process: --layer picks it


def block_matrices(shape, copies=3, seed=0):
    """[d_in, d_out] column-major float32 matrices of `copies` GPT-2 blocks of `shape` (c_attn, c_proj, c_fc, c_proj)."""
    d = SHAPES[shape].n_embd
    rng = np.random.default_rng(seed)
    shapes = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * copies
    return [np.asfortranarray(rng.standard_normal(s, dtype=np.float32)) for s in shapes]


def products(kernel):  # a linear(x, w) -> f(xs, ws) over the matrices
    return lambda xs, ws: [kernel(x, w) for x, w in zip(xs, ws)]


def configurations(threads, layer, ws):
    """{name: f(xs, ws)} of every compiled way timed (module docstring); layer: numba's threading layer for prange."""
    out = {f"workers-{p}": products(compiled.CompiledPanels(threads, panel=p)) for p in WIDTHS}
    try:
        product = compiled.compiled_prange_product(layer)
        product(np.zeros((1, 2), np.float32), np.zeros((1, 2, 8), np.float32), np.zeros((1, 1), np.float32))
    except Exception as e:  # the layer may be missing here (no TBB, no OpenMP runtime)
        common.log(f"prange {layer}: not available here ({type(e).__name__}: {e})")
        return out
    packed = [compiled.pack(w) for w in ws]

    def run(xs, _):
        for x, w, p in zip(xs, ws, packed):
            product(x, p, np.empty((x.shape[0], w.shape[1]), np.float32))
    out[f"prange-{layer}"] = run
    return out


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


def measure(shape, threads, repeats, layer="workqueue"):
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


def options(ap):
    ap.add_argument("--shape", default=None, help="GPT-2 shape (default gpt2-large; --quick: gpt2)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per configuration, best kept (default 7)")
    ap.add_argument("--layer", choices=LAYERS, default="workqueue",
                    help="numba's threading layer for the prange rows (one per process; default workqueue)")


def main(argv=None):
    run = common.command_line("bench.panels", __doc__, argv, options, threads=("2", "2"), many=False)
    if not compiled.available():
        print("bench.panels: needs the fast extra (numba): pip install 'npspec[fast]'", file=sys.stderr)
        return 1
    shape = run.args.shape or ("gpt2" if run.args.quick else "gpt2-large")
    rows = measure(shape, run.threads[0], run.args.repeats, run.args.layer)
    return common.finish(run, [common.Table("panels", rows, f"compiled-panels: panel widths and threads ({shape})",
                                            __doc__.split("\n\n")[1].replace("\n", " "))])


if __name__ == "__main__":
    sys.exit(main())
