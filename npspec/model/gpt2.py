"""GPT-2's forward in NumPy (Radford et al. 2019) with an explicit KV cache: token + position embeddings, pre-LN
blocks (causal attention, tanh-GELU MLP), `ln_f`, an LM head tied to `wte`. The checkpoint's tree in Conv1D layout
`[in, out]`, float32 end to end; every product goes through `linear(x, w, b=None)` and attention through `attend(q,
k, v, n_past)`, the caller's (npspec.kernels). Imports numpy and npspec.kernels.layout (the KV cache's memory): no I/O,
RNG, threads or module state.
"""

import math
from dataclasses import dataclass

import numpy as np

from ..kernels.layout import lazy_zeros


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2's hyperparameters (hparams.json's names). Raises ValueError for a size that is not a positive int,
    n_embd not divisible by n_head, a layer_norm_epsilon not positive and finite in float32, an eos_token_id outside
    the vocabulary."""

    n_vocab: int
    n_ctx: int
    n_embd: int
    n_head: int
    n_layer: int
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = None

    def __post_init__(self):
        for name in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"config: {name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"config: n_embd ({self.n_embd}) is not divisible by n_head ({self.n_head}); "
                "fix the checkpoint's config.json")
        eps = self.layer_norm_epsilon
        shown = repr(eps) if len(repr(eps)) <= 40 else f"an integer of {len(str(eps)):,} digits"
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not 0 < eps < float("inf"):
            raise ValueError(f"config: layer_norm_epsilon must be a finite number > 0, got {shown}")
        if eps > float(np.finfo(np.float32).max) or not np.float32(eps) > 0:  # 1e300 is inf in float32, 1e-50 is 0
            raise ValueError(f"config: layer_norm_epsilon must be a finite number > 0, got {shown}, which is "
                             f"{'inf' if eps > 1 else '0'} in float32 (the forward's type)")
        if self.eos_token_id is not None and not 0 <= self.eos_token_id < self.n_vocab:
            raise ValueError(f"config: eos_token_id {self.eos_token_id} is outside [0, {self.n_vocab})")

    @property
    def d_head(self):
        return self.n_embd // self.n_head


class ContextOverflowError(ValueError):
    """A forward would run past the model's context `n_ctx`."""


class KVCache:
    """Keys and values, float32 `[n_layer, n_head, n_ctx, d_head]` each, of positions 0 .. length-1; preallocated, so
    rollback is O(1). Memory: `2 * n_layer * n_ctx * n_embd * 4` bytes reserved, committed a page at a time as
    positions are written."""

    def __init__(self, config):
        shape = (config.n_layer, config.n_head, config.n_ctx, config.d_head)
        self.k = lazy_zeros(shape)  # memory as positions are written (kernels.layout)
        self.v = lazy_zeros(shape)
        self.n_ctx = config.n_ctx
        self.length = 0

    def rollback(self, length):
        """Forget positions from `length` on. Raises TypeError for a non-integer, ValueError unless
        0 <= length <= self.length."""
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
            raise TypeError(f"rollback's length must be an integer, got {length!r} (a {type(length).__name__})")
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll the cache back to {length}: it holds {self.length} positions")
        self.length = length

    def keep(self, rows, start):  # rows: [m] positions >= start, increasing -> positions start .. start + m - 1
        """Move positions `rows` (increasing, each >= start + its index) to start, start + 1, ... and end the
        cache there (a tree's accepted path; the prefix untouched). Raises ValueError otherwise."""
        rows = [int(r) for r in rows]
        if any(not start + i <= r < self.length for i, r in enumerate(rows)) or rows != sorted(set(rows)):
            raise ValueError(f"cannot keep positions {rows} from {start}: the cache holds {self.length}")
        self.k[:, :, start:start + len(rows)] = self.k[:, :, rows]
        self.v[:, :, start:start + len(rows)] = self.v[:, :, rows]
        self.length = start + len(rows)


# ---- one concept per function (shapes: n = new rows, d = n_embd, h = n_head, t = keys) ----

def gelu(x):  # [n, d] -> [n, d]; the tanh approximation GPT-2 was trained with
    return 0.5 * x * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * (x * x * x))))


