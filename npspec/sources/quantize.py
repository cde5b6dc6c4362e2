"""Weight-only quantization of a GPT-2's tensors: the schemes, round-to-nearest, and the 16-bit round trips.

Imports numpy only; no I/O (npspec.sources.quantized saves and loads quantized models).

A scheme is written as a short name (`parse_scheme`):
  int<b>-ch     symmetric round-to-nearest (RTN), one scale per output channel, b in 2..8 bits;
  int<b>-g<G>   the same with one scale per group of G consecutive weights along the input
                dimension of each output channel (G = 32, 64, 128 in the study; any G >= 2
                dividing every input width);
  fp16, bf16    a round trip through IEEE half precision or bfloat16 (round to nearest even):
                the "16-bit" levels;
and a suffix `+emb` quantizes the token and position embeddings `wte` and `wpe` too (the head
is tied to `wte`, so this also quantizes the output layer); without it only the block linears
(`attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj` of every layer) are, as most engines do.
Layer norms and biases stay float32.

Symmetric RTN with b bits (the baseline of GPTQ, Frantar et al. 2023, and AWQ, Lin et al.
2024): with qmax = 2^(b-1) - 1, a group's scale is s = max|w| / qmax (float32), its codes
c = clip(rint(w / s), -qmax, qmax) (int8; computed in float64, rint rounds ties to even) and
the weights it stands for are c * s (float32). So every weight is reconstructed within half a
step, |w - c s| <= s / 2 (plus the float32 rounding of the product), and a tensor already on
the grid (each group's weights c * s exactly, with some |c| = qmax) is reproduced exactly. The
2^b-th level -2^(b-1) is unused, so 2 bits is ternary {-s, 0, s}. An all-zero group gets s = 0.

Layout: block linears are stored `[in, out]` (Conv1D), so their input axis is 0; `wte` and
`wpe` are `[rows, n_embd]` and the tied head reads `wte.T`, so their input axis is 1 (each
row, a token's embedding, is an output channel). Codes keep the tensor's shape; scales have
the input axis divided by G (per channel: 1).
"""

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

LINEAR_SUFFIXES = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
EMBEDDINGS = ("wte.weight", "wpe.weight")
MIN_BITS, MAX_BITS = 2, 8
SCHEME_HELP = "int<bits>-ch or int<bits>-g<group> (bits 2..8), fp16 or bf16, each optionally +emb"


@dataclass(frozen=True)
class Scheme:
    """A quantization scheme. kind: "int" (RTN), "fp16" or "bf16"; bits: 2..8 (16 for the float kinds);
    group: input weights per scale (None: one scale per output channel; float kinds have no scale);
    embeddings: whether wte and wpe are quantized too."""

    kind: str
    bits: int
    group: int | None = None
    embeddings: bool = False

    @property
    def name(self):
        """The scheme's name, as parse_scheme reads it (e.g. "int4-g64", "int8-ch+emb", "bf16")."""
        base = self.kind if self.kind != "int" else f"int{self.bits}-" + ("ch" if self.group is None else f"g{self.group}")
        return base + ("+emb" if self.embeddings else "")

    @property
    def qmax(self):
        """The largest code, 2^(bits-1) - 1 (int kind only)."""
        return 2 ** (self.bits - 1) - 1


class Quantized(NamedTuple):
    """One quantized tensor: codes (int8 for "int", float16 for "fp16", uint16 bfloat16 bits for "bf16"),
    shaped as the tensor; scales (float32, the input axis divided by the group; None for the float kinds)."""

    codes: np.ndarray
    scales: np.ndarray | None


def parse_scheme(text):
    """The Scheme a name stands for (see the module docstring), e.g. "int4-g64", "int8-ch+emb", "fp16".

    Raises ValueError, one line naming what is wrong and the valid forms: bits outside 2..8
    (0, 1, 9, 17, ...), a group below 2, a missing granularity (`int4`), anything else unknown.
    Whether a group divides a model's widths is checked where the model is known (check_scheme).
    """
    text = str(text).strip()
    base, plus, tail = text.partition("+")
    if plus and tail != "emb":
        raise ValueError(f"unknown quantization scheme {text!r}: the only suffix is +emb; use {SCHEME_HELP}")
    embeddings = bool(plus)
    if base in ("fp16", "bf16"):
        return Scheme(base, 16, None, embeddings)
    m = re.fullmatch(r"int(\d+)(?:-(ch|g(\d+)))?", base)
    if m is None:
        raise ValueError(f"unknown quantization scheme {text!r}: use {SCHEME_HELP}")
    bits = int(m.group(1))
    if not MIN_BITS <= bits <= MAX_BITS:
        why = " (symmetric 1 bit has no level but 0)" if bits == 1 else ""
        raise ValueError(f"quantization scheme {text!r}: bits must be {MIN_BITS}..{MAX_BITS}, got {bits}{why}; "
                         "16-bit levels are fp16 and bf16")
    if m.group(2) is None:
        raise ValueError(f"quantization scheme {text!r} needs a granularity: int{bits}-ch (per output channel) "
                         f"or int{bits}-g<group> (e.g. int{bits}-g64)")
    group = None if m.group(2) == "ch" else int(m.group(3))
    if group is not None and group < 2:
        raise ValueError(f"quantization scheme {text!r}: the group must be >= 2 weights, got {group}")
    return Scheme("int", bits, group, embeddings)


