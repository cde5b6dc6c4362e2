"""npspec.testing.trees: the exact law of one tree round, by enumeration, for a tree drafter and a verifier.

A *tree expander* describes how a drafter grows children: `expand(ctx, depth) -> [(probability,
[(id, q_row), ...]), ...]`, the law of the ordered list of children of the node whose context is
ctx (depth 0: the root), each child with the row the test is given. `sampled_expander(q,
branching)` draws branching[depth] children i.i.d. from q(ctx); `topk_expander(q, branching)`
takes q(ctx)'s top branching[depth] ids (ties to the lower id), each with a one-hot row.
A *verifier* `verify(r, children) -> [(probability, outcome)]` decides one node: outcome
("keep", j) descends into child j, ("emit", row) ends the round with a sample of row;
`multi_candidate` is npspec.trees.accept_tree's rule, stated as probabilities.
`tree_round_distribution` composes them into the law of a round continued by the target alone to
len(branching) + 1 ids, which a correct drafter + verifier makes equal to the target's own law
(npspec.testing.oracle.sequence_distribution). Lazy: children are drawn only where the walk goes,
which has the same law as drawing the whole tree first. Imports npspec.testing.oracle.
"""

import itertools
from collections import defaultdict
from fractions import Fraction

from ..trees import grow_tree
from .oracle import _start, sequence_distribution


def _norm_residual(r, q):
    w = [max(0, ri - qi) for ri, qi in zip(r, q)]
    mass = sum(w)
    return [wi / mass for wi in w] if mass > 0 else list(r)


def multi_candidate(r, kids):
    """Multi-candidate speculative sampling at one node (npspec.trees.accept_tree): test each child against the
    running residual r, which loses the child's q at each rejection; emit a sample of r if none is kept."""
    out, reach = [], Fraction(1)
    for j, (x, qrow) in enumerate(kids):
        a = min(1, Fraction(r[x]) / Fraction(qrow[x])) if qrow[x] else Fraction(0)
        if a:
            out.append((reach * a, ("keep", j)))
        reach *= 1 - a
        if not reach:
            return out
        r = _norm_residual(r, qrow)
    out.append((reach, ("emit", r)))
    return out


def sampled_expander(q, branching):
    """branching[depth] children drawn i.i.d. from q(ctx), every ordered outcome with its probability; each child's row is q(ctx)."""
    def expand(ctx, depth):
        if depth >= len(branching):
            return [(1, [])]
        row = q(ctx)
        support = [x for x, qx in enumerate(row) if qx]
        return [(_prod(row[x] for x in xs), [(x, row) for x in xs])
                for xs in itertools.product(support, repeat=branching[depth])]
    return expand


def topk_expander(q, branching):
    """The top branching[depth] ids of q(ctx) (ties to the lower id), each with a one-hot row: deterministic children."""
    def expand(ctx, depth):
        if depth >= len(branching):
            return [(1, [])]
        row = q(ctx)
        top = sorted(range(len(row)), key=lambda x: (-row[x], x))[:branching[depth]]
        return [(1, [(x, [Fraction(int(i == x)) for i in range(len(row))]) for x in top])]
    return expand


def dynamic_expander(q, budget, max_children, max_depth):
    """The dynamic tree of npspec.trees.grow_tree over table q (grown once per root context), as an expander:
    each node's children in node order, each with a one-hot row."""
    trees = {}

    def expand(ctx, depth):
        root = ctx[:len(ctx) - depth]
        if root not in trees:
            ids, parents = grow_tree(lambda path: q(root + path), budget, max_children, max_depth)
            paths = []
            for tok, parent in zip(ids, parents):
                paths.append((paths[parent] if parent >= 0 else ()) + (tok,))
            trees[root] = paths
        here = ctx[len(root):]
        n_vocab = len(q(ctx))
        return [(1, [(path[-1], [Fraction(int(i == path[-1])) for i in range(n_vocab)])
                     for path in trees[root] if path[:-1] == here])]
    return expand


def _prod(xs):
    out = Fraction(1)
    for x in xs:
        out *= x
    return out


def tree_round_distribution(p, expand, prompt, depth, eos=None, verify=multi_candidate):
    """The law of one tree round after `prompt`, continued by the target alone to depth + 1 ids (shorter at eos).

    p: the target's table; expand: a tree expander; depth: the tree's depth (len(branching)).
    `{ids: probability}`; equal to sequence_distribution(p, prompt, depth + 1, eos) for a lossless pair.
    """
    prompt = _start(prompt, None)
    dist = defaultdict(int)

    def finish(emitted, prob):
        if eos is not None and emitted and emitted[-1] == eos:
            dist[emitted] += prob
            return
        for tail, tp in sequence_distribution(p, prompt + emitted, depth + 1 - len(emitted), eos).items():
            dist[emitted + tail] += prob * tp

    def walk(kept, prob):
        ctx = prompt + kept
        for cp, kids in expand(ctx, len(kept)):
            for vp, (kind, what) in verify(list(p(ctx)), kids):
                if kind == "keep":
                    x = kids[what][0]
                    if x == eos:
                        finish(kept + (x,), prob * cp * vp)
                    else:
                        walk(kept + (x,), prob * cp * vp)
                else:
                    for y, ry in enumerate(what):
                        if ry:
                            finish(kept + (y,), prob * cp * vp * ry)

    walk((), Fraction(1))
    return {k: v for k, v in dist.items() if v}
