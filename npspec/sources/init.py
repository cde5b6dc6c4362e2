"""Randomly initialised GPT-2 weights, with GPT-2's initialisation scheme.

Radford et al. 2019, section 2.3 / openai/gpt-2 `model.py`: weights ~ N(0, 0.02), the residual
projections (`attn.c_proj`, `mlp.c_proj`) scaled by 1/sqrt(2 * n_layer), biases 0, layer-norm
gains 1. Used for tests and for timing full-size shapes, which cost the same time as trained
weights. Imports npspec.sources.files (the tensor names), npspec.sources.progress and numpy; no I/O of its own.

Drawing the normals is the cost (gpt2-large: 774 M of them, about 16 s on one core here); every
other step is done in place or overlapped with it: `iter_tensors` draws the next tensor on a worker
thread while its caller writes the current one (npspec.sources.cache builds a `random:` model so).
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..model.tensors import tensor_shapes
from .progress import bar


def init_tensors(config, seed=0, progress=None):
    """`{name: float32 array}` for every tensor of `config` (names as in files.tensor_shapes).

    progress: a bar factory (npspec.sources.progress; None shows nothing), advanced by each tensor's bytes.
    """
    rng = np.random.default_rng(seed)
    out = {}
    shapes = tensor_shapes(config)
    with bar(progress, f"random weights (seed {seed})", 4 * sum(int(np.prod(s)) for s in shapes.values())) as b:
        for name, shape in shapes.items():
            out[name] = _init_tensor(name, shape, config, rng)
            b.update(out[name].nbytes)
    return out


def iter_tensors(config, seed=0, progress=None):
    """Yield `(name, float32 array)` for every tensor of `config`, in files.tensor_shapes order: init_tensors' values.

    The next tensor is drawn on one worker thread (numpy's generator releases the GIL while it fills an
    array) while the caller uses the current one, so writing the weights costs little time beyond
    drawing them, and at most three tensors exist at once (not the weight bytes). The generator is
    only ever used by that one thread, in order: the values never depend on the timing.
    progress: a bar factory (npspec.sources.progress; None shows nothing), advanced by each tensor's bytes.
    """
    rng = np.random.default_rng(seed)
    shapes = list(tensor_shapes(config).items())

    def draw(i):
        name, shape = shapes[i]
        return name, _init_tensor(name, shape, config, rng)

    with bar(progress, f"random weights (seed {seed})", 4 * sum(int(np.prod(s)) for _, s in shapes)) as b, \
            ThreadPoolExecutor(1, thread_name_prefix="npspec-init") as pool:
        pending = pool.submit(draw, 0)
        for i in range(1, len(shapes) + 1):
            name, a = pending.result()
            pending = pool.submit(draw, i) if i < len(shapes) else None
            b.update(a.nbytes)
            yield name, a


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
