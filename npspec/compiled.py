"""The compiled product "compiled-lanes": a numba loop nest, batch invariant by construction (the optional extra `fast`).

Imports numpy, npspec.kernels (its threads and thread rule) and, when the kernel is first built, numba: the one
module of npspec that touches numba. `pip install 'npspec[fast]'` installs it; without it `available()` is False
and npspec decodes with its NumPy kernels (npspec.registry).

The contract: `y[m, n] = sum over k of x[m, k] * w[k, n]` for `x` `[M, d_in]` float32 and npspec's column-major
`w` `[d_in, d_out]` (so column n, `wt[n] = w[:, n]`, is contiguous). Each element is computed as follows
(`lanes_product`), with LANES = 64:
  * lane l (0 <= l < LANES) starts at +0.0 and adds x[m, k] * w[k, n] for k = l, l + LANES, l + 2 LANES, ... < d_in,
    in increasing k: one float32 product, then one float32 addition, each correctly rounded (IEEE 754);
  * then s = +0.0 and s += lane[l] for l = 0, 1, ..., LANES - 1 in order; y[m, n] = s.
Why that order is fixed by the code alone, and by nothing else:
  * It is a function of d_in, LANES and the values x[m, :], w[:, n] only. The row count M, the other rows, the
    thread count and the column split choose WHICH elements a call computes and in what order the elements are
    visited, never how one element's sum is formed: no element's sum reads another element's partial sums.
  * Rows are handled 4, 2 or 1 at a time (`rows4`, `rows2`, `rows1`: weight loads are shared across the rows of a
    block); the three are the same per-lane arithmetic written for more rows, so a row's bits do not depend on which
    block it falls in (tests/test_compiled.py checks every position for M = 1..16).
  * The compiler may vectorize the lane loop (8 lanes per AVX2 instruction), which computes the same independent
    lane updates; it may not reorder a sum: numba compiles without fastmath, so LLVM gets no `reassoc` (which would
    let it regroup a lane's or the final sum) and no `contract` (which would fuse a product and its addition into
    one FMA with one rounding fewer, in some code paths and not others). Those are the only LLVM flags that change
    results of these operations, and none is set.
Threads: a product over a matrix of kernels.SPLIT_BYTES or more is shared out over npspec's own worker threads
(kernels.Workers, the same kind the NumPy panel kernels use, so a target and a draft never run two thread pools
against each other), in runs of whole COLUMN_BLOCK columns; the compiled loop releases the GIL (`nogil`). BLAS runs
one thread in its forwards (registry.Kernel.blas_threads). bench/results/README.md records why these threads
rather than numba's `prange` layers and why COLUMN_BLOCK.

Memory traffic: each column of w is read from memory once for all M rows (it is 4 d_in bytes, which stays in the L1
or L2 cache while every row block runs over it); within a row block each weight is loaded once into a register
and used for every row of the block. The lane sums live in a small buffer (LANES floats per row of a block) that
stays in L1: numba does not run LLVM's SLP vectorizer by default and fastmath is off, so LLVM vectorizes the lane
loop (independent lanes) but keeps the partial sums in memory between its iterations; each iteration therefore
adds UNROLL = 4 consecutive chunks to a lane (in increasing k, the same order) so that a running sum goes back to
memory once per 4 additions. The kernel turns compute bound when M exceeds its FMA rate over the weight read rate
(bench/verify_cost measures both and marks that M*); measured against the same loop without the unroll, in one
process: 2.1x faster at 1 row, 3.5x at 16 (bench/results/README.md).

Compiling: the loop is compiled on first use with numba's on-disk cache (cache=True: numba's own locations, the
`__pycache__` beside this file, else its user-wide cache, $NUMBA_CACHE_DIR when set), so the cost (seconds) is paid
once per machine and numba version. `compiled_product(note)` says so through `note` when compiling takes over
NOTE_SECONDS (loading the cache is silent), and compiles in memory for this process when no cache location is
writable (a read-only install), saying so.
numba is imported inside `compiled_product`, not at the top of this module: importing numba costs 0.5 to 2 s here,
which every npspec command (and `--help`) would pay otherwise even when no compiled kernel runs.
"""

