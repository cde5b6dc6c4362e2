"""Token trees accepted by multi-candidate speculative sampling (SpecInfer, Miao et al. 2024, section 4). NOTE: letters
as in Leviathan et al.: `p` the target, `q` the draft. At a node, r = p(node); child c_j is kept if u < r(c_j) /
q_j(c_j) (strict), else r <- norm(max(0, r - q_j)); no child kept: a sample of r; a kept leaf: a bonus from p(leaf).
Lossless for i.i.d. or distinct deterministic children: notes/derivation.md, claim 9. Imports numpy, sampling."""

import heapq
import itertools

import numpy as np

from ..sampling import residual, sample

MAX_TREE_NODES = 64  # policy: the largest draft tree (--tree, --tree-budget); README's option table says it


def children(parents):  # [N] ints -> dict: node (-1 = the last id) -> [its children, in node order]
    out = {-1: []}
    for i, parent in enumerate(parents):
        out.setdefault(parent, []).append(i)
        out.setdefault(i, [])
    return out


def depths(parents):  # [N] ints -> [N] ints
    """Each node's depth (1: a child of the last id); ValueError unless parents come before children."""
    out = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i}'s parent is {parent}: a parent must be -1 or an earlier node")
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def branching_tree(branching):  # e.g. (3, 2, 1) -> parents [N]
    """The parents of a static tree, depth by depth, siblings together. ValueError for an empty list, a count < 1,
    or more than MAX_TREE_NODES nodes (counted before any is built)."""
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
    """Multi-candidate speculative sampling down a tree (the module's rule): ids, parents `[N]`; q `[N, n_vocab]`,
    p `[N + 1, n_vocab]` float64; u_tests `[N]`; u_final. Returns (path, token): the kept nodes, root down, and the
    corrected or bonus id."""
    kids = children(parents)
    node, path = -1, []
    while True:
        r = p[node + 1]
        for c in kids[node]:
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                kept = u_tests[c] < r[ids[c]] / q[c][ids[c]]  # strict, as in rules.token.accept
            if kept:
                path.append(c)
                node = c
                break
            r = residual(r, q[c])
        else:  # no child kept (or a leaf): sample the remaining row
            return path, sample(r, u_final)


def accept_tree_greedy(ids, parents, best):
    """accept_tree at temperature 0: best `[N + 1]`, each p row's argmax. Returns (path, token): the deepest chain of
    nodes each equal to the target's argmax after its parent, and the argmax after it."""
    kids = children(parents)
    node, path = -1, []
    while True:
        nxt = [c for c in kids[node] if ids[c] == best[node + 1]]
        if not nxt:
            return path, int(best[node + 1])
        node = nxt[0]
        path.append(node)


def grow_tree(row_at, budget, max_children, max_depth):  # -> (ids [N], parents [N]), N <= budget
    """A dynamic tree grown best first by cumulative draft probability (EAGLE-2's idea, Li et al. 2024). row_at(path):
    the draft's row `[n_vocab]` after the drafted ids `path` (() the root). Each node offers its max_children most
    likely ids (ties: the lower id), scored by the product of probabilities along the path; the best (ties: the
    earliest offered) becomes the next node, until `budget` nodes or none within max_depth."""
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