def input_axis(name):
    """The input (reduction) axis of a tensor named as in npspec.sources.files: 0 for block linears `[in, out]`, 1 for wte/wpe."""
    return 1 if name in EMBEDDINGS else 0


def quantized_names(names, scheme):
    """The names, among `names` (npspec.sources.files tensor names), that `scheme` quantizes, in their order."""
    chosen = LINEAR_SUFFIXES + (EMBEDDINGS if scheme.embeddings else ())
    return [n for n in names if n.endswith(chosen) and (n in EMBEDDINGS or n.startswith("h."))]


def check_scheme(scheme, shapes):
    """Raise ValueError (one line) if the scheme's group does not divide the input width of a tensor it quantizes.

    shapes: `{name: shape}` (npspec.sources.files.tensor_shapes(config)).
    """
    if scheme.group is None:
        return
    for name in quantized_names(shapes, scheme):
        width = shapes[name][input_axis(name)]
        if width % scheme.group:
            raise ValueError(f"quantization scheme {scheme.name!r}: group {scheme.group} does not divide the input "
                             f"width {width} of {name}; pick a group that divides every width (n_embd and 4 n_embd)")


def quantize_tensor(w, scheme, axis=0):  # [..] float32 -> Quantized
    """Quantize one 2-D float32 tensor `w` with `scheme`; `axis` is its input axis (input_axis(name)).

    int: symmetric RTN per output channel or per group of scheme.group along `axis` (module
    docstring). fp16/bf16: the nearest 16-bit value (ties to even). Raises ValueError if the
    group does not divide the input width, or if a value does not fit the 16-bit format (fp16
    overflows past 65504) or is not finite.
    """
    w = np.asarray(w, dtype=np.float32)
    if not np.isfinite(w).all():
        raise ValueError("cannot quantize a tensor holding NaN or inf")
    if scheme.kind == "fp16":
        if np.abs(w).max(initial=0) > np.finfo(np.float16).max:
            raise ValueError("a weight does not fit float16 (|w| > 65504); use bf16")
        return Quantized(w.astype(np.float16), None)
    if scheme.kind == "bf16":
        return Quantized(to_bfloat16_bits(w), None)
    wt = np.moveaxis(w, axis, 0)  # [d_in, d_out] view
    d_in = wt.shape[0]
    group = d_in if scheme.group is None else scheme.group
    if d_in % group:
        raise ValueError(f"group {group} does not divide the input width {d_in}")
    blocks = wt.astype(np.float64).reshape(d_in // group, group, -1)  # [n_groups, group, d_out]
    scales = (np.abs(blocks).max(axis=1) / scheme.qmax).astype(np.float32)  # [n_groups, d_out]
    safe = np.where(scales > 0, scales, 1).astype(np.float64)[:, None, :]
    codes = np.clip(np.rint(blocks / safe), -scheme.qmax, scheme.qmax).astype(np.int8).reshape(wt.shape)
    return Quantized(np.ascontiguousarray(np.moveaxis(codes, 0, axis)), np.ascontiguousarray(np.moveaxis(scales, 0, axis)))


def dequantize_tensor(q, scheme, axis=0):  # Quantized -> [..] float32
    """The float32 weights a Quantized tensor stands for: c * s per group (int), or the 16-bit values widened."""
    if scheme.kind == "fp16":
        return q.codes.astype(np.float32)
    if scheme.kind == "bf16":
        return from_bfloat16_bits(q.codes)
    codes = np.moveaxis(q.codes, axis, 0)  # [d_in, d_out]
    scales = np.moveaxis(q.scales, axis, 0)  # [n_groups, d_out]
    group = codes.shape[0] // scales.shape[0]
    w = codes.reshape(scales.shape[0], group, -1).astype(np.float32) * scales[:, None, :]
    return np.ascontiguousarray(np.moveaxis(w.reshape(codes.shape), 0, axis))


def round_trip(w, scheme, axis=0):  # [..] float32 -> [..] float32
    """dequantize_tensor(quantize_tensor(w)): the float32 weights a quantized model runs with."""
    return dequantize_tensor(quantize_tensor(w, scheme, axis), scheme, axis)


def to_bfloat16_bits(w):  # float32 [..] -> uint16 [..]
    """The bfloat16 nearest to each float32 (ties to even), as its 16 bits. Raises ValueError if one rounds to inf."""
    u = np.asarray(w, dtype=np.float32).view(np.uint32)
    bits = ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    if not np.isfinite(from_bfloat16_bits(bits)).all():
        raise ValueError("a weight rounds to inf in bfloat16")
    return bits


def from_bfloat16_bits(bits):  # uint16 [..] -> float32 [..]
    """The float32 values of bfloat16 bit patterns (exact: bfloat16 is float32's upper half)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def quantize_tensors(tensors, scheme):
    """{name: Quantized} for the tensors of `tensors` ({name: float32 array}, npspec.sources.files names) that scheme quantizes.

    Raises ValueError as check_scheme and quantize_tensor.
    """
    check_scheme(scheme, {n: t.shape for n, t in tensors.items()})
    return {n: quantize_tensor(tensors[n], scheme, input_axis(n)) for n in quantized_names(tensors, scheme)}


def dequantize_tensors(tensors, quantized, scheme):
    """`tensors` with every quantized name replaced by its float32 dequantization (a new dict; others shared)."""
    out = dict(tensors)
    out.update({n: dequantize_tensor(q, scheme, input_axis(n)) for n, q in quantized.items()})
    return out


def weight_bytes(shapes, scheme):
    """Bytes of the weight matrices a one-token forward reads: the block linears and the tied head wte.

    shapes: {name: shape}. A quantized matrix counts bits/8 bytes a weight (codes packed, as a
    kernel that reads them would store them) plus 4 bytes a float32 scale; a float32 one 4
    bytes a weight. wpe (one row a token), biases and layer norms are left out, as in
    bench.models.matrix_bytes. Returns a float (bytes).
    """
    chosen = set(quantized_names(shapes, scheme))
    total = 0.0
    for name, shape in shapes.items():
        if name != "wte.weight" and not name.endswith(LINEAR_SUFFIXES):
            continue
        n = int(np.prod(shape))
        if name not in chosen:
            total += 4 * n
        elif scheme.kind == "int":
            total += n * scheme.bits / 8 + 4 * n // (shape[input_axis(name)] if scheme.group is None else scheme.group)
        else:
            total += 2 * n
    return total


# ---- activation-aware scaling (AWQ: Lin et al., "AWQ: Activation-aware Weight Quantization for LLM
#      Compression and Acceleration", MLSys 2024, arXiv:2306.00978, Section 3.2, Eqs. 4-5)

AWQ_GRID = 20  # alpha = 0, 1/20, ..., 19/20, as the authors' code (llm-awq, auto_scale: n_grid = 20)
AWQ_MIN_MAGNITUDE = 1e-4  # channel magnitudes are clamped here first, as in llm-awq


def awq_objective(x, w, wq):  # [n, d_in], [d_in, d_out], [d_in, d_out] -> float
    """The calibration objective AWQ minimises: mean squared error of the layer's outputs, mean((x wq - x w)^2)."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.mean((x @ wq.astype(np.float64) - x @ w.astype(np.float64)) ** 2))


def awq_round_trip(w, s, scheme):  # [d_in, d_out] float32, [d_in] float32 -> [d_in, d_out] float32
    """The weights a scaled quantization stands for: Q(diag(s) w) / s row by row (Q: round_trip along axis 0).

    Mathematically the same product as AWQ's Q(w diag(s)) (diag(s)^-1 x) with the division
    folded into the weights instead of the previous operation (npspec dequantizes at load).
    """
    s = np.asarray(s, dtype=np.float32)[:, None]
    return (round_trip(np.asarray(w, dtype=np.float32) * s, scheme, 0) / s).astype(np.float32)


def awq_search(x, w, scheme, grid=AWQ_GRID):
    """AWQ's search for per-input-channel scales of one linear layer: (s `[d_in]` float32, alpha, losses `[grid]`).

    x: `[n, d_in]` calibration inputs of the layer (from TRAINING data, never the data it is
    evaluated on); w: `[d_in, d_out]` float32 (Conv1D layout, input axis 0); scheme: an int
    Scheme. Lin et al. 2024, Section 3.2: s_X = mean |x| per input channel (clamped at 1e-4),
    s = s_X^alpha normalised by sqrt(max s * min s), for alpha on a grid of `grid` points in
    [0, 1); the alpha whose awq_round_trip minimises awq_objective wins (the first on ties).
    alpha = 0 gives s = 1, plain round-to-nearest, so the result is never worse than RTN on
    the calibration objective. Raises ValueError for a 16-bit scheme (nothing to scale).
    """
    if scheme.kind != "int":
        raise ValueError(f"AWQ scales integer schemes only, not {scheme.name}")
    x = np.asarray(x, dtype=np.float32)
    magnitude = np.maximum(np.abs(x).mean(axis=0), AWQ_MIN_MAGNITUDE).astype(np.float64)
    losses, best = [], None
    for i in range(grid):
        alpha = i / grid
        s = magnitude ** alpha
        s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
        losses.append(awq_objective(x, w, awq_round_trip(w, s, scheme)))
        if best is None or losses[-1] < losses[best[1]]:
            best = (s, i)
    return best[0], best[1] / grid, np.array(losses)
