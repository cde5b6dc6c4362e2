"""The products: every way npspec multiplies a block of rows by a weight matrix.

Imports numpy and the standard library only. A kernel is a callable
`linear(x, w, b=None)`: `[n, d_in], [d_in, d_out], [d_out] -> [n, d_out]` float32 (b=None: no
bias, as for the tied head). npspec.kernels.registry names them, says which are invariant and builds them
(`registry.kernel(name).build(threads)`); the worker threads of a panel kernel belong to that
object (Workers; no module state). The compiled kernel "compiled-panels" lives in npspec.kernels.compiled.

The batch-invariance contract (Thinking Machines Lab, "Defeating Nondeterminism in LLM
Inference", He 2025): a kernel is INVARIANT when row i of its result is bit-identical to its
result for the one row `x[i:i+1]`, whatever the other rows are. Then a verify forward over
gamma + 1 positions gives the very logits of gamma + 1 one-token forwards, which makes greedy
speculative decoding token-identical to greedy decoding by construction. Each row's reduction
order must therefore be fixed by the matrix shape alone, never by how many rows come:
  * "gemm-blocks" (`GemmBlocks`): per column panel, one GEMM over all the rows (a single row
    padded to BLOCK_ROWS = 2, which numpy would otherwise run as a GEMV, whose bits differ).
    Invariant because the GEMM gives each row the same bits for every row count from 2 up to a
    limit, wherever the row sits and whatever the other rows hold: a property of the BLAS, which
    the kernel probes once per panel shape (`same_bits_rows`) and never exceeds (more rows are
    cut into blocks). A one-token forward reads the weights once, as a GEMV does, and so does a
    verify of up to the limit (16 on OpenBLAS with SkylakeX kernels, 3 with Haswell kernels on AMD Zen 3).
  * "gemm" (`gemm`): one BLAS GEMM. Fastest for a long prompt (prefill). NOT invariant:
    OpenBLAS picks a different kernel for each n, so a row's bits depend on n.
  * "gemv-rows" (`gemv_rows`): one vector-matrix product (BLAS GEMV) per row, in one stacked
    np.matmul call; each row is exactly the call the one-token forward makes. Invariant.
  * "gemv-panels" (`GemvPanels`): the same GEMVs done panel by panel over the columns of w
    (about 160 KiB each), so a panel read from memory for the first row is still in L2 cache
    for the next rows: the cheapest verify. Its panels are contiguous when the matrices are
    column-major (`column_major`). Large matrices are shared out to worker threads; every
    panel's product is the same call whatever the thread count, so the bits never depend on
    it. Invariant, but its bits differ from "gemv-rows" (each GEMV runs over a narrower
    matrix): a model keeps one kernel for all its decoding forwards.
  * "gemm-panels" (`gemm_panels`): one GEMM per panel, stacked. NOT invariant; measured by the
    bench for comparison (npspec generate does not offer it).
Which invariant kernel is cheapest depends on the machine's BLAS; npspec.kernels.probe measures it for a model's shapes.
bench/verify_cost measures each for n = 1..16; bench/results/README.md says what they cost.
"""

import os
import threading
import weakref

import numpy as np

PANEL_BYTES = 160 << 10  # the panel size of "gemv-panels": well inside a core's L2 cache (2 MiB here)
WHOLE_BYTES = 1 << 20  # a matrix this small is one panel: it stays in L2 between rows anyway
SPLIT_BYTES = 4 << 20  # the panel kernels share the panels of a matrix this large out to their threads
BLOCK_ROWS = 2  # the fewest rows of a "gemm-blocks" GEMM: numpy runs a one-row product as a GEMV (other bits)
MAX_BLOCK_ROWS = 16  # the most rows of one "gemm-blocks" GEMM (OpenBLAS changes method above 16-24 on GPT-2's panels)


