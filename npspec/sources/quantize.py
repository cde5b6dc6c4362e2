"""Weight-only quantization of a GPT-2's tensors: schemes, round-to-nearest, 16-bit round trips, AWQ's scale search.

A scheme's name (parse_scheme): `int<b>-ch` (symmetric RTN, one scale per output channel, b in 2..8), `int<b>-g<G>`
(one scale per G consecutive input weights of a channel), `fp16` / `bf16` (a round trip, ties to even); `+emb`
quantizes wte and wpe too (so the tied head), else only the block linears; layer norms and biases stay float32.
Symmetric RTN (the baseline of GPTQ, Frantar et al. 2023, and AWQ, Lin et al. 2024): qmax = 2^(b-1) - 1, a group's
scale s = max|w| / qmax (float32, 0 for an all-zero group), codes c = clip(rint(w / s), -qmax, qmax) (int8, from
float64), weights c * s: each within s / 2, and a tensor on the grid reproduced exactly. Input axis: 0 for block
linears `[in, out]`, 1 for wte/wpe `[rows, n_embd]`; scales have it divided by G. Imports numpy only; no I/O.
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
    """A scheme: kind "int", "fp16" or "bf16"; bits 2..8 (16 for the float kinds); group: input weights per
    scale (None: per channel); embeddings: whether wte and wpe are quantized."""

    kind: str
    bits: int
    group: int | None = None
    embeddings: bool = False

    @property
    def name(self):  # as parse_scheme reads it: "int4-g64", "int8-ch+emb", "bf16"
        base = self.kind if self.kind != "int" else f"int{self.bits}-" + ("ch" if self.group is None else f"g{self.group}")
        return base + ("+emb" if self.embeddings else "")

    @property
    def qmax(self):  # the largest code, 2^(bits-1) - 1 (int kind)
        return 2 ** (self.bits - 1) - 1


class Quantized(NamedTuple):
    """A quantized tensor: codes shaped as it (int8; float16 for fp16; uint16 bits for bf16), scales float32
    (None for the float kinds)."""

    codes: np.ndarray
    scales: np.ndarray | None


def parse_scheme(text):
    """The Scheme a name stands for ("int4-g64", "int8-ch+emb", "fp16"...). Raises ValueError naming the
    valid forms: bits outside 2..8, a group below 2, no granularity (`int4`), anything unknown."""
    text = str(text).strip()
    base, plus, tail = text.partition("+")
    if plus and tail != "emb":
        raise ValueError(f"unknown quantization scheme {text!r}: the only suffix is +emb; use {SCHEME_HELP}")
    embeddings = bool(plus)
    if base in ("fp16", "bf16"):
        return Scheme(base, 16, None, embeddings)
    m = re.fullmatch(r"int([0-9]+)(?:-(ch|g([0-9]+)))?", base)  # ASCII digits only, as every number npspec reads
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


def input_axis(name):  # the reduction axis of a tensor: 0 for block linears `[in, out]`, 1 for wte/wpe
    return 1 if name in EMBEDDINGS else 0


def quantized_names(names, scheme):  # -> the names, in order, that `scheme` quantizes
    chosen = LINEAR_SUFFIXES + (EMBEDDINGS if scheme.embeddings else ())
    return [n for n in names if n.endswith(chosen) and (n in EMBEDDINGS or n.startswith("h."))]


def check_scheme(scheme, shapes):
    """Raise ValueError (one line) if the group does not divide the input width of a tensor of `shapes`
    ({name: shape}) the scheme quantizes."""
    if scheme.group is None:
        return
    for name in quantized_names(shapes, scheme):
        width = shapes[name][input_axis(name)]
        if width % scheme.group:
            raise ValueError(f"quantization scheme {scheme.name!r}: group {scheme.group} does not divide the input "
                             f"width {width} of {name}; pick a group that divides every width (n_embd and 4 n_embd)")


def quantize_tensor(w, scheme, axis=0):  # [..] float32 -> Quantized
    """Quantize the 2-D float32 `w` (input axis `axis`) by `scheme` (module docstring). Raises ValueError
    for a group that does not divide the input width, a value not finite or past the 16-bit range (fp16: 65504)."""
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


def dequantize_tensor(q, scheme, axis=0):  # Quantized -> [..] float32: c * s per group, or the 16-bit values
    if scheme.kind == "fp16":
        return q.codes.astype(np.float32)
    if scheme.kind == "bf16":
        return from_bfloat16_bits(q.codes)
    codes = np.moveaxis(q.codes, axis, 0)  # [d_in, d_out]
    scales = np.moveaxis(q.scales, axis, 0)  # [n_groups, d_out]
    group = codes.shape[0] // scales.shape[0]
    w = codes.reshape(scales.shape[0], group, -1).astype(np.float32) * scales[:, None, :]
    return np.ascontiguousarray(np.moveaxis(w.reshape(codes.shape), 0, axis))


def round_trip(w, scheme, axis=0):  # [..] float32 -> [..] float32: the weights a quantized model runs with
    return dequantize_tensor(quantize_tensor(w, scheme, axis), scheme, axis)


def to_bfloat16_bits(w):  # float32 [..] -> uint16 [..]
    """The nearest bfloat16 of each float32 (ties to even), as its bits. Raises ValueError past the range."""
    u = np.asarray(w, dtype=np.float32).view(np.uint32)
    bits = ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    if not np.isfinite(from_bfloat16_bits(bits)).all():
        raise ValueError("a weight rounds to inf in bfloat16")
    return bits


def from_bfloat16_bits(bits):  # uint16 [..] -> float32 [..], exact (bfloat16 is float32's upper half)
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def quantize_tensors(tensors, scheme):
    """{name: Quantized} of the tensors ({name: float32 array}) the scheme quantizes. Raises as
    check_scheme and quantize_tensor."""
    check_scheme(scheme, {n: t.shape for n, t in tensors.items()})
    return {n: quantize_tensor(tensors[n], scheme, input_axis(n)) for n in quantized_names(tensors, scheme)}


def dequantize_tensors(tensors, quantized, scheme):  # -> a new dict, each quantized name dequantized
    out = dict(tensors)
    out.update({n: dequantize_tensor(q, scheme, input_axis(n)) for n, q in quantized.items()})
    return out


def weight_bytes(shapes, scheme):
    """Bytes a one-token forward reads of its matrices (block linears and the tied head): bits/8 a quantized
    weight plus 4 a scale, 4 a float32 weight (wpe, biases and layer norms left out, as bench.models.matrix_bytes)."""
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


def awq_objective(x, w, wq):  # [n, d_in], [d_in, d_out], [d_in, d_out] -> float: mean((x wq - x w)^2)
    x = np.asarray(x, dtype=np.float64)
    return float(np.mean((x @ wq.astype(np.float64) - x @ w.astype(np.float64)) ** 2))


def awq_round_trip(w, s, scheme):  # [d_in, d_out] float32, [d_in] float32 -> [d_in, d_out] float32
    """Q(diag(s) w) / s row by row (Q: round_trip on axis 0): AWQ's Q(w diag(s)) (diag(s)^-1 x) with the
    division folded into the weights."""
    s = np.asarray(s, dtype=np.float32)[:, None]
    return (round_trip(np.asarray(w, dtype=np.float32) * s, scheme, 0) / s).astype(np.float32)


def awq_search(x, w, scheme, grid=AWQ_GRID):
    """(s `[d_in]` float32, alpha, losses `[grid]`): AWQ's per-input-channel scales of one linear (Lin et al.
    2024, section 3.2) from x `[n, d_in]` (TRAINING inputs) and w `[d_in, d_out]`: s = s_X^alpha / sqrt(max * min),
    s_X = mean |x| (>= 1e-4), the alpha of `grid` points in [0, 1) minimising awq_objective (the first on ties; alpha 0
    is RTN, so never worse on it). Raises ValueError for a 16-bit scheme."""
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
