"""The models the benchmarks run: the shipped pair and in-memory random GPT-2 shapes.

A name is "shipped:target", "shipped:draft" or "random:<shape>" with a shape of
npspec.init.SHAPES (gpt2, gpt2-medium, gpt2-large, distilgpt2, ...). Random models are built in
memory with npspec.init.random_model (gpt2-large: 3.1e9 bytes of float32; build at most two
large ones at a time).
"""

import gc

import numpy as np

from npspec.init import random_model
from npspec.model import block_linears, panel_layout
from npspec.models import load


def get(name, seed=0, layout="panel"):
    """The Model called `name` (see the module docstring). Raises ValueError for another name.

    layout: "panel" keeps the block matrices in the panel layout npspec loads them in
    (npspec.model.panel_layout; the invariant forward then uses "panels"); "C" stores them
    row-major, as in the file (the invariant forward then uses "rows").
    """
    if name.startswith("shipped:"):
        model = load(None, name.split(":", 1)[1])
    elif name.startswith("random:"):
        model = random_model(name.split(":", 1)[1], seed=seed)
    else:
        raise ValueError(f"unknown benchmark model {name!r}: use shipped:target, shipped:draft or random:<shape>")
    if layout == "panel":
        panel_layout(model.params)
    elif layout == "C":
        for lin in block_linears(model.params):
            lin["w"] = np.ascontiguousarray(lin["w"])
    else:
        raise ValueError(f"unknown layout {layout!r}: use 'panel' or 'C'")
    return model


def matrix_bytes(model):
    """Bytes a one-token forward streams from memory: every weight matrix plus the tied head `wte` (bytes).

    Excludes `wpe` (one row read per token), biases and layer-norm vectors (under 0.1%).
    """
    return model.params["wte"].nbytes + sum(lin["w"].nbytes for lin in block_linears(model.params))


def matmul_flops(model, m, n_past):
    """float32 operations of a forward over m new tokens after n_past cached ones (FLOPs).

    2 per multiply-add: the matrices and the head (2 * m * matrix parameters) plus attention
    (scores and weighted sum: 4 * d per query-key pair, query i seeing n_past + i + 1 keys).
    """
    c = model.config
    keys = m * n_past + m * (m + 1) // 2
    return 2 * m * matrix_bytes(model) // 4 + 4 * c.n_embd * keys * c.n_layer


def release():
    """Free the memory of models the caller has dropped (large random shapes)."""
    gc.collect()
