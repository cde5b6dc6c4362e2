"""Simulated acceptance: time speculative decoding where a real draft's acceptance means nothing (random weights).

A SIMULATION, labelled as such wherever it is used (`--simulate-acceptance A`, bench.speedup's
"controlled" rows): random weights make a draft useless (acceptance near 0), so the speed of
the full-size GPT-2 shapes is measured with a draft whose proposals are steered.
`ControlledDraft` runs the real draft forward (so every round pays the draft's true cost), then
replaces the logits it returns so the draft's greedy proposal for position t is the target's
own greedy token `greedy[t]` with probability `a`, and a wrong token otherwise. `greedy` is the
sequence a plain greedy run of the target produced first (prompt + continuation). The
speculative loop itself is unchanged, and so is its output: greedy speculative decoding emits
exactly the target's greedy tokens whatever the draft proposes.

Greedy decoding only (temperature 0): the replaced logits are one-hot-like (0 everywhere, 1 on
the chosen token), which the loop's argmax turns into exactly that proposal. Each draft token
that the target tests is then accepted with probability exactly `a`, independently, so the
measured alpha estimates `a` (tested in tests/test_bench.py). Imports numpy only.
"""

import numpy as np


class ControlledDraft:
    """A draft `Model` look-alike: real forward, steered proposals (see the module docstring).

    draft: a loaded `Model` (its forward is run for its cost). greedy: `[n]` ids, the prompt
    followed by the target's greedy continuation. a: the acceptance probability in [0, 1].
    rng: an `np.random.Generator` for the accept/wrong decisions.
    Raises ValueError for `a` outside [0, 1] or a vocabulary mismatch with `greedy`.
    """

    def __init__(self, draft, greedy, a, rng):
        if not 0 <= a <= 1:
            raise ValueError(f"the controlled acceptance a must be in [0, 1], got {a}")
        self.draft, self.a, self.rng = draft, float(a), rng
        self.greedy = np.asarray(greedy, dtype=np.int64)
        self.config = draft.config
        if self.greedy.size and self.greedy.max() >= self.config.n_vocab:
            raise ValueError("the greedy sequence has ids outside the draft's vocabulary")
        self.tokenizer, self.source = draft.tokenizer, f"controlled({draft.source}, a={self.a})"
        self.proposals = 0  # rows whose proposal was steered
        self.correct = 0  # of which were set to the greedy token

    def new_cache(self):
        return self.draft.new_cache()

    def prefill(self, ids, cache):  # [n_new] -> [n_new, n_vocab] float32
        """The draft's own prefill, unsteered: the loop only fills the cache with it, never proposes from it."""
        return self.draft.prefill(ids, cache)

    def forward(self, ids, cache):  # [n_new] -> [n_new, n_vocab] float32
        """The draft's real forward over `ids`, with each row's logits replaced.

        Row j is the prediction for position `n_past + j + 1`; it becomes 1.0 on the chosen token
        and 0.0 elsewhere.
        """
        n_past = cache.length
        logits = self.draft.forward(ids, cache)
        n_new, n_vocab = logits.shape
        steered = np.zeros_like(logits)
        for j in range(n_new):
            t = n_past + j + 1
            right = int(self.greedy[t]) if t < len(self.greedy) else 0
            if self.rng.random() < self.a:
                token = right
                self.correct += 1
            else:  # uniform over the other n_vocab - 1 tokens
                token = (right + 1 + int(self.rng.integers(n_vocab - 1))) % n_vocab
            steered[j, token] = 1.0
            self.proposals += 1
        return steered
