"""Controlled acceptance: drafters whose proposals are steered, to time speculative decoding where a real draft's
acceptance means nothing (random weights). A SIMULATION, labelled as such wherever it is used
(`--simulate-acceptance A`, npspec.cli.harness.simulated; bench.speedup's, bench.drafters' and bench.trees' "controlled"
rows).

`ControlledDraft` is a draft MODEL look-alike (a Forwarder, drafted by ModelDrafter): it runs the real draft
forward (so every round pays the draft's true cost), then replaces the logits it returns so the draft's greedy
proposal for position t is the target's own greedy token `greedy[t]` with probability `a`, and a wrong token
otherwise. `greedy` is the sequence a plain greedy run of the target produced first (prompt + continuation).
`ControlledLookup` does the same for n-gram lookup (the real lookup runs, its proposal is replaced) and
`ControlledTree` for token trees (the draft's forwards run, each node is the target's greedy token with
probability a). The speculative loop itself is unchanged, and so is its output: greedy speculative decoding
emits exactly the target's greedy tokens whatever the draft proposes.

Greedy decoding only (temperature 0): ControlledDraft's replaced logits are one-hot-like (0 everywhere, 1 on
the chosen token), which the loop's argmax turns into exactly that proposal. Each draft token that the target
tests is then accepted with probability exactly `a`, independently, so the measured alpha estimates `a`
(tested in tests/test_bench.py). Imports numpy, npspec.decode.rules.trees and npspec.decode's drafters.
"""

import numpy as np

from ..rules.trees import depths
from ..types import Proposal
from .ngram import NgramDrafter
from .tree import TreeDrafter


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


class ControlledLookup(NgramDrafter):
    """n-gram lookup with controlled acceptance: the real lookup runs (its cost is paid), then each round proposes
    g tokens steered as ControlledDraft's: the target's greedy token `greedy[t]` with probability a, a wrong one
    otherwise. Greedy decoding only (it returns no q rows). A Drafter, not a model.

    n_vocab, eos_token_id: the target's. greedy: `[n]` ids, prompt + the target's greedy continuation.
    a: the acceptance probability in [0, 1]. rng: an `np.random.Generator`. Raises ValueError for `a`
    outside [0, 1].
    """

    def __init__(self, n_vocab, eos_token_id, greedy, a, rng):
        if not 0 <= a <= 1:
            raise ValueError(f"the controlled acceptance a must be in [0, 1], got {a}")
        super().__init__(n_vocab, eos_token_id)
        self.greedy, self.a, self.rng = np.asarray(greedy, dtype=np.int64), float(a), rng
        self.source = f"controlled(ngram, a={self.a})"

    def propose(self, seq, gamma, u, sampling):  # -> Proposal of gamma deterministic ids
        self.lookup(seq, gamma)  # for its cost only
        d = []
        for t in range(len(seq), len(seq) + gamma):
            right = int(self.greedy[t]) if t < len(self.greedy) else 0
            wrong = (right + 1 + int(self.rng.integers(self.n_vocab - 1))) % self.n_vocab
            d.append(right if self.rng.random() < self.a else wrong)
        return Proposal.chain(d)


class ControlledTree(TreeDrafter):
    """A token tree with controlled acceptance: the draft's real forwards run (TreeDrafter, top-k kind, for their
    cost), then each node's id is replaced by the target's greedy token at its position `greedy[t]` with
    probability a, independently, or a wrong one. Greedy decoding only (no q rows).

    draft: a loaded Model; branching: children per depth; greedy: `[n]` prompt + the target's greedy
    continuation; a in [0, 1]; rng: an `np.random.Generator`. Raises ValueError for a outside [0, 1].
    """

    def __init__(self, draft, branching, greedy, a, rng):
        if not 0 <= a <= 1:
            raise ValueError(f"the controlled acceptance a must be in [0, 1], got {a}")
        super().__init__(draft, branching, "top-k")
        self.greedy, self.a, self.rng = np.asarray(greedy, dtype=np.int64), float(a), rng
        self.source = f"controlled(tree {list(branching)}, a={self.a})"

    def propose(self, seq, depth, u, sampling):  # -> Proposal of N deterministic nodes
        proposal = super().propose(seq, depth, u, sampling)
        ids, parents = proposal.ids, proposal.parents
        for i, d in enumerate(depths(parents)):
            t = len(seq) + d - 1
            right = int(self.greedy[t]) if t < len(self.greedy) else 0
            wrong = (right + 1 + int(self.rng.integers(self.n_vocab - 1))) % self.n_vocab
            ids[i] = right if self.rng.random() < self.a else wrong
        return Proposal(ids, parents)
