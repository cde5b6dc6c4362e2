"""npspec.testing.trees: the exact law of one tree round, by enumeration, for a tree drafter and a verifier.

An *expander* `expand(ctx, depth) -> [(probability, [(id, q_row), ...])]`: the law of a node's ordered children, each
with the row its test is given. A *verifier* `verify(r, children) -> [(probability, outcome)]`: ("keep", j) descends
into child j, ("emit", row) ends the round with a sample of row; multi_candidate is
npspec.decode.rules.trees.accept_tree's (notes/derivation.md, claim 9). Imports npspec.decode and .oracle.
"""

import itertools
from collections import defaultdict
from fractions import Fraction
from types import SimpleNamespace

from ..decode import round_gamma, tree_depth
from ..decode.rules.trees import branching_tree, depths, grow_tree
from .oracle import _continued, _nonzero, _start


def _norm_residual(r, q):
    w = [max(0, ri - qi) for ri, qi in zip(r, q)]
    mass = sum(w)
    return [wi / mass for wi in w] if mass > 0 else list(r)


def multi_candidate(r, kids):
    """Multi-candidate speculative sampling at one node (npspec.decode.rules.trees.accept_tree): test each child against the
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


def static_expander(q, branching, children):
    """The expander of a static tree: children(q(ctx), branching[depth]) -> [(probability, [(id, q_row), ...])]
    at depth < len(branching), no children below."""
    def expand(ctx, depth):
        return children(q(ctx), branching[depth]) if depth < len(branching) else [(1, [])]
    return expand


def iid_children(row, k):
    """Every ordered draw of k children i.i.d. from row, with its probability; each child's row is row."""
    support = [x for x, qx in enumerate(row) if qx]
    return [(_prod(row[x] for x in xs), [(x, row) for x in xs]) for xs in itertools.product(support, repeat=k)]


def top_children(row, k):
    """The top k ids of row (ties to the lower id), each with a one-hot row: deterministic children."""
    top = sorted(range(len(row)), key=lambda x: (-row[x], x))[:k]
    return [(1, [(x, [Fraction(int(i == x)) for i in range(len(row))]) for x in top])]


def sampled_expander(q, branching):
    """branching[depth] children drawn i.i.d. from q(ctx), each with the row q(ctx)."""
    return static_expander(q, branching, iid_children)


def topk_expander(q, branching):
    """The top branching[depth] ids of q(ctx) (ties to the lower id), each with a one-hot row."""
    return static_expander(q, branching, top_children)


def dynamic_expander(q, budget, max_children, max_depth):
    """The dynamic tree of npspec.decode.rules.trees.grow_tree over table q (grown once per root context), as an expander:
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


def tree_round_outcomes(p, expand, prompt, depth, eos=None, verify=multi_candidate):
    """Every outcome of one tree round after `prompt`, nodes no deeper than `depth`: yields (emitted ids, probability)."""
    def walk(kept, prob):  # children drawn only where the walk goes: the law of drawing the whole tree first
        ctx = prompt + kept
        for cp, kids in (expand(ctx, len(kept)) if len(kept) < depth else [(1, [])]):
            for vp, (kind, what) in verify(list(p(ctx)), kids):
                if kind == "keep":
                    x = kids[what][0]
                    if x == eos:
                        yield kept + (x,), prob * cp * vp
                    else:
                        yield from walk(kept + (x,), prob * cp * vp)
                else:
                    for y, ry in enumerate(what):
                        if ry:
                            yield kept + (y,), prob * cp * vp * ry

    yield from walk((), Fraction(1))


def tree_round_distribution(p, expand, prompt, depth, eos=None, verify=multi_candidate):
    """`{ids: probability}` of one tree round after prompt (table p, an expander, nodes no deeper than depth),
    continued by the target alone to depth + 1 ids (shorter at eos): sequence_distribution's for a lossless pair."""
    prompt = _start(prompt, None)
    return _nonzero(_continued(p, prompt, tree_round_outcomes(p, expand, prompt, depth, eos, verify), depth + 1, eos))


def tree_loop_distribution(p, expand, branching, prompt, gamma, max_new_tokens, eos=None, n_ctx=None,
                           outcomes=tree_round_outcomes):
    """`{emitted ids: probability}` of npspec's whole loop drafting static trees of `branching` with `expand`:
    each round's depth is npspec.decode.schedule.tree_depth's (round_gamma's clamp, cut until the verify fits n_ctx);
    stops at eos, max_new_tokens or n_ctx as the loop does. outcomes: a round's, tree_round_outcomes' signature."""
    prompt = _start(prompt, n_ctx)
    sizes = depths(branching_tree(branching))
    shape = SimpleNamespace(depth=len(branching), tree_size=lambda d: sum(x <= d for x in sizes))
    limit = n_ctx if n_ctx is not None else len(prompt) + max_new_tokens + len(sizes) + 1
    gamma = min(gamma, max_new_tokens - 1, limit - 1)
    dist = defaultdict(int)

    def go(seq, prob):
        out = seq[len(prompt):]
        if len(out) >= max_new_tokens or len(seq) >= limit or (eos is not None and out and out[-1] == eos):
            dist[out] += prob
            return
        g = max(0, round_gamma(gamma, max_new_tokens - len(out), limit, len(seq)))
        for emitted, rp in outcomes(p, expand, seq, tree_depth(shape, g, limit, len(seq)), eos):
            go(seq + emitted, prob * rp)

    go(prompt, Fraction(1))
    return {k: v for k, v in dist.items() if v}