import importlib.util
import time
import types

import numpy as np

from .kernels import SPLIT_BYTES, Workers, check_threads

LANES = 64  # partial sums per element (module docstring); 8 AVX2 vectors, a multiple of every SIMD width
COLUMN_BLOCK = 64  # columns per thread's run unit: bench/results/README.md (kernel) says how it was chosen
NOTE_SECONDS = 0.5  # compiling (or loading the cache) longer than this is announced
NAME = "compiled-lanes"


def available(find_spec=None):
    """True if numba can be imported (the `fast` extra is installed); nothing is imported to find out.
    find_spec: importlib.util.find_spec (a parameter so that tests can pretend numba is missing)."""
    try:
        return (find_spec or importlib.util.find_spec)("numba") is not None
    except ValueError:  # sys.modules["numba"] is None: imports of numba are blocked
        return False


def rows4(x0, x1, x2, x3, wn, a0, a1, a2, a3, d_in):  # 4 rows [d_in], a column [d_in] -> lanes a0..a3 [LANES]
    """The lane sums of four rows against one column (module docstring), each weight loaded once for the four.

    The lane loop takes UNROLL consecutive chunks of LANES inputs at a time, adding them to a lane in increasing k
    (the same order as one chunk at a time): a lane's running sum then stays in a register for UNROLL additions
    instead of going back to memory after each.
    """
    for lane in range(LANES):
        a0[lane] = 0.0
        a1[lane] = 0.0
        a2[lane] = 0.0
        a3[lane] = 0.0
    o = 0
    while o + 4 * LANES <= d_in:  # UNROLL = 4 chunks
        for lane in range(LANES):
            k0, k1, k2, k3 = o + lane, o + LANES + lane, o + 2 * LANES + lane, o + 3 * LANES + lane
            w0, w1, w2, w3 = wn[k0], wn[k1], wn[k2], wn[k3]
            a0[lane] = (((a0[lane] + x0[k0] * w0) + x0[k1] * w1) + x0[k2] * w2) + x0[k3] * w3
            a1[lane] = (((a1[lane] + x1[k0] * w0) + x1[k1] * w1) + x1[k2] * w2) + x1[k3] * w3
            a2[lane] = (((a2[lane] + x2[k0] * w0) + x2[k1] * w1) + x2[k2] * w2) + x2[k3] * w3
            a3[lane] = (((a3[lane] + x3[k0] * w0) + x3[k1] * w1) + x3[k2] * w2) + x3[k3] * w3
        o += 4 * LANES
    while o < d_in:  # the last chunks one at a time, the last one partial (d_in % LANES inputs into lanes 0, 1, ...)
        for lane in range(min(LANES, d_in - o)):
            w = wn[o + lane]
            a0[lane] += x0[o + lane] * w
            a1[lane] += x1[o + lane] * w
            a2[lane] += x2[o + lane] * w
            a3[lane] += x3[o + lane] * w
        o += LANES


def rows2(x0, x1, wn, a0, a1, d_in):  # rows4's arithmetic for two rows
    for lane in range(LANES):
        a0[lane] = 0.0
        a1[lane] = 0.0
    o = 0
    while o + 4 * LANES <= d_in:
        for lane in range(LANES):
            k0, k1, k2, k3 = o + lane, o + LANES + lane, o + 2 * LANES + lane, o + 3 * LANES + lane
            w0, w1, w2, w3 = wn[k0], wn[k1], wn[k2], wn[k3]
            a0[lane] = (((a0[lane] + x0[k0] * w0) + x0[k1] * w1) + x0[k2] * w2) + x0[k3] * w3
            a1[lane] = (((a1[lane] + x1[k0] * w0) + x1[k1] * w1) + x1[k2] * w2) + x1[k3] * w3
        o += 4 * LANES
    while o < d_in:
        for lane in range(min(LANES, d_in - o)):
            w = wn[o + lane]
            a0[lane] += x0[o + lane] * w
            a1[lane] += x1[o + lane] * w
        o += LANES


