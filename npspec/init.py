"""Randomly initialised GPT-2 weights, with GPT-2's initialisation scheme.

Radford et al. 2019, section 2.3 / openai/gpt-2 `model.py`: weights ~ N(0, 0.02), the residual
projections (`attn.c_proj`, `mlp.c_proj`) scaled by 1/sqrt(2 * n_layer), biases 0, layer-norm
gains 1. Used for tests and for timing full-size shapes, which cost the same time as trained
weights.
"""

import numpy as np

from .checkpoint import tensor_shapes


def init_tensors(config, seed=0):
    """`{name: float32 array}` for every tensor of `config` (names as in checkpoint.tensor_shapes)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(config).items():
        if name.endswith("bias"):
            a = np.zeros(shape, dtype=np.float32)
        elif ".ln_" in name or name.startswith("ln_f"):
            a = np.ones(shape, dtype=np.float32)
        else:
            std = 0.02 / np.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        out[name] = a
    return out
