"""`CompiledPanels`: packs each matrix into page-aligned panels, `panels[p, k, j] = w[k, p * PANEL + j]` (a copy of
the weights it keeps, or a `Packed` matrix that replaces them in a Model's tree), and runs the compiled loop on them. Imports
numpy, npspec.kernels.workers and npspec.kernels.compiled.{build, tiles}.
"""

import weakref

import numpy as np

from ..workers import check_threads, run_count, run_cuts
from .build import LAYERS, NAME, compiled_product, compiled_runs
from .tiles import PANEL

SPLIT_BYTES = 512 << 10  # a matrix this large is shared out to numba's threads (notes/kernels.md)
ALIGN = 4096  # bytes: where each matrix's panels start (a page: a multiple of every vector and cache-line size)


def pack(w, panel=PANEL):  # [d_in, d_out] -> [ceil(d_out / panel), d_in, panel] float32, C order, page-aligned
    d_in, d_out = w.shape
    full, count = d_out // panel, -(-d_out // panel)
    panels = aligned_empty((count, d_in, panel))
    np.copyto(panels[:full], w[:, : full * panel].reshape(d_in, full, panel).transpose(1, 0, 2))
    if full < count:
        panels[full] = 0.0
        panels[full, :, : d_out - full * panel] = w[:, full * panel :]
    return panels


def aligned_empty(shape, align=ALIGN):  # shape -> uninitialised float32, C order, data at a multiple of align bytes
    size = int(np.prod(shape))
    buffer = np.empty(size + align // 4, dtype=np.float32)
    start = (-buffer.ctypes.data % align) // 4
    return buffer[start : start + size].reshape(shape)


SHARED = weakref.WeakValueDictionary()  # (address, shape, strides, panel) -> Packed of an array a kernel still keeps


class Packed:
    """A `[d_in, d_out]` float32 matrix held only as its panels (`pack`'s), standing for it in a Model's tree when it
    decodes with a compiled kernel; `np.asarray(p)` gives the matrix back, column-major (a new array, the same
    values). `shape`, `size`, `nbytes`, `dtype` as an array's."""

    dtype = np.dtype(np.float32)

    def __init__(self, panels, shape, source=None):  # ValueError (one line) unless panels are pack's for `shape`
        self.panels, self.shape, self.source = checked_panels(panels, shape), tuple(shape), source  # source: if kept
        self.plans = {}  # threads -> (cuts or None, numba threads), planned once

    @property
    def size(self):
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self):
        return self.panels.nbytes

    def __array__(self, dtype=None, copy=None):  # -> [d_in, d_out] float32, column-major
        d_in, d_out = self.shape
        panel = self.panels.shape[2]
        w = np.empty(self.shape, dtype=np.float32, order="F")
        for p in range(self.panels.shape[0]):
            w[:, p * panel : min(p * panel + panel, d_out)] = self.panels[p, :, : min(panel, d_out - p * panel)]
        return w if dtype is None else w.astype(dtype, copy=False)

    def __repr__(self):
        return f"Packed(shape={self.shape}, panels={self.panels.shape[0]})"