def rows1(x0, wn, a0, d_in):  # rows4's arithmetic for one row
    for lane in range(LANES):
        a0[lane] = 0.0
    o = 0
    while o + 4 * LANES <= d_in:
        for lane in range(LANES):
            k0, k1, k2, k3 = o + lane, o + LANES + lane, o + 2 * LANES + lane, o + 3 * LANES + lane
            a0[lane] = (((a0[lane] + x0[k0] * wn[k0]) + x0[k1] * wn[k1]) + x0[k2] * wn[k2]) + x0[k3] * wn[k3]
        o += 4 * LANES
    while o < d_in:
        for lane in range(min(LANES, d_in - o)):
            a0[lane] += x0[o + lane] * wn[o + lane]
        o += LANES


def lane_sum(a):  # [LANES] -> float32, lanes added in order from +0.0
    s = np.float32(0.0)
    for lane in range(LANES):
        s += a[lane]
    return s


def lanes_product(x, wt, y, n0, n1):  # [M, d_in], [d_out, d_in], out [M, d_out]; columns n0 <= n < n1
    """y[:, n0:n1] = x @ wt[n0:n1].T, each element by the fixed lane order of the module docstring."""
    m_rows, d_in = x.shape
    acc = np.empty((4, LANES), dtype=np.float32)
    a0, a1, a2, a3 = acc[0], acc[1], acc[2], acc[3]
    for n in range(n0, n1):
        wn = wt[n]
        m = 0
        while m + 4 <= m_rows:
            rows4(x[m], x[m + 1], x[m + 2], x[m + 3], wn, a0, a1, a2, a3, d_in)
            y[m, n], y[m + 1, n], y[m + 2, n], y[m + 3, n] = lane_sum(a0), lane_sum(a1), lane_sum(a2), lane_sum(a3)
            m += 4
        if m + 2 <= m_rows:
            rows2(x[m], x[m + 1], wn, a0, a1, d_in)
            y[m, n], y[m + 1, n] = lane_sum(a0), lane_sum(a1)
            m += 2
        if m < m_rows:
            rows1(x[m], wn, a0, d_in)
            y[m, n] = lane_sum(a0)


