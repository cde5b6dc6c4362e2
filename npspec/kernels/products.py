"""The NumPy products: `linear(x, w, b=None)`, `[n, d_in], [d_in, d_out], [d_out] -> [n, d_out]` float32.

A kernel is INVARIANT when row i of its result is bit-identical to its result for `x[i:i+1]`, whatever the other
rows hold (He et al., "Defeating Nondeterminism in LLM Inference", 2025): "gemv-rows", "gemv-panels" and
"gemm-blocks" (on a BLAS property it probes) are, "gemm" and "gemm-panels" not (notes/kernels.md). Imports numpy
and npspec.kernels.{layout, workers}.
"""

import numpy as np

from .layout import PANEL_BYTES, WHOLE_BYTES, panel_width, panels
from .workers import Workers, check_threads, run_count, run_cuts

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


class PanelKernel:
    """A product column panel by column panel, a matrix of SPLIT_BYTES or more cut into `threads` runs for its own
    Workers. Subclasses give `whole_bytes`, `out_rows` and `products(x, ws, out)`: `x @ ws[p]` into `out[p]` by calls
    whose shapes depend on the panel shape and row count only, so no bit depends on `threads` (tests/test_kernels.py).
    Raises ValueError for a bad thread count. panel_bytes: the panel size `panel_width` aims at."""

    name = ""
    whole_bytes = WHOLE_BYTES  # a matrix this small is one panel

    def __init__(self, threads=1, panel_bytes=PANEL_BYTES):
        self.threads = check_threads(threads)
        self.panel_bytes = panel_bytes
        self.workers = Workers(self.threads - 1) if self.threads > 1 else None

    def out_rows(self, n, d_in, width):  # -> rows of the output buffer for n rows: n, or n padded to whole blocks
        return n

    def products(self, x, ws, out):  # [n, d_in], [P, d_in, width] -> out [P, out_rows(n), width]
        raise NotImplementedError

    def __call__(self, x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]
        """Panel-major; if the width does not divide d_out, one more panel covers the last `width` columns."""
        n, (d_in, d_out) = x.shape[0], w.shape
        width = panel_width(d_in, d_out, self.panel_bytes, self.whole_bytes)
        ws = panels(w, width)  # [P, d_in, width]
        p, main = ws.shape[0], ws.shape[0] * width
        y = np.empty((p, self.out_rows(n, d_in, width), width), dtype=np.float32)
        threads = run_count(self.threads, p, w.nbytes, SPLIT_BYTES)
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
    """"gemv-panels": for each column panel of w, every row's GEMV (batch invariant by construction)."""

    name = "gemv-panels"

    def products(self, x, ws, out):  # [n, d_in], [P, d_in, width] -> out [P, n, width]; a GEMV per (panel, row)
        np.matmul(x[None, :, None, :], ws[:, None], out=out[:, :, None, :])


class GemmBlocks(PanelKernel):
    """"gemm-blocks": n rows in k = ceil(n / limit) blocks of r = max(BLOCK_ROWS, ceil(n / k)) rows (zero rows pad the
    last), one GEMM `[r, d_in] @ [d_in, width]` per (panel, block); limit: the most rows (at most max_rows) for which
    this BLAS gives every row its 2-row GEMM bits (`same_bits_rows`, probed once per panel shape)."""

    name = "gemm-blocks"
    whole_bytes = 0  # always panels: a GEMM over a whole matrix copies (packs) all of it, a GEMV does not

    def __init__(self, threads=1, panel_bytes=PANEL_BYTES, max_rows=MAX_BLOCK_ROWS):
        super().__init__(threads, panel_bytes)
        self.max_rows = max(BLOCK_ROWS, int(max_rows))
        self.limits = {}  # (d_in, width) -> block_limit, probed on first use

    def block_limit(self, d_in, width):  # -> the most rows of one GEMM over a [d_in, width] panel (probed once)
        if (d_in, width) not in self.limits:
            self.limits[d_in, width] = same_bits_rows(d_in, width, self.max_rows)
        return self.limits[d_in, width]

    def blocks(self, n, d_in, width):  # -> (k blocks, r rows each), k * r >= n, BLOCK_ROWS <= r <= the limit
        k = -(-n // self.block_limit(d_in, width))
        return k, max(BLOCK_ROWS, -(-n // k))

    def out_rows(self, n, d_in, width):
        k, r = self.blocks(n, d_in, width)
        return k * r

    def products(self, x, ws, out):  # [n, d_in], [P, d_in, width] -> out [P, k * r, width]; a GEMM per (panel, block)
        n, d_in = x.shape
        k, r = self.blocks(n, d_in, ws.shape[2])
        xb = np.zeros((k * r, d_in), dtype=np.float32)
        xb[:n] = x
        np.matmul(xb.reshape(1, k, r, d_in), ws[:, None], out=out.reshape(out.shape[0], k, r, out.shape[2]))

    def __repr__(self):
        return f"GemmBlocks(threads={self.threads}, max_rows={self.max_rows})"


def same_bits_rows(d_in, width, max_rows=MAX_BLOCK_ROWS, matmul=np.matmul):
    """The most rows m <= max_rows (at least BLOCK_ROWS) for which every GEMM `[k, d_in] @ [d_in, width]`, BLOCK_ROWS
    <= k <= m, gives each row its 2-row GEMM bits, on seeded random numbers in GemmBlocks' layouts. matmul: np.matmul."""
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
    """One GEMM per column panel, stacked ("gemm-panels"); plain GEMM if d_out is not a multiple of the width."""
    n, (d_in, d_out) = x.shape[0], w.shape
    width = panel_width(d_in, d_out)
    if d_out % width:
        return gemm(x, w, b)
    y = np.matmul(x[None], panels(w, width)).transpose(1, 0, 2).reshape(n, d_out)  # [P, n, width] -> [n, d_out]
    return y if b is None else y + b
