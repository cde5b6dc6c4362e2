"""The loop nest for 256-bit vectors (AVX2's 16 registers): 16-column panels (two vectors), each tile one register
block (intrinsics.register_block) per panel, or per GROUP panels for one row; tiles.panels_product runs the tiles.
Every element is the chain of tiles.py, fma's in increasing k from +0.0, so its bits are the 512-bit nest's. The
intrinsics and panels_product come as globals from build.
"""

PANEL = 16  # columns per panel: two 256-bit vectors of float32
LANES = 8  # float32 in a vector
ROW_BLOCKS = {8: 4, 6: 6, 4: 4, 1: 1}  # rows of a tile -> rows of its register blocks (at most 12 sum vectors)
GROUP = 4  # panels a one-row block multiplies at once: 8 sum vectors, 4 streams of weights


def tiles():  # -> {"tile8", "tile6", "tile4", "tile1": tile(x, panels, p, out), "group1": group1(the same)}
    made = {f"tile{rows}": make_tile(rows, size) for rows, size in ROW_BLOCKS.items()}
    return {**made, "group1": make_group_tile()}


def make_tile(rows, size):  # -> tile(x [rows, d_in], panels [n, d_in, PANEL], p, out [<= rows, <= PANEL])
    """panels[p]'s tile of `rows` rows: register blocks of `size` rows (constants of the closure numba compiles), the
    sums in `scratch` until stored into out's first rows."""
    def tile(x, panels, p, out):
        a = scratch(rows, PANEL)
        for r0 in range(0, rows, size):
            block(x[r0 : r0 + size], panels, p, a[r0 : r0 + size], size, 1, PANEL, LANES)
        for r in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[r, j] = a[r, j]
    tile.__name__ = f"tile{rows}"
    return tile


def make_group_tile():  # -> group1(x [1, d_in], panels [n, d_in, PANEL], p, out [1, GROUP * PANEL])
    width = GROUP * PANEL

    def group1(x, panels, p, out):  # panels p .. p + GROUP - 1, all inside panels
        a = scratch(1, width)
        block(x, panels, p, a, 1, GROUP, PANEL, LANES)
        for j in range(width):
            out[0, j] = a[0, j]
    return group1


def blocks_product(x, panels, y, p0, p1):  # [M, d_in], [n_panels, d_in, PANEL], out [M, d_out]; panels p0 <= p < p1
    """y's columns of panels p0 .. p1 - 1 = x @ w: one row GROUP panels at a time while they are whole, the rest by
    tiles.panels_product over this nest's tiles (build gives it as `panels_product`)."""
    p = p0
    if x.shape[0] == 1:
        while p + GROUP <= p1 and (p + GROUP) * PANEL <= y.shape[1]:
            group1(x, panels, p, y[:, p * PANEL : (p + GROUP) * PANEL])  # noqa: F821 (the tiles are globals: build)
            p += GROUP
    panels_product(x, panels, y, p, p1)  # noqa: F821


def blocks_runs(x, panels, y, cuts):  # [M, d_in], [n_panels, d_in, PANEL], out [M, d_out], [runs + 1] int64
    """blocks_product over each run [cuts[i], cuts[i + 1]), shared out by numba's prange."""
    for i in prange(len(cuts) - 1):  # noqa: F821 (numba.prange, given by build.compiled_runs)
        blocks_product(x, panels, y, cuts[i], cuts[i + 1])
