"""How the weights lie in memory for the products: column panels, and column-major block matrices; and lazy_zeros,
the KV cache's memory, committed as it is written.

Panels are a function of the shape only, so one-row and n-row forwards use the same ones; every kernel reads the
column-major layout (a panel of it is contiguous). Imports numpy and the standard library's mmap.
"""

import mmap

import numpy as np

PANEL_BYTES = 160 << 10  # the panel size of "gemv-panels": well inside a core's L2 cache
WHOLE_BYTES = 1 << 20  # a matrix this small is one panel: it stays in L2 between rows anyway
STRIP_ROWS = 128  # rows per strip of fortran_copy: a strip of a GPT-2 matrix fits in the L2 cache


def panel_width(d_in, d_out, panel_bytes=PANEL_BYTES, whole_bytes=WHOLE_BYTES):  # -> columns per panel
    """d_out for a float32 matrix of at most `whole_bytes`, else the largest multiple of 8 (at least 8) with
    `d_in * width * 4 <= panel_bytes`."""
    if d_in * d_out * 4 <= whole_bytes:
        return d_out
    return min(d_out, max(8, panel_bytes // (4 * d_in) // 8 * 8))


def panels(w, width):  # [d_in, d_out] -> [P, d_in, width], P = d_out // width; a view, each contiguous if w is F-order
    d_in, d_out = w.shape
    p = d_out // width
    return w[:, : p * width].reshape(d_in, p, width).transpose(1, 0, 2)


def lazy_zeros(shape):  # -> float32 zeros of `shape`, C order, writable
    """Zeros in an anonymous memory map without transparent huge pages: the OS commits a 4 KiB page when it is first
    written, so a KV cache holds the positions it was given, not n_ctx (numpy asks huge pages for arrays over 4 MiB,
    and the first write of a position then commits 2 MiB of every head's rows)."""
    size = int(np.prod(shape, dtype=np.int64)) * 4
    if size == 0:
        return np.zeros(shape, dtype=np.float32)
    private = getattr(mmap, "MAP_PRIVATE", None)  # Unix: the process's own pages, as numpy's (not shared after a fork)
    memory = mmap.mmap(-1, size) if private is None else mmap.mmap(-1, size, flags=private)
    if (no_huge_pages := getattr(mmap, "MADV_NOHUGEPAGE", None)) is not None:  # Linux
        memory.madvise(no_huge_pages)
    return np.frombuffer(memory, dtype=np.float32).reshape(shape)


def block_linears(params):  # the tree -> its blocks' {"w", "b"} dicts: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
    for h in params["h"]:
        yield from (h["attn"]["c_attn"], h["attn"]["c_proj"], h["mlp"]["c_fc"], h["mlp"]["c_proj"])


def column_major(params, done=None):  # -> params, every block matrix made column-major in place, one at a time
    """Same values and shapes (`x @ w` is unchanged); the head needs nothing (`wte.T` is column-major already).
    done: None, or a function called with each matrix's bytes once it is laid out (a progress bar's update)."""
    for lin in block_linears(params):
        lin["w"] = fortran_copy(lin["w"])
        if done is not None:
            done(lin["w"].nbytes)
    return params


def fortran_copy(w):  # [m, n] -> [m, n] column-major, the same values
    """`w` if already column-major or not an array (a quantized.QuantizedMatrix), else a copy made STRIP_ROWS rows at
    a time, so both sides' cache lines stay in cache (np.asfortranarray's one long stride misses on every element)."""
    if not isinstance(w, np.ndarray) or w.flags.f_contiguous:
        return w
    out = np.empty(w.shape, dtype=w.dtype, order="F")
    rows = out.T  # [n, m] row-major: the same memory
    for i in range(0, w.shape[0], STRIP_ROWS):
        rows[:, i:i + STRIP_ROWS] = w[i:i + STRIP_ROWS].T
    return out
