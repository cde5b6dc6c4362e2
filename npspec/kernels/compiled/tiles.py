"""The loop nest for 512-bit vectors (AVX-512): tiles of 8, 6, 4 or 1 rows against a panel, all `make_tile`'s one
body, so every element is the same chain of fma's in increasing k wherever its row falls (notes/kernels.md); and
panels_product, which runs either nest's tiles (blocks.py's too). The intrinsics, the tiles and PANEL come as
globals from build. Imports numpy and intrinsics.AHEAD.
"""

import numpy as np

from .intrinsics import AHEAD  # panel rows ahead of the row multiplied whose cache lines a tile asks for

PANEL = 64  # columns per panel: 4 AVX-512 vectors
TAIL = (0, 1, 4, 4, 4, 6, 6, 8)  # rows of the tile that takes the last 0..7 rows, by rows left
PARTS = {8: 2, 6: 1, 4: 1, 1: 1}  # rows of a tile -> the column runs it splits a panel into (tile8: two halves)
LINE = 16  # float32 weights in a 64-byte cache line: a tile asks for each line of a panel row once


def tiles(panel=PANEL):  # -> {"tile8", "tile6", "tile4", "tile1": tile(x, panels, p, out)} for `panel`-column panels
    return {f"tile{rows}": make_tile(rows, parts, panel // parts) for rows, parts in PARTS.items()}


def make_tile(rows, parts, width):  # -> tile(x [rows, d_in], panels [n, d_in, parts * width], p, out [<= rows, <=])
    """panels[p]'s tile of `rows` rows, its columns in `parts` runs of `width` (constants of the closure numba
    compiles): k innermost, each weight loaded once for all rows, the sums in `scratch` until stored into out's first
    rows."""
    def tile(x, panels, p, out):
        wide_vectors()
        panel = panels[p]
        for h in range(parts):
            c0 = h * width
            a = scratch(rows, width)
            for r in range(rows):
                for j in range(width):
                    a[r, j] = 0.0
            for k in range(x.shape[1]):
                for j in range(c0, c0 + width, LINE):
                    prefetch(panel, k + AHEAD, j)  # a line AHEAD rows on, asked for now: multiplied later
                for j in range(width):
                    w = panel[k, c0 + j]
                    for r in range(rows):
                        a[r, j] = fma(x[r, k], w, a[r, j])
            for r in range(out.shape[0]):
                for j in range(max(0, min(width, out.shape[1] - c0))):
                    out[r, c0 + j] = a[r, j]
    tile.__name__ = f"tile{rows}"
    return tile


def panels_product(x, panels, y, p0, p1):  # [M, d_in], [n_panels, d_in, PANEL], out [M, d_out]; panels p0 <= p < p1
    """y's columns of panels p0 .. p1 - 1 = x @ w, panel by panel; rows 8 at a time, the last 1 to 7 in one tile of
    TAIL's size, padded with zero rows whose sums are dropped (rows never mix). Either nest's tiles (build)."""
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
            tile8(x[m : m + 8], panels, p, y[m : m + 8, n0:n1])  # noqa: F821 (the tiles are globals: build)
        if size == 8:
            tile8(tail, panels, p, y[full:, n0:n1])  # noqa: F821
        elif size == 6:
            tile6(tail, panels, p, y[full:, n0:n1])  # noqa: F821
        elif size == 4:
            tile4(tail, panels, p, y[full:, n0:n1])  # noqa: F821
        elif size == 1:
            tile1(tail, panels, p, y[full:, n0:n1])  # noqa: F821


def panels_runs(x, panels, y, cuts):  # [M, d_in], [n_panels, d_in, PANEL], out [M, d_out], [runs + 1] int64
    """panels_product over each run [cuts[i], cuts[i + 1]), shared out by numba's prange."""
    for i in prange(len(cuts) - 1):  # noqa: F821 (numba.prange, given by build.compiled_runs)
        panels_product(x, panels, y, cuts[i], cuts[i + 1])
