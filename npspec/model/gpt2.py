"""GPT-2 in NumPy: the math of the forward pass, with an explicit KV cache.

Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2): token +
learned position embeddings, pre-LN transformer blocks (LN -> causal multi-head attention ->
residual, LN -> MLP with tanh GELU -> residual), a final layer norm `ln_f`, and an LM head tied
to the token embedding `wte`. Parameters arrive as the checkpoint's own tree
(`params["h"][i]["attn"]["c_attn"]["w"]`), in GPT-2's Conv1D layout `[in, out]`, float32 end to end.

Every product goes through one callable, `linear(x, w, b=None)`, and attention through one
callable, `attention(q, k, v, n_past)`: which kernels run is the caller's choice
(npspec.kernels.products holds them, npspec.model.model picks them). Imports numpy only: no I/O, no RNG, no
threads, no environment, no module state.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GPT2Config:
    """Hyperparameters of a GPT-2 checkpoint (names as in GPT-2's hparams.json).

    Raises ValueError for a non-positive size, n_embd not divisible by n_head, a
    layer_norm_epsilon that is not a positive number finite in float32 (1e300 is inf there: the forward
    runs in float32), or an eos_token_id outside the vocabulary.
    """

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
    """Keys and values of every position fed so far, preallocated up to `n_ctx`.

    k, v: float32 `[n_layer, n_head, n_ctx, d_head]`; positions `0 .. length-1` are valid.
    Rolling back is `rollback(n)`: O(1), no copy (later forwards overwrite the stale rows).
    Memory: `2 * n_layer * n_ctx * n_embd * 4` bytes.
    """

    def __init__(self, config):
        shape = (config.n_layer, config.n_head, config.n_ctx, config.d_head)
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.n_ctx = config.n_ctx
        self.length = 0

    def rollback(self, length):
        """Forget every position from `length` on. Raises TypeError unless `length` is a Python or NumPy integer,
        ValueError unless 0 <= length <= the current length."""
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
            raise TypeError(f"rollback's length must be an integer, got {length!r} (a {type(length).__name__})")
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll the cache back to {length}: it holds {self.length} positions")
        self.length = length

    def keep(self, rows, start):  # rows: [m] positions >= start, increasing -> positions start .. start + m - 1
        """Move the keys and values at positions `rows` to `start, start + 1, ...` and end the cache there.

        After a tree verify (gpt2_tree) this keeps the accepted path: O(len(rows)) rows copied, the
        prefix before `start` untouched. Raises ValueError unless start <= rows[0] < ... < length.
        """
        rows = [int(r) for r in rows]
        if any(not start + i <= r < self.length for i, r in enumerate(rows)) or rows != sorted(set(rows)):
            raise ValueError(f"cannot keep positions {rows} from {start}: the cache holds {self.length}")
        self.k[:, :, start:start + len(rows)] = self.k[:, :, rows]
        self.v[:, :, start:start + len(rows)] = self.v[:, :, rows]
        self.length = start + len(rows)


# ---- one concept per function (shapes: n = new rows, d = n_embd, h = n_head, t = keys) ----

def gelu(x):  # [n, d] -> [n, d]; the tanh approximation GPT-2 was trained with
    return 0.5 * x * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * (x * x * x))))


def softmax(x):  # [..., m] -> [..., m], over the last axis
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.add.reduce(e, axis=-1, keepdims=True)


def layer_norm(x, g, b, eps):  # [n, d], [d], [d] -> [n, d]; row-wise, so rows never mix
    d = np.float32(x.shape[-1])
    mean = np.add.reduce(x, axis=-1, keepdims=True) / d
    xc = x - mean
    var = np.add.reduce(xc * xc, axis=-1, keepdims=True) / d
    return g * xc / np.sqrt(var + np.float32(eps)) + b


def attend_row(q_row, k, v, t):  # [h, 1, dh], [h, T, dh], [h, T, dh], keys 0 .. t-1 -> [h, 1, dh]
    """One query row over the key prefix 0 .. t-1: the one computation every invariant attention path shares."""
    scores = q_row @ k[:, :t].transpose(0, 2, 1) * np.float32(1 / np.sqrt(q_row.shape[-1]))  # [h, 1, t]
    return softmax(scores) @ v[:, :t]  # [h, 1, dh]


def attention(q, k, v, n_past):  # [h, n, dh], [h, T, dh], [h, T, dh] -> [h, n, dh]
    """Causal attention, each query row over exactly its key prefix 0 .. n_past + i.

    Row i is computed with the same call shapes whatever n is, so its bits never depend on the
    other rows (batch invariance, see npspec.kernels.products).
    """
    out = np.empty_like(q)
    for i in range(q.shape[1]):
        out[:, i : i + 1] = attend_row(q[:, i : i + 1], k, v, n_past + i + 1)
    return out


def tree_paths(parents):  # [n] ints (-1: hangs after the cache; else an earlier row) -> [n] lists of rows
    """Each row's path of rows from the top of the tree down to itself. Raises ValueError for a parent
    that is not -1 or an earlier row."""
    paths = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"row {i}'s parent is {parent}: a parent must be -1 or an earlier row")
        paths.append((paths[parent] if parent >= 0 else []) + [i])
    return paths


def tree_attention(paths):  # -> attend(q, k, v, n_past) for rows laid out as a tree
    """Tree attention: row i attends to the cached prefix 0 .. n_past-1 and to the rows of its path.

    For each row, its path's keys and values are put at positions n_past .. n_past + len(path) - 1
    of the cache (then put back), so the row runs `attend_row` over a key prefix exactly as a
    one-token forward after the path would: same values, same call shapes, same bits.
    """
    def attend(q, k, v, n_past):  # [h, n, dh], [h, T, dh], [h, T, dh] -> [h, n, dh]
        n = q.shape[1]
        k_new, v_new = k[:, n_past:n_past + n].copy(), v[:, n_past:n_past + n].copy()
        out = np.empty_like(q)
        for i, path in enumerate(paths):
            t = n_past + len(path)
            k[:, n_past:t], v[:, n_past:t] = k_new[:, path], v_new[:, path]
            out[:, i : i + 1] = attend_row(q[:, i : i + 1], k, v, t)
        k[:, n_past:n_past + n], v[:, n_past:n_past + n] = k_new, v_new
        return out
    return attend


def attention_masked(q, k, v, n_past):  # [h, n, dh], [h, T, dh], [h, T, dh] -> [h, n, dh]
    """Causal attention for all rows in one product, future keys masked; every row keeps its own key.

    Faster for a long prompt; not batch invariant (a masked softmax over padded keys rounds
    differently from `attention`).
    """
    n, t = q.shape[1], n_past + q.shape[1]
    scores = q @ k[:, :t].transpose(0, 2, 1) * np.float32(1 / np.sqrt(q.shape[-1]))  # [h, n, t]
    future = np.arange(t)[None, :] > (n_past + np.arange(n))[:, None]  # [n, t]; diagonal False
    scores = np.where(future, np.float32(-np.inf), scores)
    return softmax(scores) @ v[:, :t]


def mha(x, c_attn, c_proj, cache, layer, n_head, linear, attend):  # [n, d] -> [n, d]
    n, d = x.shape
    qkv = linear(x, **c_attn)  # [n, 3d]
    q, k, v = (a.reshape(n, n_head, d // n_head).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))
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
    """Feed `ids` (the positions after `cache.length`) and return their logits.

    ids: int array `[n_new]`, values in `[0, n_vocab)`. Returns float32 logits
    `[n_new, n_vocab]` for every new position and advances `cache.length` by `n_new`.
    linear(x `[n, d_in]`, w `[d_in, d_out]`, b `[d_out]` or None) -> `[n, d_out]`: every product,
    the tied head `linear(x, wte.T)` included. attend: `attention` (each row over its key prefix),
    `attention_masked`, or `tree_attention(paths)`. positions: `[n_new]` position ids (default
    cache.length + 0 .. n_new-1; a tree's rows sit at the depth of their path, see gpt2_tree).
    With a batch-invariant `linear` (npspec.kernels.products) and `attention`, row i's logits are
    bit-identical to feeding the ids one at a time.
    Raises ContextOverflowError, before any work, if `cache.length + n_new > n_ctx`, and
    ValueError for ids that are not a 1-D array of integers in range, or a cache of another shape
    (another model's).
    """
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
    """Feed a tree of ids after the cache and return each row's logits (tree attention, one forward).

    parents[i]: -1 for a row that follows the cached prefix directly, else an earlier row. Row i
    sits at position cache.length + len(path) - 1 and attends to the prefix and its path
    (tree_attention). The rows are stored in the cache in feed order (positions cache.length ..);
    keep the accepted path with KVCache.keep. With a batch-invariant `linear`, row i's logits are
    bit-identical to one-token forwards along its path. Raises as gpt2 and for bad parents.
    """
    paths = tree_paths(parents)
    positions = cache.length + np.array([len(path) - 1 for path in paths], dtype=np.int64)
    return gpt2(ids, params, config, cache, linear, tree_attention(paths), positions)
