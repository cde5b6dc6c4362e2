"""Token-tree drafters: a draft model proposing a static tree (TreeDrafter: a branching per depth) or a dynamic one
grown best first (DynamicTreeDrafter, EAGLE-2's idea), verified in one forward with tree attention and accepted by
the tree rule (npspec.decode.rules.trees; the same guarantees as a chain, per node). Imports numpy, npspec.decode.sampling, npspec.decode.rules.trees
and npspec.decode.drafters.model.
"""

import numpy as np

from ..sampling import check_count, sample, warp
from ..rules.trees import MAX_TREE_NODES, branching_tree, children, depths, grow_tree
from ..types import Proposal
from .model import DraftModelCache


class TreeDrafter(DraftModelCache):
    """A draft model proposing a token tree with a static branching per depth (npspec.decode.rules.trees).

    branching: children per node at each depth, e.g. (3, 2, 1). kind: "sampled" (each node's
    children drawn i.i.d. from the draft's warped row at the node, q = that row) or "top-k" (the
    row's most likely ids, ties to the lower id, each with a one-hot q). At temperature 0 both
    take the top-k ids of the logits (q is None). One draft forward per node that has children,
    depth first, rolling the cache back after each subtree. Raises ValueError for a bad
    branching or kind.
    """

    tree = True

    def __init__(self, model, branching, kind="sampled"):
        if kind not in ("sampled", "top-k"):
            raise ValueError(f"a tree's kind must be sampled or top-k, got {kind!r}")
        super().__init__(model)
        self.kind, self.branching = kind, tuple(branching)
        self.parents = branching_tree(self.branching)
        self.depth_of = depths(self.parents)

    def __repr__(self):
        return f"{type(self).__name__}({self.source!r}, branching={list(self.branching)}, kind={self.kind!r})"

    @property
    def siblings(self):
        """How a node's sampled children are drawn: "iid" (the sampled kind, `draw`) or "deterministic" (top-k)."""
        return "deterministic" if self.kind == "top-k" else "iid"

    def draw(self, row, u):  # [n_vocab] float64, [k] uniforms -> [k] ids
        """A node's k sampled children: independent draws of its warped row, child j with u[j] (npspec.decode.sampling.sample).
        The one step a drafter drawing them otherwise overrides (npspec.decode.drafters.distinct)."""
        return [sample(row, v) for v in u]

    @property
    def depth(self):
        return len(self.branching)

    def tree_size(self, depth):  # -> int
        """Nodes of the tree cut at `depth` (the tree's first levels)."""
        return sum(d <= depth for d in self.depth_of)

    def propose(self, seq, depth, u, sampling):  # -> Proposal of N = tree_size(depth) nodes
        """The tree cut at `depth` after seq: ids, parents (-1: a child of seq's last id) and the rows q
        (None, deterministic, for the top-k kind and at temperature 0).

        u: `[N]` uniforms, u[i] draws node i (sampled kind). Nodes come in npspec.decode.rules.trees.branching_tree's
        order (depth by depth).
        """
        self.ready(seq)
        parents = self.parents[:self.tree_size(depth)]
        kids = children(parents)
        greedy_round = sampling.greedy
        ids, q = [0] * len(parents), [None] * len(parents)

        def expand(node, logits):
            if not kids[node]:
                return
            row = None if greedy_round else sampling.warp(logits)
            ranked = np.argsort(-(logits if greedy_round else row), kind="stable")
            if greedy_round or self.kind == "top-k":
                for j, c in enumerate(kids[node]):
                    ids[c] = int(ranked[j])
            else:
                for c, x in zip(kids[node], self.draw(row, u[kids[node]])):
                    ids[c], q[c] = x, row
            for c in kids[node]:
                if kids[c]:
                    length = self.cache.length
                    expand(c, self.step([ids[c]]))
                    self.rollback(length)

        expand(-1, self.step(seq[self.cache.length:]))
        deterministic = greedy_round or self.kind == "top-k"
        return Proposal(ids, list(parents), None if deterministic else np.array(q).reshape(len(parents), self.n_vocab))


class DynamicTreeDrafter(DraftModelCache):
    """A draft model proposing a dynamic tree of `budget` nodes, grown best first by cumulative draft
    probability (EAGLE-2's idea; npspec.decode.rules.trees.grow_tree): each node offers its `max_children` most likely ids.

    Children are deterministic, so each is tested with a one-hot q. Ranking uses the draft's warped
    row (its softmax at temperature 1 when temperature is 0). One draft forward per node that may
    get children, feeding its path after the prefix. Raises ValueError for budget or max_children < 1,
    or a budget over MAX_TREE_NODES (npspec.decode.rules.trees).
    """

    tree = True
    siblings = "deterministic"

    def __init__(self, model, budget, max_children=4):
        check_count(budget, "a dynamic tree's budget")
        check_count(max_children, "a dynamic tree's max_children")
        if budget > MAX_TREE_NODES:
            raise ValueError(f"a dynamic tree's budget (--tree-budget) is at most {MAX_TREE_NODES} nodes, the largest "
                             f"tree npspec drafts, got {budget}; give a smaller budget such as 16")
        super().__init__(model)
        self.budget, self.max_children = int(budget), int(max_children)
        self.depth = self.budget  # at most a chain of budget nodes

    def __repr__(self):
        return f"DynamicTreeDrafter({self.source!r}, budget={self.budget}, max_children={self.max_children})"

    def tree_size(self, depth):  # -> int
        """The nodes grown with depth at most `depth`: the budget, or all max_children-ary nodes that fit."""
        k = min(self.max_children, self.n_vocab)
        return min(self.budget, sum(k ** d for d in range(1, depth + 1)))

    def propose(self, seq, depth, u, sampling):  # -> Proposal of tree_size(depth) nodes, deterministic (q None)
        """The tree (ids, parents) grown to tree_size(depth) nodes after seq; u is not used."""
        self.ready(seq)
        root = self.step(seq[self.cache.length:])
        base = self.cache.length

        def row_at(path):
            if path:
                self.rollback(base)
                logits = self.step(list(path))
            else:
                logits = root
            return warp(logits) if sampling.greedy else sampling.warp(logits)

        ids, parents = grow_tree(row_at, self.tree_size(depth), self.max_children, depth)
        self.rollback(base)
        return Proposal(ids, parents)
