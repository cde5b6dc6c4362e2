"""Token trees: several candidates per position, accepted by multi-candidate speculative sampling.

NOTE: letters as in npspec.decode.round (Leviathan's): `p` the target, `q` the draft.

A tree of N draft nodes grows after the ids so far. Node i has a token `ids[i]`, a parent
`parents[i]` (-1: a child of the last id; parents come before their children) and the row
`q[i]` it was drawn from: the draft's row at its parent's context for a sampled child, a
one-hot row for a deterministic one (the draft's top-k). The target scores every node in one
forward (tree attention: node i sees the prefix, its ancestors and itself); `p[0]` is the target's
row after the last id and `p[1 + i]` its row after node i.

Acceptance (multi-candidate speculative sampling: SpecInfer, Miao et al. 2024, section 4; the
multi-draft rule of Chen et al. 2023 applied per node): at a node, with r = p(node) and its
children c_1..c_k in order, test c_j with `u_j < r(c_j) / q_j(c_j)` (strict); if kept, descend
into c_j; if not, r <- residual(r, q_j) = norm(max(0, r - q_j)) and try the next child. If every
child is rejected, emit a sample of r; at a leaf whose token was kept, emit a bonus from p(leaf).
For i.i.d. sampled children (all drawn from the same q) and for distinct deterministic
children (one-hot q_j: c_j is kept with probability r(c_j) and then removed from r), the emitted
token at each node is exactly r's starting row p (proved by enumeration in
tests/test_trees_exact.py). Uniforms: u_tests[i] tests node i, u_final is the last sample.
Imports numpy and npspec.decode.sampling.
"""

import heapq
import itertools

import numpy as np

from ..sampling import residual, sample

MAX_TREE_NODES = 64  # policy: the largest draft tree (--tree, --tree-budget); README's option table says it


def children(parents):  # [N] ints -> dict: node (-1 = the last id) -> [its children, in node order]
    """Each node's children in node order; -1 stands for the last id (the tree's root)."""
    out = {-1: []}
    for i, parent in enumerate(parents):
        out.setdefault(parent, []).append(i)
        out.setdefault(i, [])
    return out


def depths(parents):  # [N] ints -> [N] ints
    """Each node's depth: 1 for a child of the last id. Raises ValueError unless parents come before children."""
    out = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i}'s parent is {parent}: a parent must be -1 or an earlier node")
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def branching_tree(branching):  # e.g. (3, 2, 1) -> parents [N]
    """The parents of a static tree: the root has branching[0] children, each of them branching[1], and so on.

    Nodes are listed depth by depth (breadth first), siblings together. Raises ValueError for an
    empty list, a count < 1, or more than MAX_TREE_NODES nodes (counted before any is built).
    """
    if not branching or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in branching):
        raise ValueError(f"a tree's branching must be counts >= 1 per depth, such as 3,2,1, got {list(branching)!r}")
    level, nodes = 1, 0
    for k in branching:  # count before building: 1000000,1000000 would be 10**12 nodes
        level *= int(k)
        nodes += level
        if nodes > MAX_TREE_NODES:
            shown = ",".join(map(str, branching)) if len(branching) <= 8 else f"{len(branching)} levels"
            raise ValueError(f"the tree {shown} has more than {MAX_TREE_NODES} nodes, the largest tree npspec drafts "
                             f"(each node costs a draft forward and a verify row); give a smaller --tree such as 3,2,1")
    parents, level = [], [-1]
    for k in branching:
        nxt = []
        for node in level:
            for _ in range(k):
                nxt.append(len(parents))
                parents.append(node)
        level = nxt
    return parents


def accept_tree(ids, parents, q, p, u_tests, u_final):
    """Multi-candidate speculative sampling down a tree (see the module docstring).

    ids, parents: `[N]` ints; q: `[N, n_vocab]` float64, the row each node was drawn from;
    p: `[N + 1, n_vocab]` float64, the target's rows (p[0] after the last id, p[1 + i] after node i);
    u_tests: `[N]` uniforms in [0, 1) (u_tests[i] tests node i); u_final: one uniform.
    Returns (path, token): the kept nodes from the root down, and the corrected or bonus id.
    """
    kids = children(parents)
    node, path = -1, []
    while True:
        r = p[node + 1]
        for c in kids[node]:
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                kept = u_tests[c] < r[ids[c]] / q[c][ids[c]]  # strict, as in speculative.accept
            if kept:
                path.append(c)
                node = c
                break
            r = residual(r, q[c])
        else:  # no child kept (or a leaf): sample the remaining row
            return path, sample(r, u_final)


def accept_tree_greedy(ids, parents, best):
    """accept_tree at temperature 0: follow the target's argmax down the tree.

    best: `[N + 1]` the argmax of each p row (best[0] after the last id, best[1 + i] after node i).
    Returns (path, best after the path's last node): the deepest chain of nodes each equal to the
    target's argmax after its parent, and the target's token after it.
    """
    kids = children(parents)
    node, path = -1, []
    while True:
        nxt = [c for c in kids[node] if ids[c] == best[node + 1]]
        if not nxt:
            return path, int(best[node + 1])
        node = nxt[0]
        path.append(node)


def grow_tree(row_at, budget, max_children, max_depth):  # -> (ids [N], parents [N]), N <= budget
    """A dynamic draft tree grown best first by the draft's cumulative probability (EAGLE-2's idea, Li et al. 2024).

    row_at(path) -> the draft's row `[n_vocab]` after the tuple of drafted ids `path` (() is the
    root). Each node offers its row's `max_children` most likely ids (ties to the lower id) as
    candidates, scored by the product of the rows' probabilities along their path; the highest
    candidate becomes the next node (ties: the earliest offered), until `budget` nodes or no
    candidate within `max_depth` is left. Parents come before their children. The shape depends
    only on the draft's rows, never on the target: children are deterministic, so each is tested
    with a one-hot q (npspec.decode.rules.trees module docstring).
    """
    ids, parents, paths, heap, order = [], [], [], [], itertools.count()

    def offer(parent, path, score):
        row = row_at(path)
        ranked = np.argsort(-row, kind="stable") if isinstance(row, np.ndarray) else \
            sorted(range(len(row)), key=lambda x: (-row[x], x))  # ties: the lower id (an array: no Python loop)
        for tok in ranked[:max_children]:
            heapq.heappush(heap, (-score * row[tok], next(order), parent, int(tok)))

    offer(-1, (), 1)
    while heap and len(ids) < budget:
        negative, _, parent, tok = heapq.heappop(heap)
        path = (paths[parent] if parent >= 0 else ()) + (tok,)
        ids.append(tok)
        parents.append(parent)
        paths.append(path)
        if len(ids) < budget and len(path) < max_depth:
            offer(len(ids) - 1, path, -negative)
    return ids, parents
