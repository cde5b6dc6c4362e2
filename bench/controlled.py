"""Controlled acceptance: time speculative decoding on random weights at a chosen acceptance rate.

Random weights make the draft's acceptance meaningless (near 0), so the full-size GPT-2 shapes
are timed with a draft whose proposals are steered: `ControlledDraft` (npspec.simulate, where
`--simulate-acceptance` uses it too) runs the real draft forward, then makes each proposal the
target's own greedy token with probability `a`. `ControlledLookup` does the same
for n-gram lookup: the real lookup runs, its proposal is replaced; `ControlledTree` for token
trees: the draft's forwards run, each node is the target's greedy token with probability a.
"""

import numpy as np

from npspec.drafters import NgramDrafter, TreeDrafter
from npspec.simulate import ControlledDraft
from npspec.trees import depths

__all__ = ["ControlledDraft", "ControlledLookup", "ControlledTree"]


class ControlledLookup(NgramDrafter):
    """n-gram lookup with controlled acceptance: the real lookup runs (its cost is paid), then each round proposes
    g tokens steered as ControlledDraft's: the target's greedy token `greedy[t]` with probability a, a wrong one
    otherwise. Greedy decoding only (it returns no q rows). A drafter (npspec.drafters), not a model.

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

    def propose(self, seq, gamma, u, warp_args):  # -> (list[int] [gamma], None)
        self.lookup(seq, gamma)  # for its cost only
        d = []
        for t in range(len(seq), len(seq) + gamma):
            right = int(self.greedy[t]) if t < len(self.greedy) else 0
            wrong = (right + 1 + int(self.rng.integers(self.n_vocab - 1))) % self.n_vocab
            d.append(right if self.rng.random() < self.a else wrong)
        return d, None


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

    def propose_tree(self, seq, depth, u, warp_args):  # -> (list[int] [N], list[int] [N], None)
        ids, parents, _ = super().propose_tree(seq, depth, u, warp_args)
        for i, d in enumerate(depths(parents)):
            t = len(seq) + d - 1
            right = int(self.greedy[t]) if t < len(self.greedy) else 0
            wrong = (right + 1 + int(self.rng.integers(self.n_vocab - 1))) % self.n_vocab
            ids[i] = right if self.rng.random() < self.a else wrong
        return ids, parents, None
