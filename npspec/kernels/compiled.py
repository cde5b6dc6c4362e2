"""The compiled product "compiled-panels": a numba loop nest, batch invariant by construction (the optional extra `fast`).

Imports numpy, npspec.kernels.products (its threads and thread rule) and, when the kernel is first built, numba: the one
module of npspec that touches numba. `pip install 'npspec[fast]'` installs it; without it `available()` is False
and npspec decodes with its NumPy kernels (npspec.kernels.registry).

The contract: `y[m, n] = sum over k of x[m, k] * w[k, n]` for `x` `[M, d_in]` float32 and `w` `[d_in, d_out]`
float32. Each element is a chain of fused multiply-adds, in this order and no other:
  * s = +0.0; then s = fma(x[m, k], w[k, n], s) for k = 0, 1, ..., d_in - 1 in increasing k, where fma(a, b, c) is
    IEEE 754's fusedMultiplyAdd in float32: a * b + c computed exactly, then rounded once (`numpy_fma` writes it out
    in NumPy); y[m, n] = s.
Why that order is fixed by the code alone, and by nothing else:
  * It is a function of d_in and the values x[m, :], w[:, n] only. The row count M, the other rows, the thread count
    and the split of the columns choose WHICH elements a call computes and in what order the elements are visited,
    never how one element's sum is formed: no element's sum reads another element's partial sums.
  * Rows are handled 8 at a time (`tile8`: a weight loaded once serves eight rows), and the last 1 to 7 in one tile
    of 1, 4, 6 or 8 rows (`tile1`, `tile4`, `tile6`, `tile8`; the rows padded with zero rows to its size), one
    panel at a time; all four add the products of one element in the order above (k innermost, one fma per k and
    row), so a row's bits do not depend on which tile it falls in (tests/test_compiled.py checks every position for
    M = 1..16 and the order itself against NumPy, step by step, in every tile).
  * Every step is an explicit fma (`fused`: LLVM's `llvm.fma.f32`, which must round once wherever it runs): the
    compiler vectorizes the loop over a panel's columns (8 columns per AVX2 instruction, 16 per AVX-512 one) into
    FMA instructions, different elements, each its own chain, and a column left to scalar code gets the same single
    rounding (on a CPU without FMA instructions LLVM calls the C library's `fmaf`, as exact and far slower; the
    kernel probe then picks a NumPy kernel). It may not reorder a chain: numba compiles without fastmath, so LLVM
    gets no `reassoc`, which would let it regroup a sum; `contract`, which would let it fuse a product and an
    addition the code wrote apart, has nothing left to fuse. Those are the only LLVM flags that change the results
    of these operations, and none is set.
  * Why fused: the multiply and the addition written apart take two instructions per weight and row, where one FMA
    instruction does both. On an AMD Zen 4 (AVX-512 run on 256-bit pipes) that raised the kernel's rate at 32 rows
    from 43 to 57 multiply-adds per nanosecond on one core, 84 to 110 on two (bench/results/issue24/README.md,
    section `zen4-fma/`), so that more rows of a verify hide under the weights' read.

Layout: a sum over k in increasing order vectorizes only across columns, so the kernel reads `w` as PANELS: the
columns [p * PANEL, (p + 1) * PANEL) of w stored k-major, `panels[p, k, j] = w[k, p * PANEL + j]` (`pack`; the last
panel padded with zero columns that are computed and dropped). A weight of each k is then contiguous with its
panel's neighbours, and every weight is read from memory once for all M rows (a panel is d_in * PANEL * 4 bytes:
320 KiB at d_in = 1280, which stays in the core's L2 cache for a second tile of rows). A tile keeps its 4 x PANEL
partial sums in vector registers while k runs (`stack_scratch`: 16 of AVX-512's 32 registers at PANEL = 64), so
its loop over k loads one panel row and four x[m, k] and stores nothing; the sums go to y once, at the end. On an
AMD Zen 4 that made a 4-row gpt2-large forward cost 1.05 one-row forwards, against 1.31 when the partial sums went
through memory at every k (bench/results/issue24/README.md). The model keeps its column-major
matrices (the prefill's BLAS GEMM and the other kernels read them); this kernel packs each matrix the first time it
multiplies it, or when a Model is built with it (registry.Kernel.prepare), and keeps the panels (a second copy of
the matrices it multiplies: about the model's size again).
npspec never writes a weight in place after loading, which this cache relies on.

Two hints to the compiler and the CPU, neither of which can change a bit (they choose instructions and when a line
of weights arrives, never an operation or its order):
  * `wide_vectors()` asks LLVM for 512-bit vectors in each tile (`"prefer-vector-width"="512"`). LLVM's tuning for
    Intel's AVX-512 CPUs prefers 256-bit vectors; a tile's 4 x 64 sums are then 32 of the 32 vector registers, and
    LLVM spilled them to the stack at every k. On an Intel Sapphire Rapids (2 cores) the kernel multiplied at 31
    multiply-adds per nanosecond at 32 rows, and a 4-row gpt2-large forward cost 1.5 one-row forwards. A CPU with
    no 512-bit vectors (AVX2) gets its widest; an AMD Zen 4 was given 512-bit vectors already.
  * `prefetch` asks the CPU for each cache line of the panel row AHEAD rows past the one being multiplied. A tile of
    4 or 8 rows spends long enough on each row's arithmetic that the CPU's own prefetchers fell behind the read: on
    the Sapphire Rapids, the products of a 4-row gpt2-large forward took 1.5 times those of one row, 1.1 with the
    hint. It asks for the line into the L2 cache (x86's prefetcht1), 32 rows (8 KiB) ahead: into L1 (prefetcht0)
    at 16 or 8 rows ahead was slower at 8 and 16 rows, and 32 to 128 rows into L2 alike within the noise (scratch
    runs, interleaved). The last rows of a panel ask for the next panel's first ones.
What they and tile8 do to whole forwards: `python -m bench.verify_cost --models random:gpt2-large --threads 2`
(bench/results/issue24/README.md, section `intel/`).

Threads: a product over a matrix of SPLIT_BYTES or more is cut into `threads` runs of whole panels, and the
runs are shared out by numba's `prange` (`panels_runs`) on numba's own threads, the threading layer tried in the
order of LAYERS: OpenMP first. SPLIT_BYTES (512 KiB) is an eighth of the NumPy kernels' kernels.SPLIT_BYTES:
handing a product to numba's spinning threads costs a few microseconds, and one core alone reads memory at about
half the rate two do, so a matrix read from memory is worth sharing out from a few hundred KiB (`python -m
bench.panels`, its table panels_split, times one row's product both ways on matrices of 192 KiB to 4 MiB). At
4 MiB gpt2's and distilgpt2's 768 x 768 c_proj (2.25 MiB) ran on one core, and on the Intel Sapphire Rapids of
bench/results/ gpt2's one-token forward took 21.5 ms against 18.3 with gemv-rows (bench/results/issue24/README.md,
section `intel2/`). Why numba's threads and not npspec's own workers (kernels.Workers, which the NumPy panel
kernels use): a gpt2-large forward hands out 145 products, with layer norms and attention between them, and a
worker that waits on a lock sleeps, so its vCPU must be woken for every product; OpenMP's threads spin for a while
after a parallel region before they sleep, so the next product starts at once. On an AMD Zen 4 that made whole
forwards faster at 1, 4 and 8 rows (bench/results/issue24/README.md; `python -m bench.panels` times both ways). A
target and a draft on this kernel then share one kind of thread. numba's threads are the process's: at most
numba.config.NUMBA_NUM_THREADS run (the machine's CPUs unless NUMBA_NUM_THREADS says otherwise), so more runs than
that are queued on them; the first product with threads > 1 loads the layer, which then stays for the process
(setting NUMBA_THREADING_LAYER picks another). GNU OpenMP is not fork-safe: a process forked (without exec) after that
first product must not use this kernel with threads > 1 (numba stops it with a message). BLAS runs one thread in
its forwards (registry.Kernel.blas_threads). The compiled loops release the GIL (`nogil`). PANEL was chosen by
python -m bench.panels: on a Zen 4, 32 columns were slower at every row count and 96 within a few per cent of 64
(faster at 8 and 16 rows, slower at 2); 64 is the widest whose 4-row tile keeps its sums in AVX-512's registers.

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

from .products import check_threads, run_count, run_cuts


class KernelUnavailable(ValueError):
    """A kernel cannot be built here: its extra is not installed, or installed and broken (a numba that does not
    import). The kernel probe drops such a candidate (npspec.kernels.probe); a kernel the user named raises it."""


PANEL = 64  # columns per panel (module docstring): 4 AVX-512 vectors; python -m bench.panels measured 32, 64 and 96
TAIL = (0, 1, 4, 4, 4, 6, 6, 8)  # the tile that takes the last 0..7 rows (panels_product), by rows left
LINE = 16  # float32 weights in a 64-byte cache line: a tile asks for each line of a panel row once
AHEAD = 32  # panel rows (of PANEL weights) a tile asks the CPU to fetch ahead of the row it multiplies (module docstring)
VECTOR_BITS = 512  # the vector width the tiles ask LLVM to prefer (module docstring: why)
SPLIT_BYTES = 512 << 10  # a matrix this large is shared out to the threads (module docstring: why not kernels')
NOTE_SECONDS = 0.5  # compiling (or loading the cache) longer than this is announced
NAME = "compiled-panels"
ALIGN = 4096  # bytes: where each matrix's panels start (a page: a multiple of every vector and cache-line size)
LAYERS = ("omp", "tbb", "workqueue")  # numba's threading layers, in the order tried (module docstring: why OpenMP)


def available(find_spec=None):
    """True if numba can be imported (the `fast` extra is installed); nothing is imported to find out.
    find_spec: importlib.util.find_spec (a parameter so that tests can pretend numba is missing)."""
    try:
        return (find_spec or importlib.util.find_spec)("numba") is not None
    except ValueError:  # sys.modules["numba"] is None: imports of numba are blocked
        return False


def pack(w, panel=PANEL):  # [d_in, d_out] -> [ceil(d_out / panel), d_in, panel] float32, C order, page-aligned
    """w's columns as panels (module docstring): `panels[p, k, j] = w[k, p * panel + j]`, zero past d_out.
    The full panels are one strided copy (numpy's), the partial last one is zero-padded. The panels start on a page
    (ALIGN bytes), so that no vector load of a panel row straddles two cache lines (numpy's own large arrays start
    16 bytes into a page)."""
    d_in, d_out = w.shape
    full, count = d_out // panel, -(-d_out // panel)
    panels = aligned_empty((count, d_in, panel))
    np.copyto(panels[:full], w[:, : full * panel].reshape(d_in, full, panel).transpose(1, 0, 2))
    if full < count:
        panels[full] = 0.0
        panels[full, :, : d_out - full * panel] = w[:, full * panel :]
    return panels


def aligned_empty(shape, align=ALIGN):  # shape -> uninitialised float32, C order, data at a multiple of align bytes
    """np.empty(shape, float32), but starting at a multiple of `align` bytes (a view into a slightly larger buffer)."""
    size = int(np.prod(shape))
    buffer = np.empty(size + align // 4, dtype=np.float32)
    start = (-buffer.ctypes.data % align) // 4
    return buffer[start : start + size].reshape(shape)


def tile8(x, panel, out):  # x [8, d_in], panel [d_in, PANEL] -> out [rows <= 8, n <= PANEL] = the sums
    """Eight rows against one panel, in two halves of PANEL / 2 columns, the sums in the module docstring's order: k
    runs innermost, each k's weights of the half are loaded once for the eight rows, and the 8 x PANEL / 2 partial
    sums stay in vector registers (16 of AVX-512's 32 at PANEL = 64), as in tile4. A weight serves eight rows where
    tile4's serves four, so a verify of 8 or 16 rows does half the loads per multiply-add. A panel row's two halves
    are different cache lines (PANEL / 2 = 32 weights are two lines), and each half asks for its own lines ahead, so
    the two halves read the panel from memory once between them. A padded tile of 7 rows keeps only out's rows."""
    wide_vectors()
    for h in range(2):
        c0 = h * HALF
        a = scratch(8, HALF)
        for r in range(8):
            for j in range(HALF):
                a[r, j] = 0.0
        for k in range(x.shape[1]):
            for j in range(c0, c0 + HALF, LINE):
                prefetch(panel, k + AHEAD, j)  # a line AHEAD rows on, asked for now: multiplied later
            u0, u1, u2, u3, u4, u5, u6, u7 = x[0, k], x[1, k], x[2, k], x[3, k], x[4, k], x[5, k], x[6, k], x[7, k]
            for j in range(HALF):
                w = panel[k, c0 + j]
                a[0, j] = fma(u0, w, a[0, j])
                a[1, j] = fma(u1, w, a[1, j])
                a[2, j] = fma(u2, w, a[2, j])
                a[3, j] = fma(u3, w, a[3, j])
                a[4, j] = fma(u4, w, a[4, j])
                a[5, j] = fma(u5, w, a[5, j])
                a[6, j] = fma(u6, w, a[6, j])
                a[7, j] = fma(u7, w, a[7, j])
        for r in range(out.shape[0]):
            for j in range(max(0, min(HALF, out.shape[1] - c0))):
                out[r, c0 + j] = a[r, j]


def tile6(x, panel, out):  # x [6, d_in], panel [d_in, PANEL] -> out [rows <= 6, n <= PANEL] = the sums
    """Six rows against one panel, as tile4 (k innermost, each k's PANEL weights loaded once for the six rows), its
    6 x PANEL partial sums in 24 of AVX-512's 32 vector registers, one for a panel row's weights and six for the rows'
    x[m, k]: the most rows a whole panel row serves in one pass with no sum spilled. A verify of 5 or 6 rows (gamma 4
    or 5) then reads each panel once, where a tile of 4 and a second one read it twice."""
    wide_vectors()
    a = scratch(6, PANEL)
    for r in range(6):
        for j in range(PANEL):
            a[r, j] = 0.0
    for k in range(x.shape[1]):
        for j in range(0, PANEL, LINE):
            prefetch(panel, k + AHEAD, j)  # a line AHEAD rows on, asked for now: multiplied later
        u0, u1, u2, u3, u4, u5 = x[0, k], x[1, k], x[2, k], x[3, k], x[4, k], x[5, k]
        for j in range(PANEL):
            w = panel[k, j]
            a[0, j] = fma(u0, w, a[0, j])
            a[1, j] = fma(u1, w, a[1, j])
            a[2, j] = fma(u2, w, a[2, j])
            a[3, j] = fma(u3, w, a[3, j])
            a[4, j] = fma(u4, w, a[4, j])
            a[5, j] = fma(u5, w, a[5, j])
    for r in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[r, j] = a[r, j]


def tile4(x, panel, out):  # x [4, d_in], panel [d_in, PANEL] -> out [rows <= 4, n <= PANEL] = the sums
    """Four rows against one panel, the sums in the module docstring's order: k runs innermost, each k's PANEL weights
    are loaded once for the four rows, and the 4 x PANEL partial sums stay in the CPU's vector registers for the
    whole sum (`scratch`: an array on the stack, which the compiler keeps in registers; 16 of AVX-512's 32 at
    PANEL = 64), so nothing but the weights and x goes to memory until the sums are stored into `out` (the first
    rows and columns of the tile: a padded tile or a partial panel keeps fewer)."""
    wide_vectors()
    a = scratch(4, PANEL)
    for r in range(4):
        for j in range(PANEL):
            a[r, j] = 0.0
    for k in range(x.shape[1]):
        for j in range(0, PANEL, LINE):
            prefetch(panel, k + AHEAD, j)  # a line AHEAD rows on, asked for now: multiplied later
        u0, u1, u2, u3 = x[0, k], x[1, k], x[2, k], x[3, k]
        for j in range(PANEL):
            w = panel[k, j]
            a[0, j] = fma(u0, w, a[0, j])
            a[1, j] = fma(u1, w, a[1, j])
            a[2, j] = fma(u2, w, a[2, j])
            a[3, j] = fma(u3, w, a[3, j])
    for r in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[r, j] = a[r, j]


def tile1(x, panel, out):  # x [1, d_in], panel [d_in, PANEL] -> out [1, n <= PANEL] = the sums
    """One row against one panel, in the same order as tile4's rows, its PANEL sums in registers as there."""
    wide_vectors()
    a = scratch(1, PANEL)
    for j in range(PANEL):
        a[0, j] = 0.0
    for k in range(x.shape[1]):
        for j in range(0, PANEL, LINE):
            prefetch(panel, k + AHEAD, j)
        u = x[0, k]
        for j in range(PANEL):
            a[0, j] = fma(u, panel[k, j], a[0, j])
    for j in range(out.shape[1]):
        out[0, j] = a[0, j]


def panels_product(x, panels, y, p0, p1):  # [M, d_in], [n_panels, d_in, PANEL], out [M, d_out]; panels p0 <= p < p1
    """y[:, p0 PANEL : p1 PANEL] (clipped to d_out) = x @ w over those panels, each element in the module docstring's
    order.

    Panel by panel, so that a panel is read from memory once and from the core's L2 cache for the row tiles after the
    first. Rows go 8 at a time (tile8), and the last 1 to 7 in one tile (TAIL: tile1, tile4, tile6 or tile8), padded
    with zero rows to its size; the padded rows' sums are dropped, and rows never mix, so the padding changes no bit of
    the others.
    """
    m_rows, d_in = x.shape
    d_out = y.shape[1]
    full = m_rows - m_rows % 8
    size = TAIL[m_rows - full]
    tail = np.zeros((size, d_in), dtype=np.float32)  # the last tile's rows, padded
    tail[: m_rows - full] = x[full:]
    for p in range(p0, p1):
        n0 = p * PANEL
        n1 = min(n0 + PANEL, d_out)
        for m in range(0, full, 8):
            tile8(x[m : m + 8], panels[p], y[m : m + 8, n0:n1])
        if size == 8:
            tile8(tail, panels[p], y[full:, n0:n1])
        elif size == 6:
            tile6(tail, panels[p], y[full:, n0:n1])
        elif size == 4:
            tile4(tail, panels[p], y[full:, n0:n1])
        elif size == 1:
            tile1(tail, panels[p], y[full:, n0:n1])


def panels_runs(x, panels, y, cuts):  # [M, d_in], [n_panels, d_in, P], out [M, d_out], [runs + 1] int64
    """panels_product over each run of panels [cuts[i], cuts[i + 1]), the runs shared out by numba's prange over
    numba's threads (numba.set_num_threads of the calling thread, which is one of them). Which thread computes a run
    changes no bit."""
    for i in prange(len(cuts) - 1):  # noqa: F821 (numba.prange, given by compiled_runs)
        panels_product(x, panels, y, cuts[i], cuts[i + 1])


def numpy_fma(a, b, c):  # float32 arrays (or scalars), broadcast -> float32: a * b + c rounded once
    """IEEE 754's fusedMultiplyAdd in float32, written out in NumPy: a * b + c computed exactly, then rounded once to
    the nearest float32 (ties to even), for finite a, b, c whose result is finite. The tiles' fma where they run as
    plain Python (a stand-in njit in the tests), and the reference tests/test_compiled.py holds the compiled
    `llvm.fma.f32` to.

    How it is exact: a float32 product has at most 48 significant bits, so a * b is exact in float64; the float64 sum
    hi = a * b + c is rounded, and its error lo is exact too (Knuth's TwoSum), so the true value is hi + lo. Rounding
    hi to float32 then rounds hi + lo correctly, unless hi fell exactly halfway between two float32 values while
    lo is not 0: then the true value lies on lo's side of that midpoint, and the neighbour on that side is the answer
    (rounding hi alone would round twice, and break the tie to even instead)."""
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    hi = p + c
    back = hi - p
    lo = (p - (hi - back)) + (c - back)  # hi + lo == p + c exactly (TwoSum)
    f = hi.astype(np.float32)
    g = np.nextafter(f, np.where(hi > f, np.inf, -np.inf).astype(np.float32))  # f's neighbour on hi's side
    tie = (hi != f) & (hi == (f.astype(np.float64) + g) / 2)  # hi exactly halfway between f and g
    toward_g = np.sign(lo) == np.sign(g.astype(np.float64) - f)
    return np.where(tie & (lo != 0) & toward_g, g, f).astype(np.float32)


def fused(numba):  # -> numba intrinsic fma(a, b, c) -> float32, a * b + c rounded once
    """A numba intrinsic: `fma(a, b, c)` for float32 a, b, c is one call of LLVM's `llvm.fma.f32` (IEEE 754
    fusedMultiplyAdd: rounded once, whatever the target machine; an FMA instruction where the CPU has one, which
    the loop vectorizer widens to whole vectors). Any other argument types are a typing error."""
    from llvmlite import ir

    f32 = numba.types.float32

    @numba.extending.intrinsic
    def fma(typingctx, a, b, c):
        if not a == b == c == f32:
            return None

        def codegen(context, builder, signature, args):
            return builder.call(builder.module.declare_intrinsic("llvm.fma", [ir.FloatType()] * 3), args)
        return f32(a, b, c), codegen
    return fma


def cache_line(numba):  # -> numba intrinsic prefetch(a, i, j): asks the CPU for the cache line of a[i, j]
    """A numba intrinsic: `prefetch(a, i, j)` for a 2-D array `a` and integers i, j is one call of LLVM's
    `llvm.prefetch` (read, locality 2: into the L2 cache, x86's prefetcht1; data) at the address of a[i, j], from a's
    own strides. It is a hint: it loads nothing into a variable and changes no value. A tile's last AHEAD rows ask for
    the next panel's first rows, and the last panel's for addresses past the array's end, which a prefetch neither
    faults on nor reads into anything; where a CPU has no prefetch instruction LLVM drops it."""
    from llvmlite import ir
    from numba.core import cgutils

    @numba.extending.intrinsic
    def prefetch(typingctx, a, i, j):
        if not (isinstance(a, numba.types.Array) and a.ndim == 2 and all(isinstance(t, numba.types.Integer)
                                                                          for t in (i, j))):
            return None

        def codegen(context, builder, signature, args):
            array_type, (array, row, column) = signature.args[0], args
            array = context.make_array(array_type)(context, builder, array)
            index = [context.cast(builder, v, t, numba.types.intp) for v, t in zip((row, column), signature.args[1:])]
            strides = cgutils.unpack_tuple(builder, array.strides, 2)
            offset = builder.add(builder.mul(index[0], strides[0]), builder.mul(index[1], strides[1]))
            byte = ir.IntType(8)
            address = builder.gep(builder.bitcast(array.data, byte.as_pointer()), [offset])
            i32 = ir.IntType(32)
            hint = ir.FunctionType(ir.VoidType(), [byte.as_pointer(), i32, i32, i32])
            call = builder.module.declare_intrinsic("llvm.prefetch", [byte.as_pointer()], hint)
            builder.call(call, [address, i32(0), i32(2), i32(1)])  # read, locality 2 (L2), data cache
            return context.get_dummy_value()
        return numba.types.void(a, i, j), codegen
    return prefetch


def vector_width(numba, bits=VECTOR_BITS):  # -> numba intrinsic wide_vectors(): the caller prefers `bits` vectors
    """A numba intrinsic: `wide_vectors()` marks the function that calls it with LLVM's `"prefer-vector-width"`
    attribute set to `bits` (module docstring: why). It changes which instructions LLVM picks for the function, never
    a result (each element is its own chain of fma's whatever the vector width); on a CPU without vectors that wide,
    LLVM uses its widest. llvmlite's attribute sets name only LLVM's keyword attributes, so this string attribute is
    added to the set as it is (printed into the IR as `"prefer-vector-width"="512"`)."""

    @numba.extending.intrinsic
    def wide_vectors(typingctx):
        def codegen(context, builder, signature, args):
            set.add(builder.function.attributes, f'"prefer-vector-width"="{bits}"')
            return context.get_dummy_value()
        return numba.types.void(), codegen
    return wide_vectors


def numpy_prefetch(a, i, j):  # the tiles' prefetch where they run as plain Python: nothing to ask for
    """prefetch's stand-in for the plain-Python tiles (tests): a hint, so doing nothing is the same computation."""


def numpy_wide_vectors():  # the tiles' wide_vectors where they run as plain Python: no vectors to choose
    """wide_vectors' stand-in for the plain-Python tiles (tests): it chooses instructions, never values."""


_compiled = {}  # the compiled dispatchers of this process (numba's, like its own caches), built on first use


def numpy_scratch(rows, cols):  # -> [rows, cols] float32 (uninitialised)
    """The tiles' scratch array where they run as plain Python (a stand-in njit in the tests): an ordinary array."""
    return np.empty((rows, cols), dtype=np.float32)


def stack_scratch(numba):  # -> numba intrinsic scratch(rows, cols) -> [rows, cols] float32 C array on the stack
    """A numba intrinsic: `scratch(rows, cols)`, rows and cols compile-time ints, is an uninitialised float32 C-order
    array in the calling function's own stack frame (one LLVM `alloca` of rows * cols floats in its entry block).
    Unlike np.empty (a heap allocation LLVM cannot see into), the optimiser can see every use of it: once the loops
    over its columns are unrolled and vectorized, it keeps the array in vector registers for as long as the loop over
    k runs (tile4's accumulators). It may only be used inside the function that calls it."""
    from numba.core import cgutils
    from numba.np.arrayobj import populate_array

    ints = numba.types.IntegerLiteral

    @numba.extending.intrinsic
    def scratch(typingctx, rows, cols):
        if not (isinstance(rows, ints) and isinstance(cols, ints)):
            return None  # numba then asks again with the arguments' literal values (PANEL, a global, is one)
        r, c = rows.literal_value, cols.literal_value
        array = numba.types.Array(numba.types.float32, 2, "C")

        def codegen(context, builder, signature, args):
            data = cgutils.alloca_once(builder, context.get_value_type(numba.types.float32), size=r * c)
            out = context.make_array(array)(context, builder)
            intp = context.get_value_type(numba.types.intp)
            populate_array(out, data=data, shape=[intp(r), intp(c)], strides=[intp(4 * c), intp(4)],
                           itemsize=intp(4), meminfo=None)
            return out._getvalue()
        return array(rows, cols), codegen
    return scratch


def tile_names(numba, panel=PANEL):  # numba module or None, int -> {name: object} the tiles' code reads
    """The globals the tiles are compiled with: numba's intrinsics (scratch, fma, prefetch, wide_vectors), or with
    `numba` None their plain-Python stand-ins (numpy_scratch, ...), the panel's width and half width, and TAIL."""
    if numba is None:
        helpers = (numpy_scratch, numpy_fma, numpy_prefetch, numpy_wide_vectors)
    else:
        helpers = (stack_scratch(numba), fused(numba), cache_line(numba), vector_width(numba))
    names = dict(zip(("scratch", "fma", "prefetch", "wide_vectors"), helpers))
    return {**names, "PANEL": panel, "HALF": panel // 2, "TAIL": TAIL}


def compiled_product(note=None, njit=None, panel=PANEL):
    """The compiled `panels_product(x, panels, y, p0, p1)` for panels of `panel` columns, built once per process and
    width (numba's disk cache makes later processes load it; only PANEL's is cached on disk: numba's cache does not
    tell the widths apart).

    note: None, or a function given a one-line message when compiling took over NOTE_SECONDS (not when numba's cache
    was loaded), and when no cache location is writable (then every process compiles). njit: numba.njit (a parameter
    so that tests can give a stand-in, with which the tiles run as plain Python over tile_names(None)'s stand-ins).
    Raises ValueError (errors.KernelUnavailable: one line, with the fix) if numba is not installed or does not import
    (import_problem), and for an odd `panel` (tile8 splits a panel in two halves).
    """
    if panel % 2:
        raise ValueError(f"a panel of compiled-panels has an even number of columns (tile8 halves it), got {panel}")
    if ("product", panel) in _compiled:
        return _compiled["product", panel]
    if njit is None:
        try:
            import numba  # lazily: the module docstring says why
        except ImportError as e:
            raise KernelUnavailable(import_problem(e, available())) from None
        njit, names = numba.njit, tile_names(numba, panel)
    else:
        names = tile_names(None, panel)
    disk = panel == PANEL  # numba's cache keys a function by its code, not by the PANEL it was given
    start = time.perf_counter()  # after numba's import: what is announced is compiling (or loading the cache)
    product, cached = jit_product(njit, names, disk)
    x = np.zeros((1, 2), dtype=np.float32)
    product(x, np.zeros((1, 2, panel), dtype=np.float32), np.zeros((1, 1), dtype=np.float32), 0, 1)  # compiles
    announce(note, time.perf_counter() - start, cached, product, disk)
    _compiled["product", panel], _compiled["cached", panel] = product, cached
    return product


def import_problem(error, installed):  # ImportError, bool -> str
    """The one-line message for numba's import failing with `error`: missing (`installed` False: nothing named numba
    to import), or installed and broken (a numba built for another numpy or Python, a half-removed install), which
    names numba's own first line of the error and a reinstall as the fix."""
    other = "or pick a NumPy kernel with --target-kernel / --draft-kernel"
    if not installed:
        return f"kernel {NAME} needs numba: pip install 'npspec[fast]' ({other})"
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (f"kernel {NAME}: numba is installed but does not import ({first}); reinstall it with pip install "
            f"--force-reinstall 'npspec[fast]' ({other})")


def announce(note, seconds, cached, dispatcher, disk=True):
    """Tell `note` (None: nobody) that compiling took `seconds` (over NOTE_SECONDS, not a load from numba's cache, which
    is silent), or that it compiled in memory because no cache location was writable (`cached` False although `disk`
    asked for numba's disk cache; a build with `disk` False, another panel width, is only announced when slow)."""
    if note is not None and disk and not cached:
        note(f"kernel {NAME}: no writable cache location for numba, so it compiled in memory ({seconds:.1f} s, "
             "again in every process); set NUMBA_CACHE_DIR to a writable directory to compile once")
    elif note is not None and seconds > NOTE_SECONDS and not getattr(getattr(dispatcher, "stats", None),
                                                                     "cache_hits", 0):
        once = "once: numba caches it on disk" if cached else f"for this process: only {PANEL}-column panels are cached"
        note(f"kernel {NAME}: compiled in {seconds:.1f} s ({once})")  # a cache load is silent


def jit_product(njit, names, disk=True):
    """(compiled panels_product, whether numba caches it on disk): the tiles compiled first (with `names` among their
    globals: scratch, fma and PANEL), then the loop that calls them; on disk unless `disk` is False or no cache
    location is writable (numba's RuntimeError at decoration: then compiled for this process only)."""
    for cache in (True, False) if disk else (False,):
        try:
            jit = njit(nogil=True, cache=cache, boundscheck=False)
            helpers = {f.__name__: jit(with_globals(f, names)) for f in (tile8, tile6, tile4, tile1)}
            return jit(with_globals(panels_product, {**helpers, **names})), cache
        except RuntimeError:  # numba: "cannot cache function ...: no locator available" (nowhere writable)
            if not cache:
                raise


def compiled_runs(note=None, layers=LAYERS, panel=PANEL):
    """(`runs(x, panels, y, cuts, threads)`: the compiled panels_runs on `threads` of numba's threads, the most threads
    it may be given: numba's NUMBA_NUM_THREADS), built once per process and panel width, announced through `note` as
    compiled_product is.

    layers: numba's threading layers to try, in order (module docstring); one layer alone must load or numba raises.
    They are numba's setting for the whole process and count only until numba first starts its threads, so the
    first caller's order holds. Raises ValueError (one line, with the fix) without numba."""
    if ("runs", panel) not in _compiled:
        product = compiled_product(note, panel=panel)
        import numba  # lazily (module docstring); compiled_product has raised if numba is missing
        numba.config.THREADING_LAYER_PRIORITY = list(layers) + [n for n in LAYERS if n not in layers]
        if len(layers) == 1 and numba.config.THREADING_LAYER == "default":
            numba.config.THREADING_LAYER = layers[0]  # one layer asked for (the bench's --layer): that one or an error
        start = time.perf_counter()
        cached = _compiled["cached", panel]
        names = {"prange": numba.prange, "panels_product": product}
        compiled_ = numba.njit(parallel=True, nogil=True, cache=cached)(with_globals(panels_runs, names))
        x, cuts = np.zeros((1, 2), dtype=np.float32), np.array([0, 1], dtype=np.int64)
        compiled_(x, np.zeros((1, 2, panel), dtype=np.float32), np.zeros((1, 1), dtype=np.float32), cuts)  # compiles
        announce(note, time.perf_counter() - start, cached, compiled_, disk=panel == PANEL)

        def runs(x, panels, y, cuts, threads):  # numba's thread count is the calling thread's own setting
            numba.set_num_threads(threads)
            compiled_(x, panels, y, cuts)
        _compiled["runs", panel] = runs, numba.config.NUMBA_NUM_THREADS
    return _compiled["runs", panel]


def with_globals(f, names):
    """A copy of function `f` whose globals also hold `names` (the compiled helpers it calls), so that numba
    compiles calls to them; the module's own plain functions stay plain Python."""
    return types.FunctionType(f.__code__, {**f.__globals__, **names}, f.__name__, f.__defaults__, f.__closure__)


class CompiledPanels:
    """The "compiled-panels" kernel `linear(x, w, b=None)`: `[n, d_in], [d_in, d_out], [d_out] -> [n, d_out]` float32.

    threads: a positive int, the runs of whole panels a matrix of SPLIT_BYTES or more is cut into, shared out
    over min(threads, numba's NUMBA_NUM_THREADS) of numba's threads (module docstring); results never depend on it.
    note: passed to compiled_product. panel: columns per panel (the bench varies it). layers: numba's threading layers
    to try (compiled_runs; the bench varies it). Each matrix is packed on its first product and its panels kept with
    how they are shared out (`plan`), keyed by its memory (data address, shape, strides; the matrix itself is kept
    too, so that address is never reused while the panels live). Raises ValueError for a bad thread count or without
    numba.
    """

    name = NAME

    def __init__(self, threads=1, note=None, panel=PANEL, layers=LAYERS):
        self.threads = check_threads(threads)
        self.panel = panel
        self.product = compiled_product(note, panel=panel)
        self.runs, self.most_threads = compiled_runs(note, layers, panel) if self.threads > 1 else (None, 1)
        self.packed = {}  # (address, shape, strides) -> (w, its panels, their cuts or None, numba threads)

    def prepare(self, matrices):
        """Pack each of `matrices` (`[d_in, d_out]` float32) now (registry.Kernel.prepare: a Model calls it when it is
        built, so that its first decoding forward does not pay for the packing)."""
        for w in matrices:
            self.entry(w)

    def entry(self, w):  # [d_in, d_out] -> (w, [n_panels, d_in, panel], [runs + 1] int64 or None, threads)
        """w's entry in `self.packed`, made on its first call: its panels and how a product shares them out (`plan`)."""
        key = (w.__array_interface__["data"][0], w.shape, w.strides)
        if key not in self.packed:
            panels = pack(w, self.panel)
            self.packed[key] = (w, panels, *self.plan(panels.shape[0], w.nbytes))
        return self.packed[key]

    def plan(self, count, nbytes):  # panels, bytes of the matrix -> ([runs + 1] int64 cuts or None, numba threads)
        """How a product over `count` panels of an `nbytes` matrix is shared out: None (one call, this thread) below
        SPLIT_BYTES or at one thread (kernels.run_count), else the cuts of those runs (kernels.run_cuts) and the
        numba threads that take them (at most numba's NUMBA_NUM_THREADS)."""
        runs = run_count(self.threads, count, nbytes, SPLIT_BYTES)
        if runs == 1:
            return None, 1
        return np.array(run_cuts(count, runs), dtype=np.int64), min(runs, self.most_threads)

    def __call__(self, x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]
        x = np.ascontiguousarray(x, dtype=np.float32)
        _, panels, cuts, threads = self.entry(w)
        y = np.empty((x.shape[0], w.shape[1]), dtype=np.float32)
        if cuts is None:
            self.product(x, panels, y, 0, panels.shape[0])
        else:
            self.runs(x, panels, y, cuts, threads)
        return y if b is None else y + b

    def __repr__(self):
        return f"CompiledPanels(threads={self.threads})"
