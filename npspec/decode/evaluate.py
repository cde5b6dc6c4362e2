"""Measurements on a model pair: validation loss, acceptance, the speedup model (the shipped pair's model card and
the regression tests call the same functions). Imports numpy and npspec.decode."""

import numpy as np

from .sampling import warp
from . import Stats, speculative_generate


def split_corpus(text):
    """npspec's fixed 90/10 train/validation split by character position: (train, validation)."""
    n = int(0.9 * len(text))
    return text[:n], text[n:]


def validation_loss(model, ids, max_windows=None):
    """(mean next-token cross-entropy in nats/token, tokens predicted) over windows of n_ctx + 1 of ids `[n]`, each
    from a fresh cache (a shorter tail too); max_windows: only the first ones. Perplexity is exp(loss)."""
    ids = np.asarray(ids)
    n_ctx = model.config.n_ctx
    total, count = 0.0, 0
    starts = range(0, len(ids) - 1, n_ctx)
    if max_windows is not None:
        starts = starts[:max_windows]
    for s in starts:
        window = ids[s : s + n_ctx + 1]
        logits = model.prefill(window[:-1], model.new_cache()).astype(np.float64)
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        total += float((logz - logits[np.arange(len(window) - 1), window[1:]]).sum())
        count += len(window) - 1
    return total / count, count


def acceptance(target, draft, prompts, gamma=4, max_new_tokens=64, temperature=0.0, top_k=0, top_p=1.0, seed=0):
    """The pooled Stats (stop_reason "mixed") of speculative decoding on the prompts, one Generator seeded `seed`."""
    rng = np.random.default_rng(seed)
    total = Stats.pooled(speculative_generate(target, draft, prompt, max_new_tokens, gamma=gamma, temperature=temperature,
                                              top_k=top_k, top_p=top_p, rng=rng).stats for prompt in prompts)
    total.stop_reason = "mixed"
    return total


def expected_acceptance(target, draft, ids, temperature=1.0, max_windows=1):
    """Mean beta = sum_x min(p(x), q(x)) over the positions of ids `[n]` (Leviathan et al. 2023, Def. 3.1, Thm. 3.5)."""
    betas = []
    n_ctx = min(target.config.n_ctx, draft.config.n_ctx)
    for s in range(0, len(ids) - 1, n_ctx)[:max_windows]:
        window = np.asarray(ids[s : s + n_ctx])
        p = warp(target.prefill(window, target.new_cache()), temperature)
        q = warp(draft.prefill(window, draft.new_cache()), temperature)
        betas.append(np.minimum(p, q).sum(-1))
    return float(np.concatenate(betas).mean())


def fixed_prompts(ids, n=8, length=32):
    step = (len(ids) - length) // n
    return [list(map(int, ids[i * step : i * step + length])) for i in range(n)]


def expected_tokens_per_round(alpha, gamma):
    """(1 - alpha^(gamma+1)) / (1 - alpha), gamma + 1 at alpha = 1 (Leviathan et al. 2023, eq. 1;
    notes/derivation.md, claim 4); floats or fractions.Fraction."""
    return gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha, gamma, c, v):
    """E[tokens/round] / (gamma c + v) (notes/derivation.md, claim 5; Leviathan et al. 2023, Theorem 3.8 at v = 1):
    c a draft forward's time and v the verify's, over a target one-token forward's."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + v)
