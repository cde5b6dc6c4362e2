"""Products over int8 codes: a `QuantizedMatrix` (codes and scales of an npspec.sources.quantize int scheme, cut into
column panels) stands for a block matrix; "dequant-panels" casts each panel to float32, multiplies by its scales (the
values of quantize.dequantize_tensor) and runs every row's GEMV on it: those GEMVs' bits on the dequantized matrix,
batch invariant. `dequant_gemm` is the prefill's product. bench/qspeed.py measures the 1-byte read's worth
(notes/quantized.md). Imports numpy and npspec.kernels.{layout, products, compiled.quant}.
"""

import numpy as np

from .compiled.quant import QuantPanels, checked_codes
from .layout import block_linears
from .products import gemm, gemv_rows

QPANEL_BYTES = 1 << 20  # float32 bytes of one dequantized panel (bench/results/quantized_speed_panels.md)


def qpanel_width(d_in, d_out, panel_bytes=QPANEL_BYTES):  # -> columns per panel, a function of the shape only
    """The largest multiple of 8 with `4 d_in width <= panel_bytes`, at least 8, at most d_out."""
    return min(d_out, max(8, panel_bytes // (4 * d_in) // 8 * 8))


class QuantizedMatrix:
    """A `[d_in, d_out]` weight matrix as int8 codes `[P, d_in, width]` (each panel C-contiguous) and float32 scales
    `[P, n_groups, 1, width]`; starts: each panel's first column. Build it with `from_codes`. `shape`, `size` and
    `nbytes` (codes + scales) let a Model count it like an array."""

    def __init__(self, codes, scales, starts, d_out):
        self.codes, self.scales, self.starts = codes, scales, tuple(int(s) for s in starts)
        self.shape = (codes.shape[1], int(d_out))
        self.width = codes.shape[2]
        self.group = codes.shape[1] // scales.shape[1]

    @classmethod
    def from_codes(cls, codes, scales, panel_bytes=QPANEL_BYTES):
        """codes: int8 `[d_in, d_out]`; scales: float32 `[n_groups, d_out]`, n_groups dividing d_in (npspec.sources.
        quantize's fields). Raises ValueError (one line) for other dtypes, ranks or shapes."""
        codes, scales = checked_codes(codes, scales)
        d_in, d_out = codes.shape
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

    def panel(self, p, out):  # p: a panel index; out: float32 [d_in, width], C-contiguous -> out, panel p dequantized
        np.copyto(out, self.codes[p], casting="unsafe")  # int8 -> float32, exact
        grouped = out.reshape(self.scales.shape[1], self.group, self.width)  # [n_groups, group, width], a view
        np.multiply(grouped, self.scales[p], out=grouped)
        return out

    def dequantize(self):  # -> float32 [d_in, d_out], a new array: the values of quantize.dequantize_tensor
        w = np.empty(self.shape, dtype=np.float32)
        buf = np.empty((self.shape[0], self.width), dtype=np.float32)
        for p, s in enumerate(self.starts):
            w[:, s:s + self.width] = self.panel(p, buf)
        return w

    def __repr__(self):
        return (f"QuantizedMatrix(shape={self.shape}, group={self.group}, width={self.width}, "
                f"panels={len(self.starts)})")


CODES = (QuantizedMatrix, QuantPanels)  # the classes holding a matrix's int codes, one a kernel (registry's codes)


def panel_products(x, w, product):  # [n, d_in], QuantizedMatrix [d_in, d_out] -> [n, d_out]
    """Each panel in order dequantized into one reused buffer, then `product(x, panel)` into its columns. Raises
    ValueError if x is not `[n, d_in]`."""
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
    """"dequant-panels": w a QuantizedMatrix, or a float32 array (then products.gemv_rows)."""
    if not isinstance(w, QuantizedMatrix):
        return gemv_rows(x, w, b)
    y = panel_products(x, w, panel_gemv)
    return y if b is None else y + b


def dequant_gemm(x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; NOT batch invariant
    """The prefill's product: a GEMM per dequantized panel (products.gemm for a float32 w)."""
    if not isinstance(w, QuantizedMatrix):
        return gemm(x, w, b)
    y = panel_products(x, w, np.matmul)
    return y if b is None else y + b


def holds_codes(params):  # the parameter tree -> True if a block matrix holds int codes (any kernel's layout)
    return codes_class(params) is not None


def codes_class(params):  # the parameter tree -> the class of its block matrices' int codes, or None (float32)
    return next((type(lin["w"]) for lin in block_linears(params) if isinstance(lin["w"], CODES)), None)
