"""Token trees, exactly: multi-candidate speculative sampling keeps a tree round's output target-distributed
(sampled i.i.d. children and deterministic top-k children, with EOS and truncation), the classic tree
mistakes change the law, and npspec.decode.rules.trees.accept_tree makes the decisions the enumerated rule makes.
"""

from fractions import Fraction

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode.sampling import residual
from npspec.testing import trees as tt
from npspec.decode.rules.trees import accept_tree, accept_tree_greedy, branching_tree, children, depths, grow_tree

from test_loop_replay import cell_edge

PROMPT = (0, 1)
SHAPES = [(1,), (2,), (3,), (1, 1, 1), (2, 1), (2, 2), (3, 1)]


def tables(n_vocab, truncation, seed=0):
    base_p, base_q = kit.random_table(n_vocab, seed=30 + seed), kit.random_table(n_vocab, seed=40 + seed)
    return (lambda s: kit.truncate(base_p(s), **truncation)), (lambda s: kit.truncate(base_q(s), **truncation))


def target_law(p, depth, eos):
    return {k: v for k, v in kit.sequence_distribution(p, PROMPT, depth + 1, eos).items() if v}


@pytest.mark.parametrize("n_vocab", [3, 4, 5])
@pytest.mark.parametrize("truncation", [{}, {"top_k": 2}], ids=["none", "top_k2"])
@pytest.mark.parametrize("kind", ["sampled", "top-k"])
def test_a_tree_round_keeps_the_target_law_exactly(n_vocab, truncation, kind):
    """Every tree shape, with and without EOS: the round's law (continued by the target) is the target's, in fractions."""
    p, q = tables(n_vocab, truncation)
    expander = tt.sampled_expander if kind == "sampled" else tt.topk_expander
    for branching in SHAPES:
        for eos in (None, n_vocab - 1):
            got = tt.tree_round_distribution(p, expander(q, branching), PROMPT, len(branching), eos)
            assert got == target_law(p, len(branching), eos), (branching, eos)


@pytest.mark.parametrize("n_vocab", [3, 4])
@pytest.mark.parametrize("budget, max_children", [(2, 2), (4, 2), (5, 3), (6, 4)])
def test_a_dynamic_tree_round_keeps_the_target_law_exactly(n_vocab, budget, max_children):
    """EAGLE-2-style trees (npspec.decode.rules.trees.grow_tree: best first by cumulative draft probability), with and without EOS."""
    for seed in range(3):
        p, q = tables(n_vocab, {}, seed)
        for depth in (1, 2, 3):
            expander = tt.dynamic_expander(q, budget, max_children, depth)
            for eos in (None, n_vocab - 1):
                got = tt.tree_round_distribution(p, expander, PROMPT, depth, eos)
                assert got == target_law(p, depth, eos), (seed, depth, eos)


def test_grow_tree_expands_best_first():
    rows = {(): [Fraction(1, 2), Fraction(3, 10), Fraction(1, 5)], (0,): [Fraction(9, 10), Fraction(1, 10), 0],
            (1,): [Fraction(1, 3), Fraction(1, 3), Fraction(1, 3)], (0, 0): [1, 0, 0]}
    ids, parents = grow_tree(lambda path: rows.get(path, [1, 0, 0]), 4, 2, 3)
    # 0 (1/2), then 0 -> 0 (1/2 * 9/10), then 0 -> 0 -> 0 (9/20 * 1), then 1 (3/10 beats 0 -> 1's 1/20)
    assert (ids, parents) == ([0, 0, 0, 1], [-1, 0, 1, -1])
    assert grow_tree(lambda path: rows.get(path, [1, 0, 0]), 4, 2, 1) == ([0, 1], [-1, -1])  # depth 1: the 2 offered


@pytest.mark.parametrize("kind", ["sampled", "top-k"])
@pytest.mark.parametrize("branching", [(2,), (2, 1), (2, 2)])
def test_the_whole_tree_loop_keeps_the_target_law_with_eos_budget_and_context_cuts(kind, branching):
    """Every round of npspec's loop with a tree drafter (its depth cut by the budget and by n_ctx as the loop cuts
    it), enumerated in fractions: the law of the stopped output is the target's."""
    p, q = tables(3, {})
    expander = (tt.sampled_expander if kind == "sampled" else tt.topk_expander)(q, branching)
    for eos in (None, 2):
        for n_ctx in (None, len(PROMPT) + 3):
            for max_new_tokens in (1, 2, 4):
                want = {k: v for k, v in kit.sequence_distribution(p, PROMPT, max_new_tokens, eos, n_ctx).items() if v}
                for gamma in (1, 3):
                    got = tt.tree_loop_distribution(p, expander, branching, PROMPT, gamma, max_new_tokens, eos, n_ctx)
                    assert got == want, (eos, n_ctx, max_new_tokens, gamma)


# ---- the classic tree mistakes change the law


def stale_p(r, kids):
    """WRONG: tests every child against the target's original row (no residual between candidates)."""
    out, reach = [], Fraction(1)
    for j, (x, qrow) in enumerate(kids):
        a = min(1, Fraction(r[x]) / Fraction(qrow[x]))
        if a:
            out.append((reach * a, ("keep", j)))
        reach *= 1 - a
    if reach:
        out.append((reach, ("emit", tt._norm_residual(r, kids[-1][1]) if kids else list(r))))
    return out


