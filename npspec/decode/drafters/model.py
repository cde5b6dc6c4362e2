"""The draft-model drafter: a smaller model proposes a chain, one forward per token, optionally with confidence
stopping (llama.cpp's `--draft-p-min`). DraftModelCache is what every drafter built on a draft model shares (the
tree drafters too). Imports numpy, npspec.decode.sampling and npspec.decode.types.
"""

import numpy as np

from ..sampling import greedy, sample, warp
from ..types import BaseDrafter, Forwarder, Proposal


class DraftModelCache(BaseDrafter):
    """What every drafter built on a draft model shares: the model's attributes, its KV cache, start, rollback.

    model: a Forwarder (npspec.model.model.Model, or anything with config, tokenizer, source, new_cache, forward, prefill).
    Raises TypeError for anything else.
    """

    def __init__(self, model):
        if not isinstance(model, Forwarder):
            raise TypeError(f"a draft model must be an npspec Model (npspec.load(spec, role='draft')), got "
                            f"{type(model).__name__} {model!r:.60}; for prompt lookup use "
                            "NgramDrafter(n_vocab, eos_token_id)")
        self.model = model
        self.n_vocab, self.n_ctx = model.config.n_vocab, model.config.n_ctx
        self.tokenizer, self.source = model.tokenizer, model.source
        self.forwards, self.cache = 0, None

    def start(self, prompt_ids):  # [n_prompt] ids
        """A fresh cache holding every prompt id but the last (as the target's)."""
        self.cache = self.model.new_cache()
        if len(prompt_ids) > 1:
            self.model.prefill(np.asarray(prompt_ids[:-1]), self.cache)
            self.forwards += 1

    def step(self, ids):  # [n] ids -> [n_vocab] float32
        """One draft forward: feed `ids` after the cache and return the logits after the last of them."""
        self.forwards += 1
        return self.model.forward(np.asarray(ids), self.cache)[-1]

    def ready(self, seq):
        """Raise ValueError unless the cache holds a prefix of seq without its last id (the round rolls it back)."""
        if self.cache is None or self.cache.length > len(seq) - 1:
            held = None if self.cache is None else self.cache.length
            raise ValueError(f"the draft's cache holds {held} positions for a sequence of {len(seq)} ids; start the "
                             "drafter and roll it back to len(seq) - 1 before proposing")

    def rollback(self, length):
        """Forget cached positions from `length` on (O(1)); nothing past the cache's end."""
        if self.cache is not None:
            self.cache.rollback(min(length, self.cache.length))


class ModelDrafter(DraftModelCache):
    """A draft model as a drafter: d_i ~ q_i = warp(the model's logits), one forward per token.

    model: an npspec Model (or anything with config, tokenizer, source, new_cache, forward, prefill).
    p_min: confidence stopping (llama.cpp `--draft-p-min`): after proposing d_i, stop if the
    largest probability of the row it was drawn from is below p_min (d_i itself is still
    proposed). The row is q_i after warping; at temperature 0, where that row is one-hot, the
    model's softmax at temperature 1. 0 (default) = never stop early. Raises ValueError for
    p_min outside [0, 1].
    """

    def __init__(self, model, p_min=0.0):
        check_p_min(p_min)
        super().__init__(model)
        self.p_min = float(p_min)

    def __repr__(self):
        return f"ModelDrafter({self.source!r}, p_min={self.p_min})"

    def propose(self, seq, gamma, u, sampling):  # list[int], int, [>= gamma], SamplingParams -> Proposal
        """Draw up to gamma tokens after seq, one forward each (npspec.decode.drafters states the guarantees).

        The cache holds a prefix of seq (the round rolled it back to what the last round kept), so
        nothing is copied. At temperature 0 each d_i is the argmax and the proposal is deterministic (q None).
        """
        self.ready(seq)
        ctx, d, q = list(seq), [], []
        for i in range(gamma):
            logits = self.step(ctx[self.cache.length:])
            if sampling.greedy:
                token, top = int(greedy(logits)), (warp(logits).max() if self.p_min else 1.0)
            else:
                row = sampling.warp(logits)
                token, top = sample(row, u[i]), row.max()
                q.append(row)
            d.append(token)
            ctx.append(token)
            if top < self.p_min:  # confidence stopping: this token is proposed, no more
                break
        return Proposal.chain(d, None if sampling.greedy else np.array(q).reshape(len(d), self.n_vocab))


def check_p_min(p_min):
    """Raise ValueError unless 0 <= p_min <= 1."""
    if isinstance(p_min, bool) or not isinstance(p_min, (int, float, np.floating, np.integer)) or not 0 <= p_min <= 1:
        raise ValueError(f"p_min (--draft-p-min) must be a probability in [0, 1], got {p_min!r}; 0 turns it off")
