"""Randomly initialised GPT-2 weights, with GPT-2's initialisation scheme.

Radford et al. 2019, section 2.3 / openai/gpt-2 `model.py`: weights ~ N(0, 0.02), the residual
projections (`attn.c_proj`, `mlp.c_proj`) scaled by 1/sqrt(2 * n_layer), biases 0, layer-norm
gains 1. Used for tests and for timing full-size shapes, which cost the same time as trained
weights. Imports npspec.files (the tensor names), npspec.progress and numpy; no I/O of its own.
"""

import numpy as np

from .files import tensor_shapes
from .progress import bar


def init_tensors(config, seed=0, progress=None):
    """`{name: float32 array}` for every tensor of `config` (names as in files.tensor_shapes).

    progress: a bar factory (npspec.progress; None shows nothing), advanced by each tensor's bytes.
    """
    rng = np.random.default_rng(seed)
    out = {}
    shapes = tensor_shapes(config)
    with bar(progress, f"random weights (seed {seed})", 4 * sum(int(np.prod(s)) for s in shapes.values())) as b:
        for name, shape in shapes.items():
            out[name] = _init_tensor(name, shape, config, rng)
            b.update(out[name].nbytes)
    return out


def _init_tensor(name, shape, config, rng):
    """One tensor of GPT-2's initialisation (float32): biases 0, layer-norm gains 1, weights N(0, std)."""
    if name.endswith("bias"):
        return np.zeros(shape, dtype=np.float32)
    if ".ln_" in name or name.startswith("ln_f"):
        return np.ones(shape, dtype=np.float32)
    std = 0.02 / np.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
    a = rng.standard_normal(shape, dtype=np.float32)
    a *= np.float32(std)  # in place: no second array (the same float32 products)
    return a


def init_tensors_varied(config, seed=0):
    """Test weights: GPT-2's init with embeddings 5x and block weights 20x larger, random layer-norm
    gains N(1, 0.2) and biases N(0, 0.1).

    At GPT-2's own init the tied embedding decides the next token (greedy runs repeat one token) and
    gains 1 / biases 0 hide a swapped or ignored parameter; these weights expose both. Returns
    `{name: float32 array}` like init_tensors.
    """
    rng = np.random.default_rng(seed + 1000)
    out = {}
    for name, a in init_tensors(config, seed).items():
        if name.endswith("bias"):
            a = rng.normal(0, 0.1, a.shape).astype(np.float32)
        elif ".ln_" in name or name.startswith("ln_f"):
            a = (1 + rng.normal(0, 0.2, a.shape)).astype(np.float32)
        else:
            a = a * np.float32(5 if name in ("wte.weight", "wpe.weight") else 20)
        out[name] = a
    return out
