""""compiled-quant": `QuantPanels`, a matrix's int codes and scales laid out as compiled-panels' panels (4-bit codes
two a byte), and `CompiledQuant`, which multiplies them by a qtiles nest: bit for bit compiled-panels on the
dequantized float32 matrix, for every row count and thread count (tests/test_compiled_quant.py). float32 matrices
go to compiled-panels. `quant_gemm` is its prefill. Imports numpy, npspec.kernels.{products, workers} and
npspec.kernels.compiled.{blocks, build, kernel, tiles}.
"""

import numpy as np

from ..products import gemm
from ..workers import check_threads, run_count, run_cuts
from .blocks import PANEL as BLOCKS_PANEL
from .build import LAYERS, compiled_qproduct, compiled_qruns
from .kernel import SPLIT_BYTES, CompiledPanels, checked_rows
from .tiles import PANEL

NAME = "compiled-quant"


def checked_codes(codes, scales):  # -> (codes int8 [d_in, d_out], scales float32 [n_groups, d_out]) as arrays
    """Raise ValueError (one line) unless codes are 2-D int8 and scales float32 [n_groups, d_out], n_groups dividing
    d_in: npspec.sources.quantize's fields, as both quantized kernels take them."""
    codes, scales = np.asarray(codes), np.asarray(scales)
    if codes.dtype != np.int8 or codes.ndim != 2:
        raise ValueError(f"codes must be a 2-D int8 array [d_in, d_out], got {codes.dtype} {list(codes.shape)}")
    d_in, d_out = codes.shape
    if (scales.dtype != np.float32 or scales.ndim != 2 or scales.shape[1] != d_out or scales.shape[0] < 1
            or d_in % scales.shape[0]):
        raise ValueError(f"scales must be float32 [n_groups, {d_out}] with n_groups dividing {d_in}, "
                         f"got {scales.dtype} {list(scales.shape)}")
    return codes, scales


