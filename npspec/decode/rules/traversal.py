"""Traversal verification of a token tree, leaves up (Weng et al., "Traversal Verification for Speculative Tree
Decoding", NeurIPS 2025, arXiv 2505.12398, Algorithm 1). NOTE: letters as in Leviathan et al.: `p` the target (their
M_b), `q` the draft (M_s); their p_alpha is our weight w. A node's children are visited in order (post-order): child c,
drawn from q_c (its row with earlier siblings removed: rsd.sibling_rows), starts with w_c = min(1, w r(c) / q_c(c)),
r the node's current row (p at first); a child whose subtree is all rejected is tested last, kept iff u_c < w_c. The
node then takes (w, r) <- (S / (S + 1 - w), norm(max(0, w r - q_c))), S = sum max(0, w r - q_c). Kept: the path to
the first node kept, then a sample of its current row. On a chain it is block verification (block.py), decision for
decision. Lossless: notes/derivation.md, claim 12. Imports numpy, npspec.decode.sampling and .rsd, .trees."""

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
    """Traversal verification, with trees.accept_tree's signature: ids, parents `[N]`; q `[N, n_vocab]` each node's row
    BEFORE excluding siblings (rsd's); p `[N + 1, n_vocab]` float64; u_tests `[N]` (node i's test); u_final. Returns
    (path, token). ValueError as sampling.residual and sample (NaN rows)."""
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
    """Traversal verification of a chain, with token.accept's signature (d `[k]` ids, p `[k + 1, n_vocab]`, q `[k,
    n_vocab]`, u_tests `[k]`, u_final): the tree form on parents -1, 0, .., k - 2. Returns (n kept, token)."""
    path, token = accept_tree_traversal(list(d), list(range(-1, len(d) - 1)), q, p, u_tests, u_final)
    return len(path), token
