"""npspec.testing.multidraft: several drafts at one position, exactly: children without replacement (RSD), the bound.

With trees.multi_candidate, without_replacement_expander is RSD (Jeon et al. 2024); ot_bound is SpecTr's optimal
transport bound (Sun et al. 2023) as a min-cut (notes/derivation.md, claim 11). Imports npspec.testing.trees.
"""

import itertools
from fractions import Fraction

from .trees import multi_candidate, sampled_expander, static_expander, tree_round_outcomes
from .usage import need_bounded, need_int, need_row


def without_replacement(row, k):
    """[(probability, [(id, conditional row), ...])]: every ordered draw of min(k, support) distinct ids from row,
    the j-th from row with the first j - 1 removed and renormalised, with that row (Fractions)."""
    row = [Fraction(v) for v in row]
    support = [x for x, v in enumerate(row) if v]
    out = []
    for xs in itertools.permutations(support, min(k, len(support))):
        prob, kids, left = Fraction(1), [], list(row)
        for x in xs:
            mass = sum(left)
            cond = [v / mass for v in left]
            prob *= cond[x]
            kids.append((x, cond))
            left[x] = Fraction(0)
        out.append((prob, kids))
    return out


def without_replacement_expander(q, branching):
    """branching[depth] children drawn without replacement from q(ctx), each with its conditional row (RSD)."""
    return static_expander(q, branching, without_replacement)


def node_acceptance(p_row, q_row, k, replacement=True):
    """P(one of the node's k children is kept) under multi_candidate: k i.i.d. children (replacement=True, npspec's
    sampled trees) or k drawn without replacement (RSD). Exact for Fraction rows. Raises KitUsageError for bad rows
    or k, or past MAX_OUTCOMES draws."""
    node_arguments(p_row, q_row, k, "node_acceptance")
    draws = (sampled_expander(lambda ctx: q_row, (k,))((), 0) if replacement else without_replacement(q_row, k))
    return sum(cp * vp for cp, kids in draws for vp, (kind, _) in multi_candidate(list(p_row), kids) if kind == "keep")


def ot_bound(p_row, q_row, k, replacement=True):
    """The largest P(Y in {X_1..X_k}) over couplings of k drafts (i.i.d. from q_row, or without replacement) with
    Y ~ p_row: min over token sets B of (1 - p(B)) + P(some draft in B), exact (2^n_vocab sets). Raises as
    node_acceptance."""
    n = node_arguments(p_row, q_row, k, "ot_bound")
    need_bounded(2 ** n, "2^n_vocab token sets", "ot_bound", "use a vocabulary of at most 17 ids")
    draws = None if replacement else without_replacement(q_row, k)
    best = Fraction(1)
    for size in range(1, n + 1):
        for b in itertools.combinations(range(n), size):
            qb = sum(Fraction(q_row[x]) for x in b)
            hit = (1 - (1 - qb) ** k) if replacement else sum(cp for cp, kids in draws if any(x in b for x, _ in kids))
            best = min(best, 1 - sum(Fraction(p_row[x]) for x in b) + hit)
    return best


def node_arguments(p_row, q_row, k, where):  # -> n_vocab
    """Raise KitUsageError unless p_row and q_row are probability rows of one length, k an int >= 1, and k draws
    from q_row's support fit MAX_OUTCOMES."""
    n = need_row(p_row, "p_row", where)
    need_row(q_row, "q_row", where, n)
    k = need_int(k, "k", where, 1)
    need_bounded(sum(1 for v in q_row if v) ** k, f"{k} drafts", where, "use fewer drafts or a smaller support")
    return n


def tree_expected_accepted(p, expand, prompt, depth, verify=multi_candidate):
    """E[nodes kept] in one tree round after prompt (no EOS): every emitted sequence is the kept path plus one token."""
    return sum(prob * (len(emitted) - 1) for emitted, prob in tree_round_outcomes(p, expand, tuple(prompt), depth,
                                                                                    None, verify))
