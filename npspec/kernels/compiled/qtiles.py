"""The two loop nests of "compiled-quant" over int codes. Each weight is made in registers as float32(code) * scale
(one float32 multiply, the value quantize.dequantize_tensor gives), then the same fma chain in increasing k as
tiles.make_tile. Codes are int8 `[d_in, PANEL]` a panel, or two 4-bit codes a byte (16 * code(k + 1) + code(k) + 8
for k even); scales `[n_groups, PANEL]`. qtiles and qpanels_product: tiles.py's tiles over codes (512-bit vectors);
block_qtiles and qblocks_product: register blocks of 1 to 4 rows (intrinsics.quant_block, 256-bit vectors), each
weight decoded once for all its rows. The intrinsics and tiles come as globals from build.
Imports numpy and npspec.kernels.compiled.tiles.
"""

import numpy as np

from .tiles import AHEAD, PARTS, PANEL, TAIL

__all__ = ["AHEAD", "PANEL", "TAIL", "qtiles", "block_qtiles", "qpanels_product", "qblocks_product", "qpanels_runs"]


NIBBLE_PARTS = {**PARTS, 1: 2}  # one row: two runs of half a panel (a run's sums and scales stay in registers)
BLOCK_ROWS = 4  # rows of the largest register block over codes
BLOCK_WIDTHS = {False: {1: 64, 2: 32, 3: 16, 4: 16}, True: {1: 32, 2: 16, 3: 16, 4: 16}}  # nibbles -> rows -> columns


