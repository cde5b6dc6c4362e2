"""npspec.testing.gap: how far each lossless rule keeps from the optimum, exactly, for a node of k drafts and small trees.

tree_ot_bound is the optimal-transport ceiling of a whole drafted tree (claim 11 (c) per depth, notes/derivation.md,
claim 14); tree_gap gives each rule's exact E[drafts kept] with the ceiling of its own drafts; GAP_RULES names the
rules (the expander that draws the drafts a rule was proven with, and its exact E[kept]). Exact for Fraction tables.
Imports npspec.testing.blocks, .multidraft, .traversal and .trees.
"""

from collections import defaultdict, deque
from fractions import Fraction

from . import blocks
from .multidraft import tree_expected_accepted, without_replacement_expander
from .oracle import constant_table
from .traversal import traversal_expected_accepted
from .trees import sampled_expander

# name -> (expander factory (q, branching) -> expand, kept(p, expand, prompt, depth) -> E[drafts kept]): every
# lossless tree rule, with the drafts it was proven with
GAP_RULES = {
    "i.i.d. children, token tree rule": (sampled_expander, tree_expected_accepted),
    "RSD (without replacement)": (without_replacement_expander, tree_expected_accepted),
    "traversal (without replacement)": (without_replacement_expander, traversal_expected_accepted),
    "traversal (i.i.d. children)": (sampled_expander, traversal_expected_accepted),
}


def tree_law(expand, prompt, depth):
    """`{frozenset of drafted paths: probability}`: the law of the whole tree an expander draws after prompt, nodes
    no deeper than depth (a path is a tuple of ids below prompt; duplicate siblings give one path)."""
    def below(ctx, level):  # [(prob, frozenset of paths under ctx)]
        if level >= depth:
            return [(Fraction(1), frozenset())]
        out = defaultdict(Fraction)
        for cp, kids in expand(ctx, level):
            combos = [(Fraction(cp), frozenset())]
            for x, _ in kids:
                sub = [(sp, frozenset({(x,)}) | frozenset((x,) + path for path in s))
                       for sp, s in below(ctx + (x,), level + 1)]
                combos = [(a * b, s | t) for a, s in combos for b, t in sub]
            for prob, paths in combos:
                out[paths] += prob
        return [(v, k) for k, v in out.items() if v]

    return {paths: prob for prob, paths in below(tuple(prompt), 0)}


def _max_flow(supply, demand, edges):
    """Max flow from source through supply nodes (capacity supply[s]) along edges[s] (unbounded) to demand nodes
    (capacity demand[t]) to the sink, exact (Edmonds-Karp in Fractions)."""
    cap = defaultdict(Fraction)
    adj = defaultdict(set)

    def link(a, b, c):
        cap[a, b] += c
        adj[a].add(b)
        adj[b].add(a)

    for s, c in supply.items():
        link("src", ("s", s), c)
        for t in edges[s]:
            link(("s", s), ("t", t), Fraction(2))  # above any total mass: unbounded
    for t, c in demand.items():
        link(("t", t), "sink", c)
    flow = Fraction(0)
    while True:
        parent, todo = {"src": None}, deque(["src"])
        while todo and "sink" not in parent:
            a = todo.popleft()
            for b in adj[a]:
                if b not in parent and cap[a, b] > 0:
                    parent[b] = a
                    todo.append(b)
        if "sink" not in parent:
            return flow
        path, b = [], "sink"
        while parent[b] is not None:
            path.append((parent[b], b))
            b = parent[b]
        push = min(cap[e] for e in path)
        for a, b in path:
            cap[a, b] -= push
            cap[b, a] += push
        flow += push


def _target_law(p, prompt, d):
    level = {(): Fraction(1)}
    for _ in range(d):
        level = {xs + (y,): pr * Fraction(py) for xs, pr in level.items()
                 for y, py in enumerate(p(tuple(prompt) + xs)) if py}
    return level


def tree_ot_bound(p, expand, prompt, depth):
    """sum over d = 1..depth of max over couplings P(the target's first d tokens are a drafted path): no lossless
    verifier of the drafted tree keeps more in expectation (claim 14). Each term is a max flow, exact in Fractions.
    A node (depth 1) gives ot_bound; a chain (one child per node) gives blocks.joint_bound."""
    law = tree_law(expand, prompt, depth)
    total = Fraction(0)
    for d in range(1, depth + 1):
        supply = defaultdict(Fraction)
        for paths, prob in law.items():
            supply[frozenset(x for x in paths if len(x) == d)] += prob
        demand = _target_law(p, prompt, d)
        total += _max_flow(supply, demand, {s: [t for t in s if t in demand] for s in supply})
    return total


def tree_gap(p, q, branching, prompt=(0,), rules=None):
    """[(rule name, E[drafts kept], the ceiling of its drafts)] for a static tree of `branching` drafted from table q
    against table p (Fraction rows): each rule of `rules` (default GAP_RULES) and, for a chain (every branching 1),
    block verification (Sun et al. 2025) with its joint bound. Raises ValueError for an empty branching."""
    if not branching:
        raise ValueError("branching is empty: a tree needs at least one level of drafts")
    prompt, depth, rows = tuple(prompt), len(branching), []
    for name, (factory, kept) in (GAP_RULES if rules is None else rules).items():
        expand = factory(q, tuple(branching))
        rows.append((name, kept(p, expand, prompt, depth), tree_ot_bound(p, expand, prompt, depth)))
    if all(k == 1 for k in branching):
        bound = blocks.joint_bound(p, q, prompt, depth)
        rows.append(("block verification (chain)", blocks.expected_accepted(p, q, prompt, depth), bound))
    return rows


def node_gap(p_row, q_row, k, rules=None):
    """tree_gap for one node of k drafts from constant rows: [(rule name, P(a draft is kept), its ceiling)]."""
    return tree_gap(constant_table(p_row), constant_table(q_row), (k,), rules=rules)