def softmax(x):  # [..., m] -> [..., m], over the last axis; x untouched, its temporary reused
    e = x - np.maximum.reduce(x, axis=-1, keepdims=True)
    np.exp(e, out=e)
    return np.divide(e, np.add.reduce(e, axis=-1, keepdims=True), out=e)


def layer_norm(x, g, b, eps):  # [n, d], [d], [d] -> [n, d]; row-wise, so rows never mix
    d = np.float32(x.shape[-1])
    mean = np.add.reduce(x, axis=-1, keepdims=True) / d
    xc = x - mean
    var = np.add.reduce(xc * xc, axis=-1, keepdims=True) / d
    return g * xc / np.sqrt(var + np.float32(eps)) + b


def head_scale(d_head):  # -> float32 1 / sqrt(d_head), the scores' scale
    return np.float32(1 / math.sqrt(d_head))


def attend_row(q_row, k, v, t, scale):  # [h, 1, dh], [h, T, dh], [h, T, dh], keys 0 .. t-1, head_scale -> [h, 1, dh];
    # every invariant attention path computes a row with this one call
    scores = q_row @ k[:, :t].transpose(0, 2, 1)  # [h, 1, t]
    scores *= scale
    return softmax(scores) @ v[:, :t]  # [h, 1, dh]


def attention(q, k, v, n_past):  # [h, n, dh], [h, T, dh], [h, T, dh] -> [h, n, dh]
    """Causal attention, row i over exactly its key prefix 0 .. n_past + i with the same call shapes whatever
    n is: its bits never depend on the other rows (batch invariance, npspec.kernels.products)."""
    out, scale = np.empty_like(q), head_scale(q.shape[-1])
    for i in range(q.shape[1]):
        out[:, i : i + 1] = attend_row(q[:, i : i + 1], k, v, n_past + i + 1, scale)
    return out


def tree_paths(parents):  # [n] ints (-1: hangs after the cache; else an earlier row) -> [n] lists of rows
    """Each row's path from the tree's top. Raises ValueError for a parent not -1 or an earlier row."""
    paths = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"row {i}'s parent is {parent}: a parent must be -1 or an earlier row")
        paths.append((paths[parent] if parent >= 0 else []) + [i])
    return paths


def tree_attention(paths):  # -> attend(q, k, v, n_past) for rows laid out as a tree
    """Tree attention: row i attends to the cached prefix and its path's rows, put at positions n_past ..
    while it runs (then put back), so it computes attend_row exactly as a one-token forward after its path would."""
    def attend(q, k, v, n_past):  # [h, n, dh], [h, T, dh], [h, T, dh] -> [h, n, dh]
        n = q.shape[1]
        k_new, v_new = k[:, n_past:n_past + n].copy(), v[:, n_past:n_past + n].copy()
        out, scale = np.empty_like(q), head_scale(q.shape[-1])
        for i, path in enumerate(paths):
            t = n_past + len(path)
            k[:, n_past:t], v[:, n_past:t] = k_new[:, path], v_new[:, path]
            out[:, i : i + 1] = attend_row(q[:, i : i + 1], k, v, t, scale)
        k[:, n_past:n_past + n], v[:, n_past:n_past + n] = k_new, v_new
        return out
    return attend


def attention_masked(q, k, v, n_past):  # [h, n, dh], [h, T, dh], [h, T, dh] -> [h, n, dh]
    """Causal attention of all rows in one product, future keys masked (each row keeps its own key):
    faster for a prompt, not batch invariant."""
    n, t = q.shape[1], n_past + q.shape[1]
    scores = q @ k[:, :t].transpose(0, 2, 1) * head_scale(q.shape[-1])  # [h, n, t]
    future = np.arange(t)[None, :] > (n_past + np.arange(n))[:, None]  # [n, t]; diagonal False
    scores = np.where(future, np.float32(-np.inf), scores)
    return softmax(scores) @ v[:, :t]