def qtiles(panel=PANEL, nibbles=False):  # -> {"qtile8", "qtile6", "qtile4", "qtile1": tile(x, codes, scales, out)}
    make, parts = (make_nibble_tile, NIBBLE_PARTS) if nibbles else (make_byte_tile, PARTS)
    return {f"qtile{rows}": make(rows, n, panel // n) for rows, n in parts.items()}


def block_qtiles(panel=PANEL, nibbles=False):  # -> {"qblock1" .. "qblock4": tile(x, codes, scales, out)}
    """The nest for 256-bit vectors: tiles of 1 to BLOCK_ROWS rows, each register blocks (intrinsics.quant_block) of
    BLOCK_WIDTHS' columns across the panel (the widest that divides it). Raises ValueError unless 8 divides panel."""
    if panel % 8:
        raise ValueError(f"compiled-quant's register blocks take panels of a multiple of 8 columns, got {panel}")
    tiles = {}
    for rows, most in BLOCK_WIDTHS[bool(nibbles)].items():
        width = next(w for w in (most, 32, 16, 8) if w <= most and panel % w == 0)
        tiles[f"qblock{rows}"] = make_block_tile(rows, width, panel, nibbles)
    return tiles


def make_block_tile(rows, width, panel, nibbles):  # -> tile(x [rows, d_in], codes, scales, out [rows, <= panel])
    packed = int(nibbles)

    def tile(x, codes, scales, out):
        for c0 in range(0, panel, width):
            a = scratch(rows, width)
            qblock(x, codes, scales, c0, a, rows, width, packed)
            for r in range(rows):
                for j in range(max(0, min(width, out.shape[1] - c0))):
                    out[r, c0 + j] = a[r, j]
    tile.__name__ = f"qblock{rows}"
    return tile


def make_byte_tile(rows, parts, width):  # -> tile(x [rows, d_in], codes int8 [d_in, ..], scales [n_groups, ..], out)
    """tiles.make_tile's body with w = float32(codes[k, j]) * scales[k // group, j]."""
    def tile(x, codes, scales, out):
        wide_vectors()
        group = x.shape[1] // scales.shape[0]
        for h in range(parts):
            c0 = h * width
            a = scratch(rows, width)
            for r in range(rows):
                for j in range(width):
                    a[r, j] = 0.0
            for g in range(scales.shape[0]):
                for k in range(g * group, (g + 1) * group):
                    prefetch(codes, k + AHEAD, c0)  # a code row is at most a cache line
                    for j in range(width):
                        w = np.float32(codes[k, c0 + j]) * scales[g, c0 + j]
                        for r in range(rows):
                            a[r, j] = fma(x[r, k], w, a[r, j])
            for r in range(out.shape[0]):
                for j in range(max(0, min(width, out.shape[1] - c0))):
                    out[r, c0 + j] = a[r, j]
    tile.__name__ = f"qtile{rows}"
    return tile


def make_nibble_tile(rows, parts, width):  # -> tile(x [rows, d_in], codes int8 [d_in / 2, ..], scales, out)
    """make_byte_tile's chain with two 4-bit codes a byte: k = 2 kk from the low nibble, k = 2 kk + 1 the high. Each
    weight is float32(code) * scale bit for bit: lo + 8 - 8 is exact, so (lo + 8 - 8) * scale rounds once, as the
    product does (and overflows only where it does)."""
    def tile(x, codes, scales, out):
        wide_vectors()
        pairs = codes.shape[0] // scales.shape[0]  # code rows of a group (the group is even)
        for h in range(parts):
            c0 = h * width
            a = scratch(rows, width)
            for r in range(rows):
                for j in range(width):
                    a[r, j] = 0.0
            for g in range(scales.shape[0]):
                for kk in range(g * pairs, (g + 1) * pairs):
                    prefetch(codes, kk + AHEAD, c0)
                    k = 2 * kk
                    for j in range(width):
                        f = np.float32(codes[kk, c0 + j])  # 16 * hi + lo + 8, hi and lo in -8 .. 7: exact
                        hi = np.floor(f * np.float32(0.0625))  # exact: f / 16 is a float32, floor takes hi
                        s = scales[g, c0 + j]
                        lo8 = fma(hi, np.float32(-16.0), f)  # lo + 8, exact
                        w0 = (lo8 - np.float32(8.0)) * s  # lo * s, rounded once
                        w1 = hi * s
                        for r in range(rows):
                            a[r, j] = fma(x[r, k], w0, a[r, j])
                        for r in range(rows):
                            a[r, j] = fma(x[r, k + 1], w1, a[r, j])
            for r in range(out.shape[0]):
                for j in range(max(0, min(width, out.shape[1] - c0))):
                    out[r, c0 + j] = a[r, j]
    tile.__name__ = f"qtile{rows}"
    return tile


def qpanels_product(x, codes, scales, y, p0, p1):  # [M, d_in], [P, rows, PANEL] int8, [P, n_groups, PANEL], out [M, d_out]
    """tiles.panels_product over code panels p0 .. p1 - 1: rows 8 at a time, the last 1 to 7 in one padded tile."""
    m_rows, d_in = x.shape
    d_out = y.shape[1]
    full = m_rows - m_rows % 8
    size = TAIL[m_rows - full]
    tail = np.zeros((size, d_in), dtype=np.float32)
    tail[: m_rows - full] = x[full:]
    for p in range(p0, p1):
        n0 = p * PANEL
        n1 = min(n0 + PANEL, d_out)
        for m in range(0, full, 8):
            qtile8(x[m : m + 8], codes[p], scales[p], y[m : m + 8, n0:n1])  # noqa: F821 (globals: build)
        if size == 8:
            qtile8(tail, codes[p], scales[p], y[full:, n0:n1])  # noqa: F821
        elif size == 6:
            qtile6(tail, codes[p], scales[p], y[full:, n0:n1])  # noqa: F821
        elif size == 4:
            qtile4(tail, codes[p], scales[p], y[full:, n0:n1])  # noqa: F821
        elif size == 1:
            qtile1(tail, codes[p], scales[p], y[full:, n0:n1])  # noqa: F821


def qblocks_product(x, codes, scales, y, p0, p1):  # qpanels_product's arguments
    """qpanels_product over block_qtiles' tiles: rows BLOCK_ROWS at a time, the last 1 to 3 in their own tile."""
    m_rows, d_out = x.shape[0], y.shape[1]
    for p in range(p0, p1):
        n0 = p * PANEL
        n1 = min(n0 + PANEL, d_out)
        for m in range(0, m_rows, BLOCK_ROWS):
            left = m_rows - m
            if left >= 4:
                qblock4(x[m : m + 4], codes[p], scales[p], y[m : m + 4, n0:n1])  # noqa: F821 (globals: build)
            elif left == 3:
                qblock3(x[m:], codes[p], scales[p], y[m:, n0:n1])  # noqa: F821
            elif left == 2:
                qblock2(x[m:], codes[p], scales[p], y[m:, n0:n1])  # noqa: F821
            else:
                qblock1(x[m:], codes[p], scales[p], y[m:, n0:n1])  # noqa: F821


def qpanels_runs(x, codes, scales, y, cuts):  # qpanels_product's arguments, [runs + 1] int64
    """qpanels_product over each run [cuts[i], cuts[i + 1]), shared out by numba's prange."""
    for i in prange(len(cuts) - 1):  # noqa: F821 (numba.prange, given by build)
        qpanels_product(x, codes, scales, y, cuts[i], cuts[i + 1])  # noqa: F821
