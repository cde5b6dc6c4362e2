"""Products with quantized weights: int8 codes dequantized one L2-sized panel at a time, right before its GEMV.

Imports numpy and npspec.kernels.products; no I/O, no module state.

A `QuantizedMatrix` stands where a block matrix `w` `[d_in, d_out]` (GPT-2's Conv1D layout) sits in
a parameter tree: the int8 codes and float32 scales of an npspec.sources.quantize int scheme (one scale per
output channel, or per group of G consecutive input weights), cut into column panels of `width`
columns (qpanel_width), each panel's codes contiguous and row-major `[d_in, width]`, so that the
per-channel or per-group scale runs along the contiguous axis of the multiply. If d_out is not a
multiple of the width, one more panel covers the last `width` columns (overlapping the previous
one), as in npspec.kernels.products.GemvPanels: every column comes from a GEMV of the same width.

The kernel "dequant-panels" (`dequant_panels`), `linear(x, w, b=None)`:
`[n, d_in], QuantizedMatrix [d_in, d_out], [d_out] -> [n, d_out]` float32. For each panel: cast its
codes to float32 into one reused buffer (exact: every int8 is a float32), multiply by its scales in
place (one correctly rounded float32 product c * s per weight: the very values of
npspec.sources.quantize.dequantize_tensor), then every row's GEMV over the panel (np.matmul
`[n, 1, d_in] @ [d_in, width]`). Its bits are therefore those of the same panel GEMVs run on the
dequantized float32 matrix (`QuantizedMatrix.dequantize`), tested bit for bit in
tests/test_qkernels.py. Batch invariant (npspec.kernels.products' contract): row i is the same GEMV calls
whatever n is. Its bits differ from "gemv-rows" and "gemv-panels" on the dequantized matrix (other
GEMV shapes): a model keeps one kernel for all its decoding forwards. A plain float32 `w` (the tied
head `wte.T`, tensors the scheme leaves alone) goes to npspec.kernels.products.gemv_rows. `dequant_gemm` is
the prefill's product: the same panels, one GEMM each (not batch invariant, as kernels.gemm).

What it buys is bytes: a weight is read from memory as 1 byte instead of 4. What it costs is the
cast and the multiply, done by NumPy's element loops; bench/qspeed.py measures both against the
float32 target's fastest one-token forward (bench/results/README.md, issue 14).
"""

import numpy as np

from .layout import block_linears
from .products import gemm, gemv_rows

QPANEL_BYTES = 1 << 20  # float32 bytes of one dequantized panel: of 160 KiB to 2 MiB, the fastest for 3 of gpt2-large's 4 shapes (bench/results/quantized_speed_panels.md)