def gemm(x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; NOT batch invariant
    """One BLAS GEMM ("gemm")."""
    y = x @ w
    return y if b is None else y + b


def gemv_rows(x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; row i == gemv_rows(x[i:i+1])
    """n vector-matrix products (BLAS GEMV) in one stacked np.matmul call ("gemv-rows"; batch invariant)."""
    y = np.matmul(x[:, None, :], w)[:, 0]  # [n, 1, d_in] @ [d_in, d_out] -> [n, 1, d_out]
    return y if b is None else y + b


def panel_width(d_in, d_out, panel_bytes=PANEL_BYTES, whole_bytes=WHOLE_BYTES):
    """Columns per panel of a `[d_in, d_out]` float32 matrix.

    d_out (one panel) if the matrix has at most `whole_bytes`, else the largest multiple of 8 with
    `d_in * width * 4 <= panel_bytes` (at least 8). A function of the shape only, so one-token
    and n-token forwards use the same panels. The sizes come from bench/results/README.md
    (panel widths 8 to 1024 measured on GPT-2 shapes).
    """
    if d_in * d_out * 4 <= whole_bytes:
        return d_out
    return min(d_out, max(8, panel_bytes // (4 * d_in) // 8 * 8))


def panels(w, width):  # [d_in, d_out] -> [P, d_in, width], P = d_out // width; a view (no copy)
    """The first P full column panels of `w`; each is contiguous when `w` is column-major."""
    d_in, d_out = w.shape
    p = d_out // width
    return w[:, : p * width].reshape(d_in, p, width).transpose(1, 0, 2)


THREADS_PER_CPU = 64  # the most threads a forward may ask for, per CPU this process may use (check_threads)


def run_count(threads, count, nbytes, split_bytes=SPLIT_BYTES):  # -> int in [1, min(threads, count)]
    """How many runs a product cuts a matrix's `count` panels into: min(threads, count) for a matrix of
    `split_bytes` (`nbytes`) or more, else 1 (one call on the calling thread: a smaller matrix is not worth a
    handoff). Every panel kernel's threads follow this rule; SPLIT_BYTES is the NumPy kernels' threshold (a
    handoff to npspec's workers wakes a sleeping thread), npspec.kernels.compiled has its own (numba's threads spin)."""
    return min(threads, count) if nbytes >= split_bytes else 1


def run_cuts(count, threads):  # -> [threads + 1] ints, 0 = cuts[0] <= ... <= cuts[threads] = count
    """Where `count` panels are cut into `threads` runs of whole panels, as even as integers allow: run i is
    [cuts[i], cuts[i + 1]). Every panel kernel's threads share a matrix out this way."""
    return [count * i // threads for i in range(threads + 1)]


def check_threads(threads, cpus=None):
    """`threads` as an int; raises ValueError unless it is a positive integer of at most THREADS_PER_CPU per CPU.

    cpus: the CPUs this process may use (default: os.sched_getaffinity, else os.cpu_count). The bound is
    the one rule for every thread count (--threads, NPSPEC_NUM_THREADS, load(threads=...)): past a few
    threads per core a forward only adds handoffs (64 per CPU leaves room to oversubscribe, as the
    thread-invariance tests do), and each worker costs a thread and two locks (threads=10**9 used to
    allocate 3.8 GB of locks, 10**12 never returned).
    """
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"the thread count must be a positive integer, got {threads!r}")
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
    if threads > THREADS_PER_CPU * cpus:
        raise ValueError(f"the thread count must be at most {THREADS_PER_CPU * cpus} ({THREADS_PER_CPU} per CPU; this "
                         f"process may use {cpus}), got {threads:,}; a thread per CPU is fastest")
    return int(threads)


class Workers:
    """`n` persistent worker threads, each handed one job at a time through a pair of locks.

    Leaner than concurrent.futures.ThreadPoolExecutor (no Future, no queue): a job is a callable
    with no arguments, handed over by releasing the worker's `go` lock; the worker releases its
    `done` lock when the job returns. numpy releases the GIL inside its products, so jobs that are
    products run at the same time. Threads start on first use and are daemons (a worker blocked on
    its lock never keeps the interpreter alive). An exception in a job is raised again in the
    caller of `run`. Interrupting `run` (KeyboardInterrupt) leaves no job half-collected: the next
    `run` first waits for every worker still busy. The threads hold the locks and lists, not the
    Workers object, so once nothing else holds it (a model left behind by with_kernel, a probe's
    candidate) it is collected and its threads end (`stop_workers`).
    """

    def __init__(self, n):
        self.n = n
        self.go = [threading.Lock() for _ in range(n)]
        self.done = [threading.Lock() for _ in range(n)]
        self.jobs, self.errors, self.busy = [None] * n, [None] * n, [False] * n  # changed in place only
        self.threads = []

    def start(self):
        for i in range(self.n):
            self.go[i].acquire()
            self.done[i].acquire()
            t = threading.Thread(target=work, args=(self.go[i], self.done[i], self.jobs, self.errors, i),
                                 name=f"npspec-{i}", daemon=True)
            t.start()
            self.threads.append(t)
        weakref.finalize(self, stop_workers, self.go, self.done, self.jobs, self.busy).atexit = False  # daemons

    def run(self, jobs):
        """Run `jobs` (at most n + 1 callables) at once: jobs[0] on the calling thread, the rest on the workers; wait for all."""
        if not self.threads:
            self.start()
        self.collect()  # a job left running by an interrupted run
        self.errors[:] = [None] * self.n  # and whatever it raised: that run is over
        for i, job in enumerate(jobs[1:]):
            self.jobs[i], self.busy[i] = job, True
            self.go[i].release()
        try:
            jobs[0]()
        finally:
            self.collect()
        if errors := [e for e in self.errors if e is not None]:
            self.errors[:] = [None] * self.n
            raise errors[0]

    def collect(self):
        for i in range(self.n):
            if self.busy[i]:
                self.done[i].acquire()
                self.busy[i] = False


STOP = object()  # the job that ends a worker's thread (stop_workers)


def work(go, done, jobs, errors, i):  # worker i's thread: its two locks, the shared job and error lists
    """Worker i's loop (Workers): wait for `go`, run jobs[i], record what it raised in errors[i], release `done`;
    return at the STOP job."""
    while True:
        go.acquire()
        job = jobs[i]
        if job is STOP:
            return
        try:
            job()
        except BaseException as e:  # raised again in run's thread
            errors[i] = e
        jobs[i] = job = None  # a job holds its kernel (and so this Workers): nothing keeps it while waiting
        done.release()


def stop_workers(go, done, jobs, busy):
    """End every worker's thread (called when its Workers is collected): wait for a job still running, then hand
    each the STOP job."""
    for i in range(len(go)):
        if busy[i]:
            done[i].acquire()
            busy[i] = False
        jobs[i] = STOP
        go[i].release()


class PanelKernel:
    """A product computed column panel by column panel over `w`, the panels shared out to npspec's own threads.

    panel_bytes: the panel size `panel_width` aims at. Subclasses give `whole_bytes` (a matrix that
    small is one panel), `out_rows(n, d_in, width)` and `products(x, ws, out)`, which computes `x @ ws[p]` for every
    panel p into `out[p]` with calls whose shapes depend on the panel shape and the row count padded as the subclass
    says, never on which thread runs them.
    threads: a positive int, the threads that share out the panels of a matrix of SPLIT_BYTES or
    more (numpy releases the GIL in its products); 1 runs everything on the calling thread. The
    `threads - 1` workers are this object's own (Workers). Every panel's product is the same
    call whatever the thread count, so the bits never depend on `threads`
    (tests/test_kernels_panels.py). Raises ValueError for a bad thread count.
    """

    name = ""
    whole_bytes = WHOLE_BYTES  # a matrix this small is one panel

    def __init__(self, threads=1, panel_bytes=PANEL_BYTES):
        self.threads = check_threads(threads)
        self.panel_bytes = panel_bytes
        self.workers = Workers(self.threads - 1) if self.threads > 1 else None

    def out_rows(self, n, d_in, width):
        """Rows of the product's output buffer for n rows of x and `[d_in, width]` panels (n, or n padded to whole blocks)."""
        return n

    def products(self, x, ws, out):  # [n, d_in], [P, d_in, width] -> out [P, out_rows(n), width]
        raise NotImplementedError

    def __call__(self, x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]
        """Panel-major loop: a panel is read once from memory for all n rows.

        A matrix of SPLIT_BYTES or more is cut into `threads` runs of whole panels, one run per
        thread. If d_out is not a multiple of the width (the head's 50257), one more panel covers
        the last `width` columns, overlapping the previous one, so every column comes from a
        product of the same width.
        """
        n, (d_in, d_out) = x.shape[0], w.shape
        width = panel_width(d_in, d_out, self.panel_bytes, self.whole_bytes)
        ws = panels(w, width)  # [P, d_in, width]
        p, main = ws.shape[0], ws.shape[0] * width
        y = np.empty((p, self.out_rows(n, d_in, width), width), dtype=np.float32)
        threads = run_count(self.threads, p, w.nbytes)
        if threads == 1:
            self.products(x, ws, y)
        else:
            cuts = run_cuts(p, threads)
            self.workers.run([lambda a=a, b=b: self.products(x, ws[a:b], y[a:b]) for a, b in zip(cuts, cuts[1:])])
        out = np.empty((n, d_out), dtype=np.float32)
        out[:, :main] = y[:, :n].transpose(1, 0, 2).reshape(n, main)
        if main < d_out:  # the last panel, [d_out - width, d_out)
            last = np.empty((1, self.out_rows(n, d_in, width), width), dtype=np.float32)
            self.products(x, w[None, :, d_out - width:], last)
            out[:, main:] = last[0, :n, main - d_out:]
        return out if b is None else out + b

    def __repr__(self):
        return f"{type(self).__name__}(threads={self.threads})"


class GemvPanels(PanelKernel):
    """The "gemv-panels" kernel: for each column panel of w, every row's GEMV (batch invariant by construction)."""

    name = "gemv-panels"

    def products(self, x, ws, out):  # [n, d_in], [P, d_in, width] -> out [P, n, width]
        """One stacked np.matmul: [1, n, 1, d_in] @ [P, 1, d_in, width], one GEMV per (panel, row)."""
        np.matmul(x[None, :, None, :], ws[:, None], out=out[:, :, None, :])


class GemmBlocks(PanelKernel):
    """The "gemm-blocks" kernel: for each column panel of w, one GEMM over a block of 2 to `block_limit` rows.

    n rows make k = ceil(n / limit) blocks of r = max(BLOCK_ROWS, ceil(n / k)) rows each (zero rows
    pad the last), and each (panel, block) is one GEMM `[r, d_in] @ [d_in, width]`, where `limit`
    is `block_limit(d_in, width)`: the most rows (at most max_rows) for which this BLAS gives
    every row the bits it gets in a 2-row GEMM, probed once per panel shape (`same_bits_rows`).
    So row i of the result never depends on n or on the other rows (tests/test_kernels.py checks
    it through every GPT-2 shape and whole forwards). A one-row forward costs a GEMV's memory
    traffic (the weights are read once; the padded row costs arithmetic, cheap next to the
    read), and a verify of up to `limit` rows reads the weights once too: bench/verify_cost
    measures it.
    max_rows: the largest block tried (default MAX_BLOCK_ROWS; BLOCK_ROWS gives fixed 2-row blocks).
    """

    name = "gemm-blocks"
    whole_bytes = 0  # always panels: a GEMM over a whole matrix copies (packs) all of it, a GEMV does not

    def __init__(self, threads=1, panel_bytes=PANEL_BYTES, max_rows=MAX_BLOCK_ROWS):
        super().__init__(threads, panel_bytes)
        self.max_rows = max(BLOCK_ROWS, int(max_rows))
        self.limits = {}  # (d_in, width) -> block_limit, probed on first use

    def block_limit(self, d_in, width):
        """The most rows one GEMM over a `[d_in, width]` panel may take (same_bits_rows, probed once per shape)."""
        if (d_in, width) not in self.limits:
            self.limits[d_in, width] = same_bits_rows(d_in, width, self.max_rows)
        return self.limits[d_in, width]

    def blocks(self, n, d_in, width):  # -> (blocks, rows per block)
        """How n rows are cut into blocks for `[d_in, width]` panels: (k, r), k * r >= n, BLOCK_ROWS <= r <= the limit."""
        k = -(-n // self.block_limit(d_in, width))
        return k, max(BLOCK_ROWS, -(-n // k))

    def out_rows(self, n, d_in, width):
        k, r = self.blocks(n, d_in, width)
        return k * r

    def products(self, x, ws, out):  # [n, d_in], [P, d_in, width] -> out [P, k * r, width]
        """One stacked np.matmul: [1, k, r, d_in] @ [P, 1, d_in, width], one GEMM per (panel, block)."""
        n, d_in = x.shape
        k, r = self.blocks(n, d_in, ws.shape[2])
        xb = np.zeros((k * r, d_in), dtype=np.float32)
        xb[:n] = x
        np.matmul(xb.reshape(1, k, r, d_in), ws[:, None], out=out.reshape(out.shape[0], k, r, out.shape[2]))

    def __repr__(self):
        return f"GemmBlocks(threads={self.threads}, max_rows={self.max_rows})"


def same_bits_rows(d_in, width, max_rows=MAX_BLOCK_ROWS, matmul=np.matmul):
    """The most rows m <= max_rows (at least BLOCK_ROWS) for which every GEMM `[k, d_in] @ [d_in, width]` with
    BLOCK_ROWS <= k <= m gives each row the bits that row gets in a 2-row GEMM.

    Probed on seeded random float32 numbers in GemmBlocks' own memory layouts (rows C-contiguous, the panel
    column-major): a BLAS picks its method, and so its order of additions, from the shapes, never from the
    values. OpenBLAS 0.3.31 (SkylakeX kernels) gives 16 for every GPT-2 panel shape (it switches method at
    20-32 rows), 7 to 16 for small ones. A BLAS whose 2-row GEMM already differs by the row's place cannot run
    this kernel invariantly (the result is then BLOCK_ROWS, and tests/test_kernels.py fails there). `matmul` is
    np.matmul (a parameter so that tests can feed a BLAS that breaks the property).
    """
    rng = np.random.default_rng(0)
    w = np.asfortranarray(rng.standard_normal((d_in, width), dtype=np.float32))
    x = rng.standard_normal((max_rows, d_in), dtype=np.float32)
    pairs = [matmul(x[[i, (i + 1) % max_rows]], w)[0] for i in range(max_rows)]  # row i first in a 2-row GEMM
    for m in range(BLOCK_ROWS, max_rows + 1):
        y = matmul(x[:m], w)
        if not all(np.array_equal(y[i], pairs[i]) for i in range(m)):
            return max(BLOCK_ROWS, m - 1)
    return max_rows


def gemm_panels(x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; NOT batch invariant
    """One GEMM per column panel, stacked ("gemm-panels"); plain GEMM when d_out is not a multiple of the width."""
    n, (d_in, d_out) = x.shape[0], w.shape
    width = panel_width(d_in, d_out)
    if d_out % width:
        return gemm(x, w, b)
    y = np.matmul(x[None], panels(w, width)).transpose(1, 0, 2).reshape(n, d_out)  # [P, n, width] -> [n, d_out]
    return y if b is None else y + b


def block_linears(params):
    """Every block's linear layers, `{"w", "b"}` dicts of the tree, in order: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj."""
    for h in params["h"]:
        yield from (h["attn"]["c_attn"], h["attn"]["c_proj"], h["mlp"]["c_fc"], h["mlp"]["c_proj"])


def column_major(params, done=None):
    """Store every block matrix column-major (Fortran order), in place; returns `params`.

    Same values and shapes (`w` stays `[d_in, d_out]`, so `x @ w` is unchanged): only the memory
    order changes, one matrix at a time (peak extra memory: one matrix; a matrix already
    column-major is not copied). Every kernel reads this layout; "gemv-panels" needs it for
    contiguous panels. The head needs nothing: `wte.T` is already column-major.
    done: None, or a function called with each matrix's bytes once it is laid out (a progress bar's update).
    """
    for lin in block_linears(params):
        lin["w"] = fortran_copy(lin["w"])
        if done is not None:
            done(lin["w"].nbytes)
    return params


STRIP_ROWS = 128  # rows per strip of fortran_copy: a strip of a GPT-2 matrix fits in the L2 cache


def fortran_copy(w):  # [m, n] -> [m, n] column-major, the same values
    """`w` if it is already column-major (or not an array: a QuantizedMatrix, npspec.kernels.quantized), else a column-major
    copy, made strip by strip.

    np.asfortranarray's transposing copy walks a large matrix with one stride that misses the cache
    on every element (0.3 GB/s here for gpt2-large's 5120 x 1280); copying STRIP_ROWS rows at a time
    keeps both sides' lines in cache (1 to 1.7 GB/s): loading gpt2-large spends most of its time here.
    """
    if not isinstance(w, np.ndarray) or w.flags.f_contiguous:
        return w
    out = np.empty(w.shape, dtype=w.dtype, order="F")
    rows = out.T  # [n, m] row-major: the same memory
    for i in range(0, w.shape[0], STRIP_ROWS):
        rows[:, i:i + STRIP_ROWS] = w[i:i + STRIP_ROWS].T
    return out
