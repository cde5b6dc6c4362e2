"""npspec.testing.traversal: the exact law of one traversal-verification round (Weng et al., "Traversal Verification
for Speculative Tree Decoding", NeurIPS 2025, arXiv 2505.12398), by enumeration of whole drafted trees.

Traversal verification decides a tree from the leaves up (post-order), so unlike trees.multi_candidate it needs the
whole tree drawn first: every tree an expander (npspec.testing.trees) can draw is enumerated, and each is decided
exactly by traversal_decisions. Each child is tested against the row it was drawn from (the expander's), which makes
one rule for i.i.d., without-replacement and deterministic children. Lossless and, on a chain, block verification's
law: notes/derivation.md, claim 12. Imports npspec.testing.oracle and npspec.testing.trees.
"""

import itertools
from fractions import Fraction

from .oracle import _Budget, _continued, _nonzero, _start


def child_weight(w, rx, qx):
    """A child's weight min(1, w r(x) / q(x)), 0 where q(x) = 0 and r(x) = 0 (the strict test never keeps it)."""
    if not qx:
        return 1 if w and rx else 0 * w
    return min(1, w * rx / qx)


def after_rejection(w, r, qrow):
    """A node's (weight, row) once a child drawn from qrow is rejected: z = max(0, w r - q), S = sum z; w' = S / (S +
    1 - w) (1 where that is 0/0: probability 0), r' = z / S (r where S = 0: weight 0, never sampled). Weng et al.
    2025, the residual update of Algorithm 1, block verification's h and residual (Sun et al. 2025)."""
    z = [max(0, w * ri - qi) for ri, qi in zip(r, qrow)]
    mass = sum(z)
    den = mass + 1 - w
    return (mass / den if den > 0 else 1 + 0 * w), ([zi / mass for zi in z] if mass > 0 else list(r))


def traversal_decisions(p, ctx, kids, w=1):
    """The law of traversal verification of a drawn tree below ctx: ([(probability, kept ids, row the last token is
    drawn from)], P(the whole subtree, ctx's node included, is rejected)). p: a table; kids: [(id, q_row, kids)] in
    draft order, q_row the row the child was drawn from; w: ctx's weight (1 at the root, whose rejection is 0)."""
    r, out, reach = list(p(ctx)), [], Fraction(1)
    for x, qrow, sub in kids:
        got, rejected = traversal_decisions(p, ctx + (x,), sub, child_weight(w, r[x], qrow[x]))
        out += [(reach * a, (x,) + kept, row) for a, kept, row in got if a]
        reach *= rejected
        if not reach:
            return out, reach
        w, r = after_rejection(w, r, qrow)
    if w:
        out.append((reach * w, (), r))
    return out, reach * (1 - w)


def whole_trees(expand, ctx, depth, limit, budget=None):
    """Every whole tree an expander draws below ctx (at `depth`), nodes no deeper than limit: [(probability, kids)],
    kids as traversal_decisions takes them. Past MAX_OUTCOMES trees: KitUsageError."""
    budget = budget or _Budget("the traversal round's enumeration")
    if depth >= limit:
        return [(1, [])]
    out = []
    for cp, kids in expand(ctx, depth):
        subs = [whole_trees(expand, ctx + (x,), depth + 1, limit, budget) for x, _ in kids]
        for combo in itertools.product(*subs):
            budget.spend()
            prob = cp
            for sp, _ in combo:
                prob *= sp
            out.append((prob, [(x, row, sub) for (x, row), (_, sub) in zip(kids, combo)]))
    return out


def traversal_outcomes(p, expand, prompt, depth, eos=None):
    """Every outcome of one traversal round after prompt: yields (kept ids, emitted ids, probability); the emitted
    ids are cut after an accepted eos, as npspec's loop does (decode.round.finish)."""
    prompt = tuple(prompt)
    for tp, kids in whole_trees(expand, prompt, 0, depth):
        got, rejected = traversal_decisions(p, prompt, kids)
        assert not rejected  # the root's weight stays 1
        for a, kept, row in got:
            for y, ry in enumerate(row):
                if ry:
                    emitted = kept + (y,)
                    if eos is not None and eos in emitted:
                        emitted = emitted[:emitted.index(eos) + 1]
                    yield kept, emitted, tp * a * ry


def traversal_round_outcomes(p, expand, prompt, depth, eos=None):
    """(emitted ids, probability) of one traversal round: trees.tree_round_outcomes' signature, for
    trees.tree_loop_distribution's `outcomes` (the whole loop)."""
    for _, emitted, prob in traversal_outcomes(p, expand, prompt, depth, eos):
        yield emitted, prob


def traversal_round_distribution(p, expand, prompt, depth, eos=None):
    """`{ids: probability}` of one traversal round (table p, an expander, nodes no deeper than depth), continued by
    the target alone to depth + 1 ids (shorter at eos): sequence_distribution's for a lossless rule."""
    prompt = _start(prompt, None)
    return _nonzero(_continued(p, prompt, ((e, prob) for _, e, prob in traversal_outcomes(p, expand, prompt, depth,
                                                                                          eos)), depth + 1, eos))


def traversal_expected_accepted(p, expand, prompt, depth):
    """E[drafts kept] in one traversal round after prompt (no EOS), exact for Fraction tables: a chain is the
    expander trees.sampled_expander(q, (1,) * depth)."""
    return sum(prob * len(kept) for kept, _, prob in traversal_outcomes(p, expand, prompt, depth))
