"""Logits warping (transformers' order: temperature, top-k, top-p; temperature 0 is one-hot argmax rows, ties to the
lowest id) and sampling, in float64 for the ratio p/q and the residual. A draw is an inverse CDF of ONE uniform u in
[0, 1), so every draw consumes a known amount of randomness. The checks of their arguments. Imports numpy only."""

import numpy as np


def check_integer(value, name, minimum, hint=""):
    """TypeError unless `value` is a Python or NumPy integer (not a bool), ValueError unless >= minimum; the message
    reads "<name> must be an integer >= <minimum><hint>, got ..."."""
    rule = f"{name} must be an integer >= {minimum}{hint}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{rule}, got {value!r} (a {type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{rule}, got {value}")


def check_count(value, name):
    """ValueError unless `value` is a Python or NumPy integer >= 1 (not a bool): "<name> must be an integer >= 1"."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_number(value, name, rule):
    """TypeError unless `value` is a Python or NumPy real number (not a bool); the range is the caller's."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number {rule}, got {value!r} (a {type(value).__name__})")


def check_warp_args(temperature, top_k, top_p):
    check_number(temperature, "temperature", "(finite, >= 0; 0 = greedy)")
    if not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    check_integer(top_k, "top_k", 0, " (0 = off)")
    check_number(top_p, "top_p", "in (0, 1]")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}")


def warp(logits, temperature=1.0, top_k=0, top_p=1.0):  # [..., n_vocab] float32 -> [..., n_vocab] float64
    """The rows a token is sampled from, float64, summing to 1, zeros where removed. temperature 0: one-hot argmax
    (lowest id on ties); top_k: the k largest logits, ties at the k-th kept (0 = off); top_p: the smallest most likely
    set reaching top_p, the top token kept (transformers' TopPLogitsWarper; 1 = off). ValueError if a row holds NaN
    or +inf or is entirely -inf."""
    x = np.asarray(logits, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)  # NaN propagates into the max
    check_row_max(top)
    if temperature == 0:
        probs = np.zeros_like(x)
        np.put_along_axis(probs, np.argmax(x, axis=-1)[..., None], 1.0, axis=-1)
        return probs
    with np.errstate(over="ignore"):  # shift first: a tiny temperature (1e-320) overflows to -inf, never inf - inf
        x = (x - top) / temperature
    if top_k and top_k < x.shape[-1]:
        kth = np.partition(x, -top_k, axis=-1)[..., -top_k, None]
        x = np.where(x < kth, -np.inf, x)
    probs = np.exp(x)  # the largest logit is 0 here, so every row keeps mass >= 1 before normalising
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        probs = np.where(top_p_tail(probs, top_p), 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def top_p_tail(probs, top_p):  # [..., n_vocab] float64 -> [..., n_vocab] bool
    """The tokens top-p removes: in ascending probability (ties: lower id first), the longest run whose cumulative sum
    stays <= 1 - top_p, never the most likely token. Sorts values only: every token below the largest removed value,
    plus the lowest ids tied with it, exactly a stable argsort's set."""
    ascending = np.sort(probs, axis=-1)
    within = ascending.cumsum(axis=-1) <= 1 - top_p  # a prefix: the sums never decrease
    k = np.minimum(within.sum(axis=-1, keepdims=True), probs.shape[-1] - 1)  # [..., 1] tokens removed
    cut = np.take_along_axis(ascending, np.maximum(k - 1, 0), axis=-1)  # k = 0: the minimum, nothing below it
    below = probs < cut
    tied = probs == cut
    n_tied_removed = k - below.sum(axis=-1, keepdims=True)  # 0 when k = 0
    return below | (tied & (tied.cumsum(axis=-1) <= n_tied_removed))


def check_row_max(top):  # [...] the maximum logit of each row
    if not np.isfinite(top).all():
        raise ValueError("logits hold NaN or +inf, or a row is entirely -inf: nothing to sample from; "
                         "check the model's output")


def greedy(logits):  # [..., n_vocab] float32 -> [...] int64
    """The argmax id (lowest on ties): sample(warp(logits, temperature=0), u) for every u, without the one-hot row.
    ValueError as warp."""
    check_row_max(logits.max(axis=-1))  # NaN propagates into the max
    return logits.argmax(axis=-1)  # ndarray methods: right after a forward, each Python-level NumPy call costs ~5 us


def sample(probs, u):  # [n_vocab] float64, float in [0, 1) -> int
    """The first id with cumsum(probs) > u * sum(probs), never one of probability 0. ValueError unless probs has a
    positive finite mass and 0 <= u < 1."""
    if not 0 <= u < 1:
        raise ValueError(f"u must be a uniform in [0, 1), got {u}")
    cdf = probs.cumsum()
    total = cdf[-1]
    if not (np.isfinite(total) and total > 0):
        raise ValueError("cannot sample: the probabilities have no positive finite mass")
    return int(cdf.searchsorted(u * total, side="right"))


def residual(p, q):  # [n_vocab], [n_vocab] float64 -> [n_vocab] float64
    """norm(max(0, p - q)), where to sample after a rejection (Leviathan et al. 2023, Algorithm 1); p itself if that
    has no positive mass. ValueError if p or q holds NaN or an infinity."""
    r = np.maximum(p - q, 0.0)
    mass = r.sum()
    if not np.isfinite(mass) or not np.isfinite(p.sum() + q.sum()):
        raise ValueError("cannot take the residual: p or q holds NaN or an infinity; check the model's output")
    if not mass > 0:
        return p
    return r / mass