def qpanel_width(d_in, d_out, panel_bytes=QPANEL_BYTES):
    """Columns per panel of a quantized `[d_in, d_out]` matrix: the largest multiple of 8 with `4 d_in width <= panel_bytes`
    (at least 8, at most d_out). A function of the shape only, so every forward uses the same panels."""
    return min(d_out, max(8, panel_bytes // (4 * d_in) // 8 * 8))


class QuantizedMatrix:
    """A `[d_in, d_out]` weight matrix held as int8 codes and float32 scales, panel by panel (module docstring).

    codes: int8 `[P, d_in, width]`, each panel C-contiguous; scales: float32 `[P, n_groups, 1, width]`
    (n_groups = d_in / group; 1 per output channel); starts: the first column of each panel (the
    last one may overlap the previous). Build it with `from_codes`. `shape`, `size` (weights) and
    `nbytes` (codes + scales, the overlap panel included) let npspec.model.model count it like an array.
    """

    def __init__(self, codes, scales, starts, d_out):
        self.codes, self.scales, self.starts = codes, scales, tuple(int(s) for s in starts)
        self.shape = (codes.shape[1], int(d_out))
        self.width = codes.shape[2]
        self.group = codes.shape[1] // scales.shape[1]

    @classmethod
    def from_codes(cls, codes, scales, panel_bytes=QPANEL_BYTES):
        """From npspec.sources.quantize's Quantized fields in the Conv1D layout (input axis 0).

        codes: int8 `[d_in, d_out]`; scales: float32 `[n_groups, d_out]` with n_groups dividing d_in
        (1: per output channel). Raises ValueError (one line) for other dtypes, ranks or shapes.
        """
        codes, scales = np.asarray(codes), np.asarray(scales)
        if codes.dtype != np.int8 or codes.ndim != 2:
            raise ValueError(f"codes must be a 2-D int8 array [d_in, d_out], got {codes.dtype} {list(codes.shape)}")
        d_in, d_out = codes.shape
        if (scales.dtype != np.float32 or scales.ndim != 2 or scales.shape[1] != d_out or scales.shape[0] < 1
                or d_in % scales.shape[0]):
            raise ValueError(f"scales must be float32 [n_groups, {d_out}] with n_groups dividing {d_in}, "
                             f"got {scales.dtype} {list(scales.shape)}")
        width = qpanel_width(d_in, d_out, panel_bytes)
        starts = list(range(0, d_out - width + 1, width))
        if starts[-1] + width < d_out:
            starts.append(d_out - width)  # the overlapping last panel
        cols = np.array(starts)[:, None] + np.arange(width)  # [P, width]
        panel_codes = np.ascontiguousarray(codes[:, cols].transpose(1, 0, 2))  # [P, d_in, width]
        panel_scales = np.ascontiguousarray(scales[:, cols].transpose(1, 0, 2)[:, :, None, :])  # [P, n_groups, 1, width]
        return cls(panel_codes, panel_scales, starts, d_out)

    @property
    def size(self):
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self):
        return self.codes.nbytes + self.scales.nbytes

    def panel(self, p, out):  # p: a panel index; out: float32 [d_in, width] -> out
        """Dequantize panel p into `out` (float32 `[d_in, width]`, C-contiguous): cast, then multiply by the scales in place."""
        np.copyto(out, self.codes[p], casting="unsafe")  # int8 -> float32, exact
        grouped = out.reshape(self.scales.shape[1], self.group, self.width)  # [n_groups, group, width], a view
        np.multiply(grouped, self.scales[p], out=grouped)
        return out

    def dequantize(self):  # -> float32 [d_in, d_out]
        """The float32 matrix the codes stand for (npspec.sources.quantize.dequantize_tensor's values), a new array."""
        w = np.empty(self.shape, dtype=np.float32)
        buf = np.empty((self.shape[0], self.width), dtype=np.float32)
        for p, s in enumerate(self.starts):
            w[:, s:s + self.width] = self.panel(p, buf)
        return w

    def __repr__(self):
        return (f"QuantizedMatrix(shape={self.shape}, group={self.group}, width={self.width}, "
                f"panels={len(self.starts)})")


def panel_products(x, w, product):  # [n, d_in], QuantizedMatrix [d_in, d_out] -> [n, d_out]
    """For each panel of w in order: dequantize it into one reused buffer, then `product(x, panel)` `[n, width]`
    into its columns (an overlapping last panel overwrites the shared columns, the same way for every n)."""
    n, (d_in, d_out) = x.shape[0], w.shape
    if x.ndim != 2 or x.shape[1] != d_in:
        raise ValueError(f"x must be [n, {d_in}] to multiply a quantized [{d_in}, {d_out}] matrix, got {list(x.shape)}")
    out = np.empty((n, d_out), dtype=np.float32)
    buf = np.empty((d_in, w.width), dtype=np.float32)
    for p, s in enumerate(w.starts):
        out[:, s:s + w.width] = product(x, w.panel(p, buf))
    return out


def panel_gemv(x, panel):  # [n, d_in], [d_in, width] -> [n, width]; row i == panel_gemv(x[i:i+1])
    return np.matmul(x[:, None, :], panel)[:, 0]


def dequant_panels(x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; batch invariant
    """The "dequant-panels" kernel (module docstring): panel by panel, dequantize then every row's GEMV.

    w: a QuantizedMatrix, or a float32 array (then kernels.gemv_rows). Raises ValueError if x is not `[n, d_in]`.
    """
    if not isinstance(w, QuantizedMatrix):
        return gemv_rows(x, w, b)
    y = panel_products(x, w, panel_gemv)
    return y if b is None else y + b


def dequant_gemm(x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; NOT batch invariant
    """The prefill's product with quantized weights: panel by panel, dequantize then one GEMM (kernels.gemm for a float w)."""
    if not isinstance(w, QuantizedMatrix):
        return gemm(x, w, b)
    y = panel_products(x, w, np.matmul)
    return y if b is None else y + b


def holds_codes(params):
    """True if a block matrix of the parameter tree is a QuantizedMatrix."""
    return any(isinstance(lin["w"], QuantizedMatrix) for lin in block_linears(params))
