"""Recursive rejection sampling over a node's children drawn WITHOUT replacement (RSD: Jeon et al., "Recursive
Speculative Decoding", arXiv 2402.14160, 2024). NOTE: letters as in Leviathan et al.: `p` the target, `q` the draft.
Child c_j is drawn from q with c_1..c_{j-1} removed and renormalised (draw_children) and tested, as accept_tree does,
against that row q_j (sibling_rows). Lossless: notes/derivation.md, claim 11. Imports numpy, npspec.decode.sampling."""

import numpy as np

from ..sampling import residual, sample


def draw_children(q, k, u):  # [n_vocab] float64, int, [k] uniforms -> [m] ids, m = min(k, support of q)
    """Up to k distinct children of q, child j = sample(q with children 1..j-1 zeroed, u[j]) (Gumbel-top-k's law);
    fewer if q has fewer than k tokens of positive probability. Each child is reported with the same row q."""
    row = np.array(q, dtype=np.float64)
    out = []
    for j in range(min(k, int(np.count_nonzero(row > 0)))):
        x = sample(row, u[j])
        out.append(x)
        row[x] = 0.0
    return out


def sibling_rows(ids, parents, q):  # [N], [N], [N, n_vocab] -> [N, n_vocab] float64
    """Row i: q[i] with its earlier siblings' ids zeroed and renormalised (a row without mass stays zero)."""
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
    """RSD down a tree, with trees.accept_tree's signature; q `[N, n_vocab]` holds each node's row BEFORE excluding
    siblings. Child c is kept when u < r(c) / q_j(c), q_j = sibling_rows' row, else r <- residual(r, q_j). Returns
    (path, token)."""
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
