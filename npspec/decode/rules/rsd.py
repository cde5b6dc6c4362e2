"""Recursive rejection sampling over a tree's children drawn without replacement (RSD, Jeon et al. 2024).
Imports numpy and npspec.decode.sampling; no I/O, no RNG.

NOTE: letters as in npspec.decode (Leviathan's): `p` is the target, `q` the draft.

Recursive rejection sampling over children drawn without replacement (Jeon, Gagrani, Goel, Park, Lee, Lott,
"Recursive Speculative Decoding: Accelerating LLM Inference via Sampling Without Replacement", arXiv 2402.14160,
2024: RSD). The drafter draws a node's children c_1..c_k WITHOUT replacement from its row q (`draw_children`):
c_j from q with c_1..c_{j-1} removed and renormalised. The verifier is npspec.decode.rules.trees.accept_tree's recursive
residual, with child j tested against that conditional row q_j instead of q (`accept_tree_rsd`). A rejected c_j has
r(c_j) < q_j(c_j), so the next residual gives it 0: the draw that replaces it never wastes mass on it, as an i.i.d.
draw would. notes/derivation.md, claim 11, proves it lossless; tests/test_tree_rules.py compares it with i.i.d.
children and with the optimal-transport bound.
"""

import numpy as np

from ..sampling import residual, sample


def draw_children(q, k, u):  # [n_vocab] float64, int, [k] uniforms -> [m] ids, m = min(k, support of q)
    """Up to k distinct children drawn without replacement from the row q (RSD's drafter, Jeon et al. 2024).

    Child j is sample(q with children 1..j-1 zeroed, u[j]): sequential inverse-CDF draws, the same law as
    Gumbel-top-k. Fewer than k come back if q has fewer than k tokens of positive probability. A drafter for
    accept_tree_rsd must draw a node's children this way and pass, for every child, the same row q (its parent
    context's row, before any exclusion); the verifier removes the earlier siblings itself.
    """
    row = np.array(q, dtype=np.float64)
    out = []
    for j in range(min(k, int(np.count_nonzero(row > 0)))):
        x = sample(row, u[j])
        out.append(x)
        row[x] = 0.0
    return out


def sibling_rows(ids, parents, q):  # [N], [N], [N, n_vocab] -> [N, n_vocab] float64
    """The row each child was really drawn from when siblings are drawn without replacement: q[i] with the ids of
    its earlier siblings (same parent, lower index) zeroed and renormalised. A row left without mass stays zero."""
    out = np.array(q, dtype=np.float64)
    seen = {}
    for i, parent in enumerate(parents):
        before = seen.setdefault(parent, [])
        if before:
            out[i, before] = 0.0
            mass = out[i].sum()
            out[i] = out[i] / mass if mass > 0 else out[i]
        before.append(ids[i])
    return out


def accept_tree_rsd(ids, parents, q, p, u_tests, u_final):
    """Recursive rejection sampling down a tree whose siblings were drawn without replacement (RSD, Jeon et al.
    2024); the signature of npspec.decode.rules.trees.accept_tree.

    ids, parents: `[N]` ints (parents before children, -1 the last id); q: `[N, n_vocab]` float64, each node's
    parent-context row BEFORE excluding siblings (for draw_children's children: the same row for all siblings);
    p: `[N + 1, n_vocab]` float64 (p[0] after the last id, p[1 + i] after node i); u_tests `[N]`; u_final a uniform.
    At a node with running row r (first p), child c_j is kept when u < r(c_j) / q_j(c_j), q_j = sibling_rows' row;
    if not, r <- residual(r, q_j). No child kept: a sample of r; a kept leaf: a bonus from p after it. Returns (path,
    token). With one-hot q (deterministic distinct children) it is accept_tree exactly.
    """
    rows = sibling_rows(ids, parents, q)
    kids = {}
    for i, parent in enumerate(parents):
        kids.setdefault(parent, []).append(i)
    node, path = -1, []
    while True:
        r = p[node + 1]
        for c in kids.get(node, []):
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                kept = u_tests[c] < r[ids[c]] / rows[c][ids[c]]  # strict
            if kept:
                path.append(c)
                node = c
                break
            r = residual(r, rows[c])
        else:
            return path, sample(r, u_final)