def mha(x, c_attn, c_proj, cache, layer, n_head, linear, attend):  # [n, d] -> [n, d]
    n, d = x.shape
    qkv = linear(x, **c_attn)  # [n, 3d]
    q, k, v = (qkv[:, i * d : (i + 1) * d].reshape(n, n_head, d // n_head).transpose(1, 0, 2) for i in range(3))
    n_past = cache.length
    cache.k[layer, :, n_past : n_past + n] = k  # [h, n, dh]
    cache.v[layer, :, n_past : n_past + n] = v
    heads = attend(q, cache.k[layer], cache.v[layer], n_past)  # [h, n, dh]
    return linear(heads.transpose(1, 0, 2).reshape(n, d), **c_proj)


def ffn(x, c_fc, c_proj, linear):  # [n, d] -> [n, d]
    return linear(gelu(linear(x, **c_fc)), **c_proj)


def block(x, p, cache, layer, config, linear, attend):  # [n, d] -> [n, d]
    eps = config.layer_norm_epsilon
    x = x + mha(layer_norm(x, **p["ln_1"], eps=eps), **p["attn"], cache=cache, layer=layer,
                n_head=config.n_head, linear=linear, attend=attend)
    return x + ffn(layer_norm(x, **p["ln_2"], eps=eps), **p["mlp"], linear=linear)


def gpt2(ids, params, config, cache, linear, attend=attention, positions=None):  # [n_new] -> [n_new, n_vocab]
    """Logits float32 `[n_new, n_vocab]` of `ids` (int `[n_new]` in [0, n_vocab)) fed after `cache.length`, which
    advances by n_new. linear(x `[n, d_in]`, w `[d_in, d_out]`, b `[d_out]` or None) -> `[n, d_out]` runs every
    product (the tied head `linear(x, wte.T)` too); attend: attention, attention_masked or tree_attention(paths);
    positions: `[n_new]` (default cache.length + 0 ..). A batch-invariant linear with `attention` makes row i
    bit-identical to feeding the ids one at a time. Raises ContextOverflowError past n_ctx, before any work, and
    ValueError for ids not 1-D integers in range or another model's cache."""
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be a 1-D array of token ids [n_new], got shape {list(ids.shape)}; "
                         "feed one sequence at a time")
    keys = getattr(cache, "k", None)
    if np.shape(keys) != (config.n_layer, config.n_head, config.n_ctx, config.d_head):
        got = list(np.shape(keys)) if keys is not None else f"a {type(cache).__name__}"
        raise ValueError(f"cache must be this model's KVCache [n_layer, n_head, n_ctx, d_head] = "
                         f"{[config.n_layer, config.n_head, config.n_ctx, config.d_head]}, got {got}; "
                         "make one with model.new_cache()")
    n_new, n_past = len(ids), cache.length
    if n_past + n_new > config.n_ctx:
        raise ContextOverflowError(
            f"{n_past} cached + {n_new} new positions exceed the context n_ctx={config.n_ctx}; "
            "shorten the prompt or max_new_tokens")
    if n_new == 0:
        return np.zeros((0, config.n_vocab), dtype=np.float32)
    if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= config.n_vocab:
        raise ValueError(f"ids must be integers in [0, {config.n_vocab})")
    positions = np.arange(n_past, n_past + n_new) if positions is None else positions
    x = params["wte"][ids] + params["wpe"][positions]  # [n_new, d]
    for layer, p in enumerate(params["h"]):
        x = block(x, p, cache, layer, config, linear, attend)
    cache.length = n_past + n_new
    x = layer_norm(x, **params["ln_f"], eps=config.layer_norm_epsilon)
    return linear(x, params["wte"].T)  # [n_new, n_vocab]; the head is tied to wte


def gpt2_tree(ids, parents, params, config, cache, linear):  # [n_new], [n_new] -> [n_new, n_vocab]
    """Logits of a tree of ids (parents[i]: -1 after the cache, else an earlier row) in one forward: row i sits
    at position cache.length + len(its path) - 1 and attends to the prefix and its path (tree_attention), stored in
    feed order (KVCache.keep keeps a path). Raises as gpt2 and for bad parents."""
    paths = tree_paths(parents)
    positions = cache.length + np.array([len(path) - 1 for path in paths], dtype=np.int64)
    return gpt2(ids, params, config, cache, linear, tree_attention(paths), positions)