def checked_code_panels(codes, scales, shape, nibbles):
    """Raise ValueError (one line) unless codes int8 [P, d_in (nibbles: d_in / 2), panel] and scales float32
    [P, n_groups, panel], both in C order, hold a `shape` ([d_in, d_out]) matrix: P = ceil(d_out / panel), n_groups
    dividing d_in (nibbles: into even groups). The compiled loops read them to these sizes."""
    arrays = (codes, np.int8), (scales, np.float32)
    if not all(isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == 3 and a.flags.c_contiguous
               for a, dtype in arrays):
        got = ", ".join(f"{a.dtype} {list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
                        for a, _ in arrays)
        raise ValueError("codes must be int8 [P, rows, panel] and scales float32 [P, n_groups, panel], in C order "
                         f"(QuantPanels.from_codes), got {got}")
    (count, rows, panel), (s_count, groups, s_panel) = codes.shape, scales.shape
    d_in, d_out = shape if len(shape) == 2 else (-1, -1)
    if (panel < 1 or (s_count, s_panel) != (count, panel) or count != -(-d_out // panel) or d_out < 0
            or rows != (d_in // 2 if nibbles else d_in) or groups < 1 or d_in % groups
            or (nibbles and (d_in // groups) % 2)):
        raise ValueError(f"codes {list(codes.shape)} and scales {list(scales.shape)} do not hold a {list(shape)} "
                         f"matrix{' of 4-bit codes' if nibbles else ''}: build it with QuantPanels.from_codes")


class QuantPanels:
    """A `[d_in, d_out]` weight matrix as codes `[P, d_in, PANEL]` int8 (nibbles: `[P, d_in / 2, PANEL]`, the byte
    16 * code(k + 1) + code(k) + 8 for k even) and scales `[P, n_groups, PANEL]` float32, zero past d_out; weight
    (k, n) is float32(code) * scale of its group. Build it with `from_codes`. `shape`, `size`, `nbytes` as an array's;
    `np.asarray(q)` is dequantize()."""

    def __init__(self, codes, scales, shape, nibbles):  # ValueError (one line) unless laid out as from_codes lays them
        checked_code_panels(codes, scales, shape, nibbles)
        self.codes, self.scales, self.shape, self.nibbles = codes, scales, tuple(shape), bool(nibbles)
        self.group = shape[0] // scales.shape[1]
        self.plans = {}  # threads -> (cuts or None, numba threads), planned once

    @classmethod
    def from_codes(cls, codes, scales, panel=PANEL):
        """codes: int8 `[d_in, d_out]`; scales: float32 `[n_groups, d_out]`, n_groups dividing d_in (npspec.sources.
        quantize's fields); codes in -8..7 with an even group are stored two a byte. Raises ValueError (one line)."""
        codes, scales = checked_codes(codes, scales)
        if isinstance(panel, bool) or not isinstance(panel, (int, np.integer)) or panel < 1:
            raise ValueError(f"a panel holds a positive number of columns, got {panel!r}")
        d_in, d_out = codes.shape
        nibbles = (d_in // scales.shape[0]) % 2 == 0 and codes.size > 0 and -8 <= codes.min() and codes.max() <= 7
        count = -(-d_out // panel)
        rows = d_in // 2 if nibbles else d_in
        packed = np.zeros((count, rows, panel), dtype=np.int8)
        grid = np.zeros((count, scales.shape[0], panel), dtype=np.float32)
        for p in range(count):
            n0, n1 = p * panel, min(p * panel + panel, d_out)
            block = codes[:, n0:n1]
            if nibbles:  # 16 * code(k + 1) + code(k) + 8: -128 .. 127, no wrap
                block = block[1::2].astype(np.int16) * 16 + block[0::2].astype(np.int16) + 8
            packed[p, :, : n1 - n0] = block
            grid[p, :, : n1 - n0] = scales[:, n0:n1]
        return cls(packed, grid, (d_in, d_out), nibbles)

    @property
    def size(self):
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self):
        return self.codes.nbytes + self.scales.nbytes

    def panel_codes(self, p):  # -> int8 [d_in, PANEL]: panel p's codes, one a weight
        c = self.codes[p]
        if not self.nibbles:
            return c
        out = np.empty((2 * c.shape[0], c.shape[1]), dtype=np.int8)
        out[0::2] = (c & 15) - 8
        out[1::2] = c >> 4
        return out

    def dequantize(self):  # -> float32 [d_in, d_out], column-major: the values of quantize.dequantize_tensor
        d_in, d_out = self.shape
        w = np.empty(self.shape, dtype=np.float32, order="F")
        panel = self.codes.shape[2]
        for p in range(self.codes.shape[0]):
            n0, n1 = p * panel, min(p * panel + panel, d_out)
            codes = self.panel_codes(p).reshape(self.scales.shape[1], self.group, panel).astype(np.float32)
            w[:, n0:n1] = (codes * self.scales[p][:, None, :]).reshape(d_in, panel)[:, : n1 - n0]
        return w

    def __array__(self, dtype=None, copy=None):  # -> dequantize(), as dtype
        w = self.dequantize()
        return w if dtype is None else w.astype(dtype, copy=False)

    def columns(self, ids):  # [n] ints -> float32 [n, d_in]: columns ids of the matrix (rows of its transpose)
        ids = np.asarray(ids)
        panel = self.codes.shape[2]
        out = np.empty((ids.size, self.shape[0]), dtype=np.float32)
        for i, n in enumerate(ids.reshape(-1)):
            p, j = divmod(int(n), panel)
            codes = self.panel_codes(p)[:, j].reshape(self.scales.shape[1], self.group).astype(np.float32)
            out[i] = (codes * self.scales[p][:, j][:, None]).reshape(-1)
        return out.reshape(*ids.shape, self.shape[0])

    def __repr__(self):
        return f"QuantPanels(shape={self.shape}, group={self.group}, nibbles={self.nibbles})"


class QuantTied:
    """A tied `[n_vocab, n_embd]` embedding held as its head's QuantPanels: `T` is the head, `e[ids]` the rows (the
    dequantized values). Stands for `params["wte"]` (the forward reads `wte[ids]` and `wte.T`)."""

    def __init__(self, head):
        self.T = head
        self.shape = head.shape[::-1]

    def __getitem__(self, ids):  # [n] ints -> [n, n_embd] float32
        return self.T.columns(ids)

    @property
    def size(self):
        return self.T.size

    @property
    def nbytes(self):
        return self.T.nbytes

    def __repr__(self):
        return f"QuantTied({self.T!r})"


class CompiledQuant:
    """`linear(x, w, b=None)`: `[n, d_in], [d_in, d_out], [d_out] -> [n, d_out]` float32, batch invariant; w a
    QuantPanels (`panel`-column code panels; qtiles' register blocks where float_panel is blocks.PANEL, the 256-bit
    hosts', else its 512-bit tiles) or a float32 array (compiled-panels on `float_panel`-column panels). threads as
    CompiledPanels'; no bit depends on them or on the nest. Raises ValueError for a bad thread count, KernelUnavailable
    without numba."""

    name = NAME

    def __init__(self, threads=1, panel=PANEL, layers=LAYERS, float_panel=PANEL):
        self.threads, self.panel = check_threads(threads), panel
        self.floats = CompiledPanels(threads, float_panel, layers)
        self.blocks = float_panel == BLOCKS_PANEL  # the host's vectors are 256 bits: register blocks over the codes
        self.products = {n: compiled_qproduct(n, panel=panel, blocks=self.blocks) for n in (False, True)}
        self.runs = ({n: compiled_qruns(n, layers, panel, self.blocks) for n in (False, True)} if self.threads > 1
                     else None)

    def prepare(self, matrices):  # the float32 ones are packed now (CompiledPanels.prepare); codes are ready
        self.floats.prepare([w for w in matrices if not isinstance(w, QuantPanels)])

    def pack(self, w):  # [d_in, d_out] float32 -> compiled.Packed (CompiledPanels.pack); QuantPanels as they are
        return w if isinstance(w, QuantPanels) else self.floats.pack(w)

    def plan(self, w):  # QuantPanels -> (cuts or None, numba threads)
        if self.threads not in w.plans:
            count = w.codes.shape[0]
            runs = run_count(self.threads, count, w.nbytes, SPLIT_BYTES)
            if runs == 1:
                w.plans[self.threads] = (None, 1)
            else:
                most = self.runs[w.nibbles][1]
                w.plans[self.threads] = (np.array(run_cuts(count, runs), dtype=np.int64), min(runs, most))
        return w.plans[self.threads]

    def __call__(self, x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]
        if not isinstance(w, QuantPanels):
            return self.floats(x, w, b)
        x = checked_rows(x, w)
        if w.codes.shape[2] != self.panel:
            raise ValueError(f"codes laid out in {w.codes.shape[2]}-column panels, this kernel's are {self.panel}")
        y = np.empty((x.shape[0], w.shape[1]), dtype=np.float32)
        cuts, threads = self.plan(w)
        if cuts is None:
            self.products[w.nibbles](x, w.codes, w.scales, y, 0, w.codes.shape[0])
        else:
            self.runs[w.nibbles][0](x, w.codes, w.scales, y, cuts, threads)
        return y if b is None else y + b

    def __repr__(self):
        return f"CompiledQuant(threads={self.threads}, blocks={self.blocks})"


def quant_gemm(x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; NOT batch invariant
    """compiled-quant's prefill: one GEMM on the dequantized matrix (products.gemm for a float32 w)."""
    return gemm(x, w.dequantize() if isinstance(w, QuantPanels) else w, b)