class CompiledPanels:
    """`linear(x, w, b=None)`: `[n, d_in], [d_in, d_out], [d_out] -> [n, d_out]` float32, batch invariant.

    threads: the runs a matrix of SPLIT_BYTES or more is cut into, on numba's threads; no bit depends on it. Panels
    are kept by the matrix's address, shape and strides, so a matrix changed in place after its first product keeps
    its old panels: pass a new array (or pack it again). Raises ValueError for a bad thread count or panel,
    KernelUnavailable."""

    name = NAME

    def __init__(self, threads=1, panel=PANEL, layers=LAYERS):
        self.threads = check_threads(threads)
        self.panel = panel
        self.product = compiled_product(panel=panel)
        self.runs, self.most_threads = compiled_runs(layers, panel) if self.threads > 1 else (None, 1)
        self.packed = {}  # (address, shape, strides) -> (w, its panels, their cuts or None, numba threads)
        self.held = {}  # the same keys -> their Packed (SHARED's entries)

    def prepare(self, matrices):  # [d_in, d_out] float32 each: packed now, not in the first decoding forward
        for w in matrices:
            if not isinstance(w, Packed):
                self.entry(w)

    def pack(self, w):  # [d_in, d_out] float32 -> Packed, the panels its products read (a Packed as it is)
        return w if isinstance(w, Packed) else Packed(pack(w, self.panel), w.shape)

    def entry(self, w):  # [d_in, d_out] -> (w, [n_panels, d_in, panel], [runs + 1] int64 or None, threads)
        """Panels another CompiledPanels made of the same memory and keeps (SHARED; the array packed is alive,
        so the memory was not reused) are used, not made again: a self-draft's head is the target's."""
        key = (w.__array_interface__["data"][0], w.shape, w.strides)
        if key not in self.packed:
            shared = SHARED.get((key, self.panel))
            packed = shared if shared is not None else Packed(pack(w, self.panel), w.shape, w)  # its source alive
            SHARED[key, self.panel] = packed
            self.held[key] = packed  # what keeps it in SHARED
            self.packed[key] = (w, packed.panels, *self.plan(packed.panels.shape[0], w.nbytes))
        return self.packed[key]

    def plan(self, count, nbytes):  # panels, bytes of the matrix -> ([runs + 1] int64 cuts or None, numba threads)
        runs = run_count(self.threads, count, nbytes, SPLIT_BYTES)
        if runs == 1:
            return None, 1
        return np.array(run_cuts(count, runs), dtype=np.int64), min(runs, self.most_threads)

    def __call__(self, x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]
        x = checked_rows(x, w)
        if isinstance(w, Packed):
            if w.panels.shape[2] != self.panel:
                raise ValueError(f"a matrix packed in {w.panels.shape[2]}-column panels, this kernel's are {self.panel}")
            panels = w.panels
            if self.threads not in w.plans:
                w.plans[self.threads] = self.plan(panels.shape[0], 4 * w.size)
            cuts, threads = w.plans[self.threads]
        else:
            _, panels, cuts, threads = self.entry(w)
        y = np.empty((x.shape[0], w.shape[1]), dtype=np.float32)
        if cuts is None:
            self.product(x, panels, y, 0, panels.shape[0])
        else:
            self.runs(x, panels, y, cuts, threads)
        return y if b is None else y + b

    def __repr__(self):
        return f"CompiledPanels(threads={self.threads}, panel={self.panel})"


def checked_panels(panels, shape):  # -> panels, checked to be pack's of a `shape` ([d_in, d_out]) matrix
    """Raise ValueError (one line) unless panels are float32, C order, [ceil(d_out / panel), d_in, panel]: the
    compiled loops read every panel to d_in rows and `panel` columns, so any other layout is read past its end."""
    if not (isinstance(panels, np.ndarray) and panels.dtype == np.float32 and panels.ndim == 3
            and panels.flags.c_contiguous and panels.shape[2] > 0):
        kind = (f"{panels.dtype} {list(panels.shape)}" if isinstance(panels, np.ndarray) else type(panels).__name__)
        raise ValueError(f"panels must be float32 [n_panels, d_in, panel] in C order (pack(w, panel)), got {kind}")
    count, d_in, panel = panels.shape
    if len(shape) != 2 or shape[0] != d_in or count != -(-shape[1] // panel) or shape[1] < 0:
        raise ValueError(f"panels {list(panels.shape)} do not hold a {list(shape)} matrix: pack(w, panel) of a "
                         "[d_in, d_out] w gives [ceil(d_out / panel), d_in, panel]")
    return panels


def checked_rows(x, w):  # -> x as a C-contiguous float32 [n, d_in]
    """Raise ValueError (one line) unless x is [n, d_in] for w's [d_in, d_out]: the compiled loops read x's rows to
    d_in, so a shorter row would be read past its end."""
    if len(getattr(w, "shape", ())) != 2:
        raise ValueError(f"w must be a [d_in, d_out] float32 matrix (or pack's Packed), got "
                         f"{type(w).__name__} of shape {list(getattr(w, 'shape', []))}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"x must be [n, {w.shape[0]}] to multiply a {list(w.shape)} matrix, got {list(x.shape)}")
    return x