def lanes_product_prange(x, wt, y, column_block):  # lanes_product over every column, blocks shared out by prange
    """The bench's variant (bench.lanes): numba's own threads (prange, its threading layer) over column blocks."""
    d_out = wt.shape[0]
    for b in prange(-(-d_out // column_block)):  # noqa: F821 (numba.prange, given by compiled_prange_product)
        lanes_product(x, wt, y, b * column_block, min(d_out, (b + 1) * column_block))


_compiled = {}  # the compiled dispatchers of this process (numba's, like its own caches), built on first use


def compiled_product(note=None, njit=None):
    """The compiled `lanes_product(x, wt, y, n0, n1)`, built once per process (numba's disk cache makes later
    processes load it).

    note: None, or a function given a one-line message when compiling took over NOTE_SECONDS (not when numba's cache
    was loaded), and when no cache location is writable (then every process compiles). njit: numba.njit (a parameter so that tests can give a
    stand-in). Raises ValueError (one line, with the fix) if numba is not installed.
    """
    if "product" in _compiled:
        return _compiled["product"]
    if njit is None:
        try:
            import numba  # lazily: the module docstring says why
        except ImportError:
            raise ValueError(f"kernel {NAME} needs numba: pip install 'npspec[fast]' (or pick a NumPy kernel "
                             "with --target-kernel / --draft-kernel)") from None
        njit = numba.njit
    start = time.perf_counter()  # after numba's import: what is announced is compiling (or loading the cache)
    product, cached = jit_product(njit)
    x = np.zeros((1, LANES), dtype=np.float32)
    product(x, x, np.zeros((1, 1), dtype=np.float32), 0, 1)  # compiles for float32 C arrays (or loads the cache)
    seconds = time.perf_counter() - start
    if note is not None and not cached:
        note(f"kernel {NAME}: no writable cache location for numba, so it compiled in memory ({seconds:.1f} s, "
             "again in every process); set NUMBA_CACHE_DIR to a writable directory to compile once")
    elif note is not None and seconds > NOTE_SECONDS and not getattr(getattr(product, "stats", None), "cache_hits", 0):
        note(f"kernel {NAME}: compiled in {seconds:.1f} s (once: numba caches it on disk)")  # a cache load is silent
    _compiled["product"] = product
    return product


def jit_product(njit, **options):
    """(compiled lanes_product, whether numba caches it on disk): the helpers compiled first, then the loop that calls
    them; without a writable cache location (numba's RuntimeError at decoration) compiled for this process only."""
    for cache in (True, False):
        try:
            jit = njit(nogil=True, cache=cache, boundscheck=False, **options)
            helpers = {f.__name__: jit(f) for f in (rows4, rows2, rows1, lane_sum)}
            return jit(with_globals(lanes_product, helpers)), cache
        except RuntimeError:  # numba: "cannot cache function ...: no locator available" (nowhere writable)
            if not cache:
                raise


def compiled_prange_product(layer="default"):
    """The bench's variant lanes_product_prange, compiled with numba's threading layer `layer` (numba's own setting,
    set here for this process: "default", "workqueue", "omp" or "tbb"). Raises ValueError without numba."""
    if ("prange", layer) not in _compiled:
        try:
            import numba  # lazily: the module docstring says why
        except ImportError:
            raise ValueError(f"kernel {NAME} needs numba: pip install 'npspec[fast]'") from None
        numba.config.THREADING_LAYER = layer
        product, cached = jit_product(numba.njit)
        variant = with_globals(lanes_product_prange, {"prange": numba.prange, "lanes_product": product})
        _compiled["prange", layer] = numba.njit(parallel=True, nogil=True, cache=cached)(variant)
    return _compiled["prange", layer]


def with_globals(f, names):
    """A copy of function `f` whose globals also hold `names` (the compiled helpers it calls), so that numba
    compiles calls to them; the module's own plain functions stay plain Python."""
    return types.FunctionType(f.__code__, {**f.__globals__, **names}, f.__name__, f.__defaults__, f.__closure__)


class CompiledLanes:
    """The "compiled-lanes" kernel `linear(x, w, b=None)`: `[n, d_in], [d_in, d_out], [d_out] -> [n, d_out]` float32.

    threads: a positive int, the threads that share out a matrix of kernels.SPLIT_BYTES or more, in runs of whole
    COLUMN_BLOCK columns (the first `threads - 1` runs on this object's own workers, the last on the calling
    thread); results never depend on it. note: passed to compiled_product. column_block: the run unit (the bench
    varies it). Raises ValueError for a bad thread count or without numba.
    """

    name = NAME

    def __init__(self, threads=1, note=None, column_block=COLUMN_BLOCK):
        self.threads = check_threads(threads)
        self.column_block = column_block
        self.product = compiled_product(note)
        self.workers = Workers(self.threads - 1) if self.threads > 1 else None

    def __call__(self, x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]
        x = np.ascontiguousarray(x, dtype=np.float32)
        wt = w.T if w.flags.f_contiguous else np.ascontiguousarray(w.T)  # [d_out, d_in] C: the columns of w
        n, d_out = x.shape[0], w.shape[1]
        y = np.empty((n, d_out), dtype=np.float32)
        blocks = -(-d_out // self.column_block)
        threads = min(self.threads, blocks) if w.nbytes >= SPLIT_BYTES else 1
        if threads == 1:
            self.product(x, wt, y, 0, d_out)
        else:
            cuts = [min(d_out, blocks * i // threads * self.column_block) for i in range(threads + 1)]
            runs = [(a, b) for a, b in zip(cuts, cuts[1:])]
            self.workers.run([lambda a=a, b=b: self.product(x, wt, y, a, b) for a, b in runs[::-1]])
        return y if b is None else y + b

    def __repr__(self):
        return f"CompiledLanes(threads={self.threads})"
