"""Traversal verification of a tree, leaves up (Weng et al., NeurIPS 2025, arXiv 2505.12398, Algorithm 1; on a chain,
block.py's decisions). NOTE: Leviathan's letters, `p` target (their M_b), `q` draft (M_s); our weight w is their
p_alpha. Rule and proof: notes/derivation.md, claim 12. Imports numpy, npspec.decode.sampling, .rsd, .trees."""

import numpy as np

from ..sampling import residual, sample
from .rsd import sibling_rows
from .trees import children


def child_weight(w, rx, qx):  # floats -> float
    """min(1, w r(x) / q(x)); 0 for w = 0 or a ratio that is not positive (0/0), 1 for r(x) > 0 = q(x)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ratio = np.float64(rx) / np.float64(qx)
    return 0.0 if w == 0 or not ratio > 0 else min(1.0, w * ratio)


def after_rejection(w, r, q):  # float, [n_vocab], [n_vocab] float64 -> (float, [n_vocab] float64)
    """A node's weight and row once a child drawn from q is rejected: (S / (S + 1 - w), residual(w r, q)), S = sum
    max(0, w r - q); weight 1 where S + 1 - w = 0 (probability 0 in exact arithmetic)."""
    mass = np.maximum(w * r - q, 0.0).sum()
    den = mass + 1.0 - w
    return (mass / den if den > 0 else 1.0), residual(w * r, q)


def accept_tree_traversal(ids, parents, q, p, u_tests, u_final):
    """trees.accept_tree's signature (q: rows BEFORE excluding siblings, as rsd's; u_tests[i] tests node i, u < w, once
    its children are all rejected): (path to the first node kept, a sample of its row). ValueError as sample."""
    rows, kids = sibling_rows(ids, parents, q), children(parents)

    def visit(node, w):  # -> (path below node, row to sample) when node or a descendant is kept, else None
        r = p[node + 1]
        for c in kids[node]:
            got = visit(c, child_weight(w, r[ids[c]], rows[c][ids[c]]))
            if got is not None:
                return [c] + got[0], got[1]
            w, r = after_rejection(w, r, rows[c])
        return ([], r) if node < 0 or u_tests[node] < w else None  # strict, as the token rule; the root is kept

    path, row = visit(-1, 1.0)
    return path, sample(row, u_final)


def traversal_accept(d, p, q, u_tests, u_final):
    """The tree form on a chain (parents -1, 0, .., k - 2), with token.accept's signature: (n kept, token)."""
    path, token = accept_tree_traversal(list(d), list(range(-1, len(d) - 1)), q, p, u_tests, u_final)
    return len(path), token
