"""GPT-2 in NumPy: the forward pass, with an explicit KV cache.

Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2): token +
learned position embeddings, pre-LN transformer blocks (LN -> causal multi-head attention ->
residual, LN -> MLP with tanh GELU -> residual), a final layer norm `ln_f`, and an LM head tied
to the token embedding `wte`.

Parameters arrive as the checkpoint's own tree (`params["h"][i]["attn"]["c_attn"]["w"]`), with
GPT-2's Conv1D layout `[in, out]`, so `x @ w + b` needs no transpose. Everything is float32.
No I/O and no RNG here: the forward takes ids and a cache and returns logits. The one global
setting is the number of worker threads of "panels" (`set_threads`), which never changes results.

Ways to multiply a block of M rows by a weight matrix (the "matmul strategies"; bench/verify_cost
measures each for M = 1..16):
  * "gemm", `linear(x, w, b)`: one GEMM. Fastest for a long prompt (prefill); NOT batch
    invariant (OpenBLAS picks a different kernel for each M, so a row's bits depend on M);
  * "rows", `linear_rows(x, w, b)`: one stacked `np.matmul` of `[M, 1, d_in]` by `w`, that is M
    vector-matrix products (BLAS GEMV) in one call, each exactly the call the one-token forward
    makes. Its rows are bit-identical to one-token forwards ("batch invariant"), which makes greedy
    speculative decoding token-identical to greedy decoding by construction;
  * "panels", `linear_panels(x, w, b)`: the same row products, done panel by panel over the
    columns of `w` (stacked `np.matmul` of `[1, M, 1, d_in]` by `[P, 1, d_in, width]`), so a
    160 KiB panel read from memory for the first row is still in L2 for the others; a large
    matrix's panels are shared out to `get_threads()` threads. Contiguous panels need the "panel
    layout" (`panel_layout(params)`: matrices stored column-major, same values and shapes), which
    `load_model` and `random_model` apply. Also batch invariant, but its bits differ from "rows"
    (each GEMV runs over a narrower matrix), so a model must keep one invariant strategy
    throughout (`Model.matmul`: a target decodes with "panels", a draft with "rows");
  * "panels-gemm": one GEMM per panel (stacked). Not batch invariant; measured for comparison.
`gpt2(..., invariant=True)` (the default) uses an invariant strategy (`default_matmul`: "panels"
on the panel layout, else "rows") and computes each query row's attention over exactly its key
prefix; `invariant=False` uses "gemm" and one masked attention over all rows.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GPT2Config:
    """Hyperparameters of a GPT-2 checkpoint (names as in GPT-2's hparams.json)."""

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
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"config: {name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"config: n_embd ({self.n_embd}) is not divisible by n_head ({self.n_head}); "
                "fix the checkpoint's config.json")
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
        """Forget every position from `length` on. Raises ValueError if `length` > current."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll the cache back to {length}: it holds {self.length} positions")
        self.length = length


# ---- the math, one concept per function (shapes: n = rows, d = n_embd) ----

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


def linear(x, w, b):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; one GEMM ("gemm")
    return x @ w + b


def linear_rows(x, w, b):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; row i == linear_rows(x[i:i+1])
    """n vector-matrix products (GEMV) in one stacked np.matmul call ("rows"; batch invariant)."""
    return np.matmul(x[:, None, :], w)[:, 0] + b  # [n, 1, d_in] @ [d_in, d_out] -> [n, 1, d_out]


PANEL_BYTES = 160 << 10  # the panel size of "panels": well inside a core's L2 cache (2 MiB here)
WHOLE_BYTES = 1 << 20  # a matrix this small is one panel: it stays in L2 between rows anyway
SPLIT_BYTES = 4 << 20  # "panels" splits the panels of a matrix this large over the worker threads


def panel_width(d_in, d_out, panel_bytes=PANEL_BYTES):
    """Columns per panel of a `[d_in, d_out]` float32 matrix ("panels").

    d_out (one panel) if the matrix has at most WHOLE_BYTES, else the largest multiple of 8 with
    `d_in * width * 4 <= panel_bytes` (at least 8). A function of the shape only, so one-token
    and M-token forwards use the same panels. The sizes come from bench/results/README.md
    (panel widths 8 to 1024 measured on GPT-2 shapes).
    """
    if d_in * d_out * 4 <= WHOLE_BYTES:
        return d_out
    return min(d_out, max(8, panel_bytes // (4 * d_in) // 8 * 8))


def panels(w, width):  # [d_in, d_out] -> [P, d_in, width], P = d_out // width; a view (no copy)
    """The first P full column panels of `w`; each is contiguous when `w` is column-major (see panel_layout)."""
    d_in, d_out = w.shape
    p = d_out // width
    return w[:, : p * width].reshape(d_in, p, width).transpose(1, 0, 2)


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_threads = {"n": None, "pool": None}


def set_threads(n=None):
    """Set how many threads "panels" uses for a large matrix (>= SPLIT_BYTES); returns the previous setting.

    n: a positive int, or None for the default: the environment variable NPSPEC_NUM_THREADS if
    set, else the CPUs this process may run on. The threads run NumPy's GEMV calls (numpy
    releases the GIL in them), each on its own share of the panels; every panel's product is the
    same call whatever the thread count, so the results are bit-identical for every `n`
    (tests/test_model.py). Raises ValueError for n < 1 or a bad NPSPEC_NUM_THREADS.
    """
    previous = _threads["n"]
    if n is None:
        env = os.environ.get("NPSPEC_NUM_THREADS")
        if env in (None, ""):
            n = _cpus()
        elif not env.strip().isdigit() or int(env) < 1:
            raise ValueError(f"NPSPEC_NUM_THREADS={env!r} is not a positive integer; set it to a "
                             "thread count such as 2, or unset it")
        else:
            n = int(env)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"the thread count must be a positive integer, got {n!r}")
    if _threads["pool"] is not None and n != _threads["n"]:
        _threads["pool"].shutdown()
        _threads["pool"] = None
    _threads["n"] = int(n)
    return previous


def get_threads():
    """The thread count "panels" uses for large matrices (see set_threads)."""
    if _threads["n"] is None:
        set_threads(None)
    return _threads["n"]


def _pool():
    if _threads["pool"] is None:
        _threads["pool"] = ThreadPoolExecutor(get_threads() - 1, thread_name_prefix="npspec")
    return _threads["pool"]


def linear_panels(x, w, b=None):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]; row i == linear_panels(x[i:i+1])
    """For each column panel of w, every row's GEMV, in stacked np.matmul calls ("panels"; batch invariant).

    The loop order is panel-major ([P, n, 1, width]), so a panel read from memory for the first
    row is served from cache to the others. A matrix of SPLIT_BYTES or more is cut into
    get_threads() runs of whole panels, one stacked call per thread; the panel products are the
    same calls either way, so the bits do not depend on the thread count. If d_out is not a
    multiple of the width (the head's 50257), one more panel covers the last `width` columns,
    overlapping the previous one, so every column comes from a GEMV of the same width.
    b=None: no bias.
    """
    n, (d_in, d_out) = x.shape[0], w.shape
    width = panel_width(d_in, d_out)
    ws = panels(w, width)[:, None]  # [P, 1, d_in, width]
    p, main = ws.shape[0], ws.shape[0] * width
    xs = x[None, :, None, :]  # [1, n, 1, d_in]
    y = np.empty((p, n, 1, width), dtype=np.float32)
    threads = min(get_threads(), p) if w.nbytes >= SPLIT_BYTES else 1
    cuts = [p * i // threads for i in range(threads + 1)]
    jobs = [_pool().submit(np.matmul, xs, ws[a:b], out=y[a:b]) for a, b in zip(cuts[1:-1], cuts[2:])]
    np.matmul(xs, ws[: cuts[1]], out=y[: cuts[1]])
    for job in jobs:
        job.result()
    out = np.empty((n, d_out), dtype=np.float32)
    out[:, :main] = y[:, :, 0].transpose(1, 0, 2).reshape(n, main)
    if main < d_out:  # the last panel, [d_out - width, d_out)
        out[:, main:] = np.matmul(x[:, None, :], w[:, d_out - width :])[:, 0, main - d_out :]
    return out if b is None else out + b


def linear_panels_gemm(x, w, b):  # [n, d_in], [d_in, d_out], [d_out] -> [n, d_out]
    """One GEMM per column panel, stacked ("panels-gemm"); NOT batch invariant (d_out a multiple of the width)."""
    n, (d_in, d_out) = x.shape[0], w.shape
    width = panel_width(d_in, d_out)
    if d_out % width:
        return linear(x, w, b)
    y = np.matmul(x[None], panels(w, width))  # [P, n, width]
    return y.transpose(1, 0, 2).reshape(n, d_out) + b


def panel_layout(params):
    """Store every block matrix column-major (F order), in place, so its column panels are contiguous.

    Same values and shapes (`w` stays `[d_in, d_out]`, so `x @ w` is unchanged); only the memory
    order changes, one matrix at a time (peak extra memory: one matrix). The head needs nothing:
    `wte.T` is already column-major. Returns `params`. With this layout the default invariant
    strategy is "panels" (see default_matmul).
    """
    for lin in block_linears(params):
        lin["w"] = np.asfortranarray(lin["w"])
    return params


def block_linears(params):
    """Every block's linear layers, `{"w", "b"}` dicts of the tree, in order: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj."""
    for h in params["h"]:
        yield from (h["attn"]["c_attn"], h["attn"]["c_proj"], h["mlp"]["c_fc"], h["mlp"]["c_proj"])


def default_matmul(params, invariant):
    """The strategy a forward uses when none is given.

    invariant=False: "gemm". invariant=True: "panels" when the matrices are in panel layout
    (column-major, see panel_layout; each panel is then one contiguous block), else "rows".
    A function of the parameters' memory layout only, so it never changes within a run.
    """
    if not invariant:
        return "gemm"
    w = params["h"][0]["mlp"]["c_fc"]["w"] if params["h"] else None
    return "panels" if w is not None and w.flags.f_contiguous and not w.flags.c_contiguous else "rows"


MATMULS = {"gemm": linear, "rows": linear_rows, "panels": linear_panels, "panels-gemm": linear_panels_gemm}
INVARIANT_MATMULS = ("rows", "panels")  # row i of the result never depends on the other rows


def attention_rows(q, k, v, n_past):  # [h, n, dh], [h, T, dh], [h, T, dh] -> [h, n, dh]
    """Causal attention, each query row over exactly its key prefix 0 .. n_past + i."""
    out = np.empty_like(q)
    scale = np.float32(1 / np.sqrt(q.shape[-1]))
    for i in range(q.shape[1]):
        t = n_past + i + 1
        scores = q[:, i : i + 1] @ k[:, :t].transpose(0, 2, 1) * scale  # [h, 1, t]
        out[:, i : i + 1] = softmax(scores) @ v[:, :t]  # [h, 1, dh]
    return out


def attention_masked(q, k, v, n_past):  # [h, n, dh], [h, T, dh], [h, T, dh] -> [h, n, dh]
    """Causal attention for all rows at once; every row keeps at least its own key."""
    n, t = q.shape[1], n_past + q.shape[1]
    scores = q @ k[:, :t].transpose(0, 2, 1) * np.float32(1 / np.sqrt(q.shape[-1]))  # [h, n, t]
    future = np.arange(t)[None, :] > (n_past + np.arange(n))[:, None]  # [n, t]; diagonal False
    scores = np.where(future, np.float32(-np.inf), scores)
    return softmax(scores) @ v[:, :t]


def lm_head(x, wte, matmul):  # [n, d], [n_vocab, d] -> [n, n_vocab]; the head is tied to wte
    if matmul == "gemm":
        return x @ wte.T
    if matmul == "panels":  # row panels of wte: each a contiguous [width, d] block
        return linear_panels(x, wte.T)
    return np.matmul(x[:, None, :], wte.T)[:, 0]  # "rows" (and "panels-gemm": the head stays GEMV)


def mha(x, c_attn, c_proj, cache, layer, n_head, mm, invariant):  # [n, d] -> [n, d]
    n, d = x.shape
    qkv = mm(x, **c_attn)  # [n, 3d]
    q, k, v = (a.reshape(n, n_head, d // n_head).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))
    n_past = cache.length
    cache.k[layer, :, n_past : n_past + n] = k  # [h, n, dh]
    cache.v[layer, :, n_past : n_past + n] = v
    attn = attention_rows if invariant else attention_masked
    heads = attn(q, cache.k[layer], cache.v[layer], n_past)  # [h, n, dh]
    return mm(heads.transpose(1, 0, 2).reshape(n, d), **c_proj)


def ffn(x, c_fc, c_proj, mm):  # [n, d] -> [n, d]
    return mm(gelu(mm(x, **c_fc)), **c_proj)


def block(x, p, cache, layer, config, mm, invariant):  # [n, d] -> [n, d]
    eps = config.layer_norm_epsilon
    x = x + mha(layer_norm(x, **p["ln_1"], eps=eps), **p["attn"], cache=cache, layer=layer,
                n_head=config.n_head, mm=mm, invariant=invariant)
    return x + ffn(layer_norm(x, **p["ln_2"], eps=eps), **p["mlp"], mm=mm)


def gpt2(ids, params, config, cache, invariant=True, matmul=None):  # [n_new] -> [n_new, n_vocab]
    """Feed `ids` (the positions after `cache.length`) and return their logits.

    ids: int array `[n_new]`, values in `[0, n_vocab)`. Returns float32 logits
    `[n_new, n_vocab]` for every new position, and advances `cache.length` by `n_new`.
    `invariant=True`: each row's logits are bit-identical to feeding the ids one at a time
    with the same `matmul` (used for decoding); `invariant=False`: GEMM and one masked
    attention over all rows (used for long prompts).
    matmul: a key of MATMULS (default: `default_matmul(params, invariant)`); with
    invariant=True it must be one of INVARIANT_MATMULS.
    Raises ContextOverflowError, before any work, if `cache.length + n_new > n_ctx`, and
    ValueError for ids out of range or an unknown or non-invariant `matmul`.
    """
    matmul = matmul or default_matmul(params, invariant)
    if matmul not in MATMULS:
        raise ValueError(f"unknown matmul strategy {matmul!r}; pick one of {', '.join(MATMULS)}")
    if invariant and matmul not in INVARIANT_MATMULS:
        raise ValueError(f"matmul {matmul!r} is not batch invariant; with invariant=True use one of "
                         f"{', '.join(INVARIANT_MATMULS)}")
    ids = np.asarray(ids)
    n_new, n_past = len(ids), cache.length
    if n_past + n_new > config.n_ctx:
        raise ContextOverflowError(
            f"{n_past} cached + {n_new} new positions exceed the context n_ctx={config.n_ctx}; "
            "shorten the prompt or max_new_tokens")
    if n_new == 0:
        return np.zeros((0, config.n_vocab), dtype=np.float32)
    if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= config.n_vocab:
        raise ValueError(f"ids must be integers in [0, {config.n_vocab})")
    mm = MATMULS[matmul]
    x = params["wte"][ids] + params["wpe"][n_past : n_past + n_new]  # [n_new, d]
    for layer, p in enumerate(params["h"]):
        x = block(x, p, cache, layer, config, mm, invariant)
    cache.length = n_past + n_new
    x = layer_norm(x, **params["ln_f"], eps=config.layer_norm_epsilon)
    return lm_head(x, params["wte"], matmul)  # [n_new, n_vocab]
