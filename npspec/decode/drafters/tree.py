"""Token-tree drafters: a static tree (TreeDrafter, a branching per depth) and a dynamic one grown best first
(DynamicTreeDrafter, EAGLE-2's idea), verified with tree attention and a Rule's tree form (npspec.decode.rules.trees).
Imports numpy and npspec.decode's sampling, rules.trees, types and drafters.model."""

import numpy as np

from ..sampling import check_count, sample, warp
from ..rules.trees import MAX_TREE_NODES, branching_tree, children, depths, grow_tree
from ..types import Proposal
from .model import DraftModelCache


class TreeDrafter(DraftModelCache):
    """A draft model proposing a static tree, `branching` children per node at each depth (e.g. (3, 2, 1)): kind
    "sampled" (i.i.d. from the warped row, q = that row) or "top-k" (the likeliest ids, ties to the lower id, q
    one-hot); at temperature 0 the top ids (q None). One forward per parent node. ValueError: bad branching/kind."""

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
        return "deterministic" if self.kind == "top-k" else "iid"

    def draw(self, row, u):  # [n_vocab] float64, [k] uniforms -> [k] ids
        """A node's k sampled children: independent draws of its row, child j with u[j] (distinct.py overrides it)."""
        return [sample(row, v) for v in u]

    @property
    def depth(self):
        return len(self.branching)

    def tree_size(self, depth):  # -> int
        return sum(d <= depth for d in self.depth_of)

    def propose(self, seq, depth, u, sampling):  # -> Proposal of N = tree_size(depth) nodes
        """The tree cut at `depth` after seq (branching_tree's order); u[i] draws node i."""
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
    """A tree of `budget` nodes grown best first by cumulative draft probability (rules.trees.grow_tree), each node
    offering its max_children likeliest ids (one-hot q), ranked on the warped row (the softmax at temperature 0).
    ValueError for budget or max_children < 1, or a budget over MAX_TREE_NODES."""

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
