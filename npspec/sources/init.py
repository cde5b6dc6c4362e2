"""Randomly initialised GPT-2 weights, GPT-2's scheme (Radford et al. 2019 section 2.3, openai/gpt-2 model.py):
weights N(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2 n_layer), biases 0, gains
1; for tests and for timing full-size shapes. Imports npspec.model.tensors, npspec.sources.progress, numpy.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..model.tensors import tensor_shapes
from .progress import bar


def init_tensors(config, seed=0, progress=None):
    """{name: float32 array} of every tensor of `config` (tensor_shapes' names); progress: None or a bar
    factory."""
    rng = np.random.default_rng(seed)
    out = {}
    shapes = tensor_shapes(config)
    with bar(progress, f"random weights (seed {seed})", 4 * sum(int(np.prod(s)) for s in shapes.values())) as b:
        for name, shape in shapes.items():
            out[name] = _init_tensor(name, shape, config, rng)
            b.update(out[name].nbytes)
    return out


def iter_tensors(config, seed=0, progress=None):
    """(name, float32 array) of every tensor of `config` in tensor_shapes' order, init_tensors' values, the
    next drawn on one worker thread while the caller uses the current one (at most three exist at once; the values never
    depend on the timing). progress: None or a bar factory."""
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
    """One float32 tensor: biases 0, layer-norm gains 1, weights N(0, std)."""
    if name.endswith("bias"):
        return np.zeros(shape, dtype=np.float32)
    if ".ln_" in name or name.startswith("ln_f"):
        return np.ones(shape, dtype=np.float32)
    std = 0.02 / np.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
    a = rng.standard_normal(shape, dtype=np.float32)
    a *= np.float32(std)  # in place: no second array (the same float32 products)
    return a


def init_tensors_varied(config, seed=0):
    """Test weights: GPT-2's init with embeddings 5x and block weights 20x, gains N(1, 0.2) and
    biases N(0, 0.1), so that no token dominates and a swapped or ignored parameter shows. {name: float32 array}."""
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