def topk_with_full_q(q, branching):
    """WRONG: deterministic top-k children handed to the test as if drawn from the full q."""
    topk = tt.topk_expander(q, branching)

    def expand(ctx, depth):
        return [(prob, [(x, q(ctx)) for x, _ in kids]) for prob, kids in topk(ctx, depth)]
    return expand


def merged_duplicates(q, branching):
    """WRONG: i.i.d. children with a repeated token tested once (duplicates merged)."""
    sampled = tt.sampled_expander(q, branching)

    def expand(ctx, depth):
        return [(prob, [kid for i, kid in enumerate(kids) if kid[0] not in [k[0] for k in kids[:i]]])
                for prob, kids in sampled(ctx, depth)]
    return expand


@pytest.mark.parametrize("mistake", ["stale p", "top-k as samples", "merged duplicates"])
def test_the_classic_tree_mistakes_change_the_law(mistake):
    p, q = tables(3, {})
    branching = (2,)
    if mistake == "stale p":
        got = tt.tree_round_distribution(p, tt.sampled_expander(q, branching), PROMPT, 1, verify=stale_p)
    elif mistake == "top-k as samples":
        got = tt.tree_round_distribution(p, topk_with_full_q(q, branching), PROMPT, 1)
    else:
        got = tt.tree_round_distribution(p, merged_duplicates(q, branching), PROMPT, 1)
    assert got != target_law(p, 1, None)


# ---- npspec.decode.rules.trees.accept_tree makes the enumerated rule's decisions


def float_rows(rows):
    return [np.array([float(v) for v in row]) for row in rows]


def decide(r, kids, outcome):
    """Uniforms on the edges that make accept_tree's node-level loop reach `outcome` (as multi_candidate lists it):
    u = p/q itself rejects (strict test), the largest u below it keeps."""
    us = []
    for j, (x, qrow) in enumerate(kids):
        with np.errstate(divide="ignore"):
            ratio = float(r[x] / qrow[x])
        if outcome == ("keep", j):
            us.append(kit.ONE_BELOW if ratio >= 1 else float(np.nextafter(ratio, 0.0)))
            return us, None
        us.append(ratio)
        r = residual(r, qrow)
    return us, r


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_accept_tree_decides_as_the_multi_candidate_rule(seed, k):
    """A root with k candidates (i.i.d. draws and top-k), every outcome the rule allows driven on its edges."""
    p, q = tables(4, {}, seed)
    prow, qrow = p(PROMPT), q(PROMPT)
    rng = np.random.default_rng(seed)
    candidates = [list(rng.choice(4, size=k, p=[float(v) for v in qrow])), list(np.argsort(-np.array(qrow,
                                                                                                       dtype=float))[:k])]
    for c_ids in candidates:
        kids = [(int(x), qrow) for x in c_ids] if c_ids is candidates[0] else \
            [(int(x), [Fraction(int(i == x)) for i in range(4)]) for x in c_ids]
        fkids = [(x, float_rows([row])[0]) for x, row in kids]
        ids, q_rows = [x for x, _ in fkids], np.array([row for _, row in fkids])
        p_rows = np.array(float_rows([prow] + [p(PROMPT + (x,)) for x in ids]))
        outcomes = tt.multi_candidate(list(prow), kids)
        assert sum(prob for prob, _ in outcomes) == 1
        for _, outcome in outcomes:
            us, r = decide(p_rows[0], fkids, outcome)
            u_tests = np.array(us + [0.5] * (k - len(us)))
            if outcome[0] == "keep":
                path, _ = accept_tree(ids, [-1] * k, q_rows, p_rows, u_tests, 0.5)
                assert path == [outcome[1]]
            else:
                for y in np.flatnonzero(np.array([float(v) for v in outcome[1]]) > 0):
                    path, token = accept_tree(ids, [-1] * k, q_rows, p_rows, u_tests, cell_edge(r, int(y), True))
                    assert path == [] and token == y


def test_accept_tree_descends_and_takes_the_bonus_at_a_leaf():
    parents = branching_tree((2, 1))  # 0, 1 children of the root; 2 child of 0; 3 child of 1
    assert parents == [-1, -1, 0, 1] and depths(parents) == [1, 1, 2, 2]
    assert children(parents) == {-1: [0, 1], 0: [2], 1: [3], 2: [], 3: []}
    one = np.eye(3)
    ids = [0, 1, 2, 0]
    p = np.array([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.2, 0.3, 0.5]])
    # p(root) is one-hot on 1: node 0 (id 0) is rejected, node 1 (id 1) kept; after node 1, p says 2: node 3 (id 0)
    # is rejected, and the residual of p(node 1) without 0 is one-hot on 2
    path, token = accept_tree(ids, parents, one[ids], p, np.full(4, 0.5), 0.5)
    assert path == [1] and token == 2
    assert accept_tree_greedy(ids, parents, np.array([1, 0, 2, 2, 2])) == ([1], 2)
    assert accept_tree_greedy([0, 1, 2, 2], parents, np.array([1, 0, 2, 2, 1])) == ([1, 3], 1)  # deepest + after it


@pytest.mark.parametrize("branching", [(), (0, 1), (2, -1), (1.0,)])
def test_a_bad_branching_is_refused(branching):
    with pytest.raises(ValueError, match="counts >= 1 per depth"):
        branching_tree(branching)
