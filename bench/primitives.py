"""python -m bench.primitives: NumPy's own products, timed bare: the floor under npspec's invariant kernels.

npspec's fastest plain decoding is one BLAS GEMV per matrix on BLAS's own threads. A batch-invariant verify
needs a product over several rows in which every row gets its one-row bits (npspec.kernels.products), and a kernel that
shares a product out to npspec's own threads. This command times those building blocks without a model, on the
block matrices (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) of a GPT-2 shape (--shape, default gpt2-large;
--quick: gpt2), `--layers` layers of them (default n_layer) stored column-major, so that every pass streams
them from memory:
  * primitives_rows: one thread. One GEMV per matrix (`x[:1] @ w`, what plain decoding runs) against one GEMM
    per column panel over r = 2, 4, 8 rows (the call "gemm-blocks" makes: a one-token forward pads to r = 2, a
    verify of gamma + 1 tokens takes r = gamma + 1). over_gemv: the time over the GEMV's.
  * primitives_threads: --threads threads, each multiplying by its range of every matrix's columns with one GEMV
    (BLAS at one thread): handed its range matrix by matrix (npspec.kernels.workers.Workers, as the panel kernels share
    work out), or running through all its ranges with no handoff between matrices (a bound no forward reaches:
    a layer needs the whole previous output), against one GEMV per matrix on BLAS's own threads.
  * primitives_gil: for `[1, 1024] @ [1024, k]`, whether another Python thread runs during np.matmul. NumPy
    releases the GIL in a ufunc loop only when the loop holds more than 500 elements
    (NPY_BEGIN_THREADS_THRESHOLDED; for matmul, the output's), so a product whose share holds 500 or fewer runs
    while every other Python thread waits.
Medians of --repeats passes; the configurations are interleaved pass by pass, so the host's noise hits them alike.
"""

import sys
import threading
import time

import numpy as np

from npspec.kernels.layout import PANEL_BYTES, panel_width, panels
from npspec.kernels.workers import Workers
from npspec.sources.names import SHAPES

from . import common

ROWS = (2, 4, 8)  # the rows of "gemm-blocks"' GEMM: a one-token forward (padded), verifies of 4 and 8 tokens
GIL_OUTPUTS = (128, 256, 384, 500, 501, 512, 768, 1024, 4096)  # output elements of the GIL probe's products


def block_matrices(config, layers):  # -> [4 * layers] of [d_in, d_out] float32, column-major
    """`layers` layers' block matrices of `config`, column-major as npspec stores them, filled with a constant (a
    product's time does not depend on the values)."""
    d = config.n_embd
    shapes = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]
    return [np.full(s, 0.01, dtype=np.float32, order="F") for _ in range(layers) for s in shapes]


def gemv_pass(mats, x):  # [d_in, d_out] matrices, x [r, max d_in]
    """One GEMV per matrix: x[0] @ w."""
    for w in mats:
        x[:1, :w.shape[0]] @ w


def panel_gemm_pass(mats, x, r):
    """Per matrix, one GEMM `[r, d_in] @ [d_in, width]` per column panel (gemm-blocks' panels and call)."""
    for w in mats:
        d_in, d_out = w.shape
        ws = panels(w, panel_width(d_in, d_out, PANEL_BYTES, 0))  # [P, d_in, width]
        np.matmul(x[:r, :d_in].reshape(1, 1, r, d_in), ws[:, None])


