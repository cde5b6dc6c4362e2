"""The draft-model drafter (ModelDrafter: a chain, one forward per token, optionally with confidence stopping) and
DraftModelCache, what every drafter on a draft model shares. Imports numpy and npspec.decode's sampling and types."""

import numpy as np

from ..sampling import greedy, sample, warp
from ..types import BaseDrafter, Forwarder, Proposal


class DraftModelCache(BaseDrafter):
    """A draft model's attributes, its KV cache, start and rollback. model: a Forwarder; TypeError for anything else."""

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
        self.cache = self.model.new_cache()
        if len(prompt_ids) > 1:
            self.model.prefill(np.asarray(prompt_ids[:-1]), self.cache)
            self.forwards += 1

    def step(self, ids):  # [n] ids -> [n_vocab] float32
        """One draft forward: `ids` after the cache; the logits after the last of them."""
        self.forwards += 1
        return self.model.forward(np.asarray(ids), self.cache)[-1]

    def ready(self, seq):
        """ValueError unless the cache holds a prefix of seq without its last id (the round rolls it back)."""
        if self.cache is None or self.cache.length > len(seq) - 1:
            held = None if self.cache is None else self.cache.length
            raise ValueError(f"the draft's cache holds {held} positions for a sequence of {len(seq)} ids; start the "
                             "drafter and roll it back to len(seq) - 1 before proposing")

    def rollback(self, length):
        if self.cache is not None:
            self.cache.rollback(min(length, self.cache.length))


class ModelDrafter(DraftModelCache):
    """A draft model as a drafter: d_i ~ q_i = warp(its logits), one forward per token. p_min: confidence stopping
    (llama.cpp's --draft-p-min): stop after d_i if its row's largest probability is below p_min (at temperature 0,
    the softmax at temperature 1); 0 = off. ValueError for p_min outside [0, 1]."""

    def __init__(self, model, p_min=0.0):
        check_p_min(p_min)
        super().__init__(model)
        self.p_min = float(p_min)

    def __repr__(self):
        return f"ModelDrafter({self.source!r}, p_min={self.p_min})"

    def propose(self, seq, gamma, u, sampling):  # list[int], int, [>= gamma], SamplingParams -> Proposal
        """Up to gamma tokens after seq, one forward each, from the cache the round rolled back (nothing copied); at
        temperature 0 the argmax, q None."""
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
    """ValueError unless 0 <= p_min <= 1."""
    if isinstance(p_min, bool) or not isinstance(p_min, (int, float, np.floating, np.integer)) or not 0 <= p_min <= 1:
        raise ValueError(f"p_min (--draft-p-min) must be a probability in [0, 1], got {p_min!r}; 0 turns it off")
