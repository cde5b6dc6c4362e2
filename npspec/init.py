"""Randomly initialised GPT-2 weights, with GPT-2's initialisation scheme.

Radford et al. 2019, section 2.3 / openai/gpt-2 `model.py`: weights ~ N(0, 0.02), the residual
projections (`attn.c_proj`, `mlp.c_proj`) scaled by 1/sqrt(2 * n_layer), biases 0, layer-norm
gains 1. Used for tests and for timing full-size shapes, which cost the same time as trained
weights.
"""

import numpy as np

from .checkpoint import tensor_shapes
from .model import GPT2Config


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

# Shapes of the GPT-2 family (Radford et al. 2019, Table 2; distilgpt2: Sanh et al. 2019), and tiny test shapes.
_GPT2 = dict(n_vocab=50257, n_ctx=1024, eos_token_id=50256)
SHAPES = {
    "gpt2": GPT2Config(n_embd=768, n_head=12, n_layer=12, **_GPT2),
    "gpt2-medium": GPT2Config(n_embd=1024, n_head=16, n_layer=24, **_GPT2),
    "gpt2-large": GPT2Config(n_embd=1280, n_head=20, n_layer=36, **_GPT2),
    "gpt2-xl": GPT2Config(n_embd=1600, n_head=25, n_layer=48, **_GPT2),
    "distilgpt2": GPT2Config(n_embd=768, n_head=12, n_layer=6, **_GPT2),
    "tiny": GPT2Config(n_embd=64, n_head=4, n_layer=2, **_GPT2),
    "tiny-draft": GPT2Config(n_embd=32, n_head=2, n_layer=1, **_GPT2),
}


def random_model(shape, seed=0, tokenizer=None):
    """An in-memory Model with the exact shapes of `shape` (a key of SHAPES) and random weights.

    tokenizer: a tokenizers.Tokenizer (default: GPT-2's, shipped in weights/gpt2/).
    Memory: the weight bytes (gpt2-large: 3.1e9 bytes). Raises KeyError for an unknown shape.
    """
    from pathlib import Path

    from .checkpoint import Model, params_tree
    from .model import panel_layout

    config = SHAPES[shape]
    if tokenizer is None:
        from tokenizers import Tokenizer

        from .models import shipped_dir

        tokenizer = Tokenizer.from_file(str(shipped_dir("gpt2", "tokenizer.json") / "tokenizer.json"))
    params = panel_layout(params_tree(init_tensors(config, seed), config))
    return Model(config, params, tokenizer, Path(f"random:{shape}"), {})