def column_ranges(d_out, n):
    """n contiguous column ranges [a, b) covering d_out."""
    return [(d_out * i // n, d_out * (i + 1) // n) for i in range(n)]


def handed_pass(mats, x, workers, n):
    """Per matrix, n GEMVs over its column ranges, run at once: one on this thread, n - 1 handed to `workers`."""
    for w in mats:
        xr = x[:1, :w.shape[0]]
        workers.run([lambda w=w, xr=xr, a=a, b=b: xr @ w[:, a:b] for a, b in column_ranges(w.shape[1], n)])


def unsynchronised_pass(mats, x, n):
    """n threads, thread i running through range i of every matrix with no handoff in between."""
    def part(i):
        for w in mats:
            a, b = column_ranges(w.shape[1], n)[i]
            x[:1, :w.shape[0]] @ w[:, a:b]
    threads = [threading.Thread(target=part, args=(i,)) for i in range(1, n)]
    for t in threads:
        t.start()
    part(0)
    for t in threads:
        t.join()


def interleaved(passes, repeats, pause=0.0):
    """{name: (f, blas threads)} -> {name: median seconds}: one warm-up each, then `repeats` rounds, each timing
    every pass once in turn (after `pause` seconds, so that BLAS threads left spinning by a threaded call sleep:
    common.in_turn)."""
    def timed(f, blas):  # -> a call returning f()'s seconds, run with `blas` BLAS threads
        def run():
            with common.blas_threads(blas):
                t0 = time.perf_counter()
                f()
                return time.perf_counter() - t0
        return run
    times = common.in_turn({name: timed(f, blas) for name, (f, blas) in passes.items()}, repeats, pause)
    return {name: common.median(v) for name, v in times.items()}


def gil_released(k, d_in=1024, seconds=3e-3, tries=3):
    """True if another Python thread runs during np.matmul(`[1, d_in] @ [d_in, k]`) (float32, one BLAS thread).

    The other thread waits on a lock released just before a loop of such products lasting about `seconds`
    (less than Python's 5 ms switch interval): it runs at once if the products release the GIL, else only when
    the loop ends. Released: it ran before half the loop, in most of `tries` tries. Run it with the other core
    idle (no BLAS thread left spinning), or a released GIL can look held.
    """
    w, x = np.full((d_in, k), 0.01, dtype=np.float32, order="F"), np.ones((1, d_in), dtype=np.float32)
    with common.blas_threads(1):
        t_call = min(common.time_call(lambda: x @ w, 5))
        calls = max(1, round(seconds / t_call))
        released = 0
        for _ in range(tries):
            go, ran = threading.Lock(), []
            go.acquire()

            def other():
                with go:
                    ran.append(time.perf_counter())
            t = threading.Thread(target=other)
            t.start()
            time.sleep(0.01)  # the other thread waits on `go`
            t0 = time.perf_counter()
            go.release()
            for _ in range(calls):
                x @ w
            t1 = time.perf_counter()
            t.join()
            released += ran[0] - t0 < (t1 - t0) / 2
    return 2 * released > tries


def options(ap):
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="the GPT-2 shape whose block matrices are multiplied (default gpt2-large; --quick: gpt2)")
    ap.add_argument("--layers", type=int, default=None, help="layers of matrices (default: the shape's n_layer)")
    ap.add_argument("--repeats", type=int, default=None, help="timed passes of each configuration (default 7; --quick: 3)")


def main(argv=None):
    run = common.command_line("bench.primitives", __doc__, argv, options, threads=("2", "2"), many=False)
    args, n = run.args, run.threads[0]
    shape = args.shape or ("gpt2" if args.quick else "gpt2-large")
    config = SHAPES[shape]
    layers = args.layers or config.n_layer
    if layers < 1:
        raise SystemExit(f"bench.primitives: --layers must be >= 1, got {layers}")
    repeats = args.repeats or (3 if args.quick else 7)
    mats = block_matrices(config, layers)
    x = np.random.default_rng(0).standard_normal((max(ROWS), 4 * config.n_embd), dtype=np.float32)
    nbytes = sum(w.nbytes for w in mats)
    run.meta.update({"shape": shape, "layers": layers, "matrix_MB": f"{nbytes / 1e6:.0f}"})

    common.log(f"rows: {shape}, {layers} layers ({nbytes / 1e9:.2f} GB), one thread")
    t = interleaved({"gemv": (lambda: gemv_pass(mats, x), 1),
                     **{f"gemm{r}": (lambda r=r: panel_gemm_pass(mats, x, r), 1) for r in ROWS}}, repeats)
    rows = [{"product": "GEMV per matrix", "rows": 1, "ms": 1e3 * t["gemv"], "GBps": nbytes / t["gemv"] / 1e9,
             "over_gemv": 1.0}]
    rows += [{"product": "GEMM per panel (gemm-blocks)", "rows": r, "ms": 1e3 * t[f"gemm{r}"],
              "GBps": nbytes / t[f"gemm{r}"] / 1e9, "over_gemv": t[f"gemm{r}"] / t["gemv"]} for r in ROWS]

    common.log(f"threads: {n}")
    workers = Workers(n - 1)
    t = interleaved({"handed": (lambda: handed_pass(mats, x, workers, n), 1),
                     "unsynchronised": (lambda: unsynchronised_pass(mats, x, n), 1),
                     "blas": (lambda: gemv_pass(mats, x), n)}, repeats, pause=0.3)
    threads = [{"work": f"{n} Python threads, ranges handed over matrix by matrix (npspec's Workers)",
                "ms": 1e3 * t["handed"]},
               {"work": f"{n} Python threads, no handoff between matrices (a bound)", "ms": 1e3 * t["unsynchronised"]},
               {"work": f"one GEMV per matrix on BLAS's {n} threads", "ms": 1e3 * t["blas"]}]
    for r in threads:
        r["over_blas"] = r["ms"] / (1e3 * t["blas"])

    common.log("gil")
    time.sleep(0.5)  # BLAS's threads, left spinning by the last pass, go to sleep
    gil = [{"output_elements": k, "gil_released": gil_released(k)} for k in GIL_OUTPUTS]
    return common.finish(run, [
        common.Table("primitives_rows", rows, f"One thread: GEMV against gemm-blocks' panel GEMMs ({shape})",
                     f"Median of {repeats} passes over {layers} layers' block matrices ({nbytes / 1e6:.0f} MB, "
                     "column-major); GBps = matrix bytes / time."),
        common.Table("primitives_threads", threads, f"{n} threads: handoffs per matrix against BLAS's threads ({shape})",
                     f"Median of {repeats} passes; one GEMV per thread per matrix, BLAS at one thread in the Python "
                     "threads' rows."),
        common.Table("primitives_gil", gil, "Does np.matmul release the GIL? ([1, 1024] @ [1024, k], float32)",
                     "gil_released: another Python thread ran during a loop of these products (bench.primitives."
                     "gil_released).")])


if __name__ == "__main__":
    sys.exit(main())
