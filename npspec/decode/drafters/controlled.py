"""Controlled acceptance, a SIMULATION labelled as such wherever used (--simulate-acceptance A, the bench's
"controlled" rows), to time drafts whose acceptance means nothing (random weights): the real draft work runs, then
each proposal is the target's greedy token greedy[t] with probability a, else a wrong one. Greedy only; the output
is still the target's greedy ids. Imports numpy and npspec.decode's modules."""

import numpy as np

from ..rules.trees import depths
from ..types import Proposal
from .ngram import NgramDrafter
from .tree import TreeDrafter


class ControlledDraft:
    """A draft Model look-alike (drafted by ModelDrafter): its real forward, each row's logits replaced by one-hot on
    the steered token. draft: a Model; greedy `[n]`: prompt + the target's greedy continuation; a in [0, 1];
    rng: a Generator. ValueError for a outside [0, 1] or ids outside the draft's vocabulary."""

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
        return self.draft.prefill(ids, cache)

    def forward(self, ids, cache):  # [n_new] -> [n_new, n_vocab] float32
        """The draft's real forward; row j (position n_past + j + 1) becomes 1.0 on the chosen token, 0.0 elsewhere."""
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
    """n-gram lookup with controlled acceptance: the real lookup runs, then g steered tokens are proposed (no q).
    n_vocab, eos_token_id: the target's; greedy, a, rng as ControlledDraft's. ValueError for a outside [0, 1]."""

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
    """A token tree with controlled acceptance: TreeDrafter's top-k forwards run, then each node is the target's
    greedy token at its position with probability a, else a wrong one (no q). ValueError for a outside [0, 1]."""

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
