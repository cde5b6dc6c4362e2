"""Traversal verification (Weng et al., NeurIPS 2025, arXiv 2505.12398; npspec.decode.rules.accept_tree_traversal,
`--verify traversal`), proven by exact enumeration with the kit (npspec.testing.traversal): a round keeps the
target's law on every small tree and chain (children without replacement, top-k and i.i.d. children tested against
their own rows); it keeps at least as many drafts as the token-wise tree rule (RSD, multi-candidate) on every case
checked; on a chain its law is block verification's, decision for decision, not only in expectation (the paper's
Theorem 3.4 claims the expectation); the functions decide as the enumerated rule; temperature 0 is plain greedy; the
paper's example (its Figure 1 tree and the 1/2 against 2/3 of its introduction) is reproduced exactly.
"""

import itertools
from fractions import Fraction as F

import numpy as np
import pytest

from npspec import testing as kit
from npspec.cli import generate
from npspec.decode import RULES, speculative_generate
from npspec.decode.drafters import DistinctTreeDrafter, TreeDrafter
from npspec.decode.rules import accept_tree_traversal, block_accept, traversal_accept
from npspec.testing import blocks, multidraft as md, trees as tt, traversal as tv

from test_exact_match import cli, law_by_token
from test_trees_exact import PROMPT, SHAPES, tables, target_law

EXPANDERS = {"distinct": md.without_replacement_expander, "top-k": tt.topk_expander, "iid": tt.sampled_expander}


# ---- the registry and the command line

def test_traversal_is_registered_for_trees_and_chains():
    rule = RULES["traversal"]
    assert rule.chain is traversal_accept and rule.tree is accept_tree_traversal and rule.siblings == "distinct"
    assert "traversal" in generate.build_parser()._option_string_actions["--verify"].choices


# ---- (a) lossless, exactly

@pytest.mark.parametrize("n_vocab", [3, 4])
@pytest.mark.parametrize("truncation", [{}, {"top_k": 2}], ids=["none", "top_k2"])
@pytest.mark.parametrize("kind", ["distinct", "top-k", "iid"])
def test_a_traversal_round_keeps_the_target_law_exactly(n_vocab, truncation, kind):
    """Every tree shape (chains (1,) and (1, 1, 1) included), with and without EOS, in Fractions: the round's law
    continued by the target is the target's. i.i.d. children are tested against the row they were drawn from (the
    kit's rule); npspec's tree form takes children without replacement (or deterministic ones)."""
    p, q = tables(n_vocab, truncation)
    for branching in SHAPES:
        if n_vocab == 4 and kind == "iid" and len(branching) > 1 and max(branching) > 2:
            continue  # 4**3 * (4**1)**3 whole trees: covered at n_vocab 3
        for eos in (None, n_vocab - 1):
            got = tv.traversal_round_distribution(p, EXPANDERS[kind](q, branching), PROMPT, len(branching), eos)
            assert got == target_law(p, len(branching), eos), (branching, eos)


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_a_traversal_chain_keeps_the_target_law_on_every_small_case(gamma):
    """Every constant pair of small_cases (zeros, one-hot rows, p == q, disjoint supports) and 8 context-dependent
    pairs: a chain of gamma drafts from q, exactly."""
    n = 0
    for p, q in [*kit.small_cases(), *blocks.context_cases()]:
        pt, qt = (p, q) if callable(p) else (kit.constant_table(p), kit.constant_table(q))
        want = {k: v for k, v in kit.sequence_distribution(pt, (0,), gamma + 1).items() if v}
        assert tv.traversal_round_distribution(pt, tt.sampled_expander(qt, (1,) * gamma), (0,), gamma) == want
        n += 1
    assert n == len(list(kit.small_cases())) + 8


RIGHT = tv.after_rejection


@pytest.mark.parametrize("kind, branching", [("distinct", (2,)), ("distinct", (2, 1)), ("top-k", (2, 2)),
                                             ("distinct", (1, 1))])
def test_the_whole_traversal_loop_keeps_the_target_law_with_eos_budget_and_context_cuts(kind, branching):
    """npspec's loop (each round's depth clamped by the budget and n_ctx), exactly, with and without EOS."""
    p, q = tables(3, {})
    expand = EXPANDERS[kind](q, branching)
    for eos in (None, 2):
        for n_ctx in (None, len(PROMPT) + 3):
            for max_new_tokens in (1, 2, 3):
                target = {k: v for k, v in kit.sequence_distribution(p, PROMPT, max_new_tokens, eos, n_ctx).items()
                          if v}
                for gamma in (1, 2):
                    got = tt.tree_loop_distribution(p, expand, branching, PROMPT, gamma, max_new_tokens, eos, n_ctx,
                                                    outcomes=tv.traversal_round_outcomes)
                    assert got == target, (eos, n_ctx, max_new_tokens, gamma)


def no_reweighting(w, r, qrow):
    """A WRONG update: the residual row, but the weight left as it was (the paper's p'_alpha forgotten)."""
    return w, RIGHT(w, r, qrow)[1]


def token_residual(w, r, qrow):
    """A WRONG update: the token rule's residual norm(max(0, r - q)) and weight 1, as if verified top down."""
    return RIGHT(1, r, qrow)


@pytest.mark.parametrize("wrong", [no_reweighting, token_residual], ids=lambda f: f.__name__)
def test_the_kit_catches_a_wrong_update(wrong, monkeypatch):
    p, q = tables(3, {})
    want = target_law(p, 2, None)
    assert tv.traversal_round_distribution(p, md.without_replacement_expander(q, (2, 1)), PROMPT, 2) == want
    monkeypatch.setattr(tv, "after_rejection", wrong)
    assert tv.traversal_round_distribution(p, md.without_replacement_expander(q, (2, 1)), PROMPT, 2) != want


def test_sibling_rows_are_needed_for_children_without_replacement():
    """Children drawn without replacement but tested against the parent's whole row: the law moves."""
    p, q = tables(3, {})

    def parent_rows(ctx, depth):
        return [(cp, [(x, q(ctx)) for x, _ in kids]) for cp, kids in md.without_replacement(q(ctx), 2)] \
            if depth < 1 else [(1, [])]
    assert tv.traversal_round_distribution(p, parent_rows, PROMPT, 1) != target_law(p, 1, None)


# ---- (b) what it keeps: at least the token-wise tree rule's; on a chain, block verification's law

@pytest.mark.parametrize("kind", ["distinct", "top-k", "iid"])
def test_traversal_keeps_at_least_as_much_as_the_token_wise_tree_rule(kind):
    """E[nodes kept] of a round, exactly, against multi-candidate on the same children (RSD for children without
    replacement): never less on any small case (n_vocab 2..3, denominators up to 3) and 4 context-dependent pairs,
    shapes (2,), (1, 1), (2, 1), (1, 2), (2, 2); strictly more on some; equal on every depth-1 tree, and equal on
    every top-k tree: with one-hot q both keep each path with its whole target probability, the most any can."""
    strictly = checked = 0
    pairs = [*kit.small_cases(3, 3), *blocks.context_cases(4)]
    for (p, q), branching in itertools.product(pairs, [(2,), (1, 1), (2, 1), (1, 2), (2, 2)]):
        pt, qt = (p, q) if callable(p) else (kit.constant_table(p), kit.constant_table(q))
        expand = EXPANDERS[kind](qt, branching)
        ours = tv.traversal_expected_accepted(pt, expand, (0,), len(branching))
        theirs = md.tree_expected_accepted(pt, expand, (0,), len(branching))
        assert ours >= theirs, (p, q, branching)
        assert ours == theirs or len(branching) > 1
        strictly += ours > theirs
        checked += 1
    assert checked == 5 * (len(list(kit.small_cases(3, 3))) + 4) and (strictly == 0) == (kind == "top-k")


def chain_kids(q_rows, d):
    kids = []
    for x, row in zip(reversed(d), reversed(q_rows)):
        kids = [(x, row, kids)]
    return kids


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_on_a_chain_the_law_is_block_verifications_draft_by_draft(gamma):
    """For every draft block d of every small case and context pair: the law of (n kept, emitted token) given d is
    blocks.block_verification_rule's, exactly, so the two have one law, not only one expectation (Theorem 3.4)."""
    n = 0
    for p, q in [*kit.small_cases(3, 3), *blocks.context_cases(4)]:
        pt, qt = (p, q) if callable(p) else (kit.constant_table(p), kit.constant_table(q))
        for d in itertools.product(range(len(pt((0,)))), repeat=gamma):
            q_rows = [qt((0,) + d[:i]) for i in range(gamma)]
            if not all(row[x] for row, x in zip(q_rows, d)):
                continue  # never drafted
            p_rows = [pt((0,) + d[:i]) for i in range(gamma + 1)]
            got, rejected = tv.traversal_decisions(pt, (0,), chain_kids(q_rows, d))
            assert rejected == 0
            assert law_by_token([(a, len(kept), row) for a, kept, row in got]) == \
                law_by_token(blocks.block_verification_rule(p_rows, q_rows, d)), (p, q, d)
            n += 1
    assert n > 100


def test_traversal_accept_is_block_accept_decision_for_decision():
    """Random float rows (with zeros) and uniforms, gamma 1..5: the same (n kept, token) every time."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        k, v = int(rng.integers(1, 6)), int(rng.integers(2, 6))
        p = rng.dirichlet(np.ones(v), size=k + 1) * (rng.random((k + 1, v)) > 0.2)
        p[:, 0] += 1e-3
        p /= p.sum(axis=1, keepdims=True)
        q = rng.dirichlet(np.ones(v), size=k)
        d = np.array([rng.choice(v, p=row) for row in q])
        u, uf = rng.random(k), float(rng.random())
        assert traversal_accept(d, p, q, u, uf) == block_accept(d, p, q, u, uf)


def flat(kids, parent=-1, ids=None, parents=None, rows=None, paths=None, path=()):
    """A kit tree as accept_tree_traversal's arrays, depth first: ids, parents, rows (q), and each node's id path."""
    ids, parents, rows, paths = ([] if v is None else v for v in (ids, parents, rows, paths))
    for x, row, sub in kids:
        ids.append(x), parents.append(parent), rows.append(row), paths.append(path + (x,))
        flat(sub, len(ids) - 1, ids, parents, rows, paths, path + (x,))
    return ids, parents, rows, paths


def thresholds(p, ctx, kids, w=1, out=None):
    """Each node's test weight by id path (traversal_decisions' walk, every earlier test rejecting)."""
    out = {} if out is None else out
    r = list(p(ctx))
    for x, qrow, sub in kids:
        wc = tv.child_weight(w, r[x], qrow[x])
        out[ctx + (x,)] = thresholds(p, ctx + (x,), sub, wc, out)[ctx + (x,)]
        w, r = tv.after_rejection(w, r, qrow)
    out[ctx] = w
    return out


@pytest.mark.parametrize("branching", [(2,), (2, 1), (1, 2), (1, 1, 1)])
def test_accept_tree_traversal_decides_as_the_enumerated_rule(branching):
    """Every tree drawn without replacement on a 3-token table: the function integrated over its uniforms (each
    test on both sides of its node's threshold, u_final at every CDF breakpoint) has the kit's law of (kept ids,
    token) to float64 rounding. The function is given each node's row before excluding siblings."""
    p, q = tables(3, {})
    for _, kids in tv.whole_trees(md.without_replacement_expander(q, branching), PROMPT, 0, len(branching)):
        exact = {}
        got_rows, _ = tv.traversal_decisions(p, PROMPT, kids)
        for a, kept, row in got_rows:
            for y, ry in enumerate(row):
                if a * ry:
                    exact[kept, y] = exact.get((kept, y), 0) + a * ry
        ids, parents, _, paths = flat(kids)
        base = np.array([[float(v) for v in q(PROMPT + path[:-1])] for path in paths])
        prows = np.array([[float(v) for v in p(PROMPT + path)] for path in [()] + paths])
        t = thresholds(p, PROMPT, kids)
        cells = blocks._cells([[float(v) for v in row] for _, _, row in got_rows])
        law = {}
        for keep in itertools.product((True, False), repeat=len(ids)):
            weight, us = 1.0, []
            for node, k in zip(paths, keep):
                tn = float(t[PROMPT + node])
                weight *= tn if k else 1 - tn
                us.append(tn / 2 if k else (tn + 1) / 2)
            if not weight:
                continue
            for lo, hi in cells:
                path, token = accept_tree_traversal(ids, parents, base, prows, np.array(us), blocks._mid(lo, hi))
                key = (tuple(ids[i] for i in path), token)
                law[key] = law.get(key, 0) + weight * (hi - lo)
        assert set(law) == set(exact) and max(abs(law[k] - float(exact[k])) for k in exact) < 1e-12


# ---- (c) the paper's example

def test_the_papers_example_two_thirds_against_one_half():
    """Weng et al.'s introduction: a parent kept with probability 1/2 and its child's ratio 4/3. Token-wise the
    pair is kept with probability 1/2 * 1; traversal keeps it with min(1/2 * 4/3, 1) = 2/3."""
    p0, q0 = [F(1, 4), F(3, 4)], [F(1, 2), F(1, 2)]  # p0(0) / q0(0) = 1/2
    p1, q1 = [F(2, 3), F(1, 3)], [F(1, 2), F(1, 2)]  # p1(0) / q1(0) = 4/3
    table = {(9,): p0, (9, 0): p1}
    got, _ = tv.traversal_decisions(lambda s: table.get(tuple(s), p0), (9,), chain_kids([q0, q1], (0, 0)))
    assert sum(a for a, kept, _ in got if kept == (0, 0)) == F(2, 3)
    token = blocks.token_block_rule([p0, p1, p0], [q0, q1], (0, 0))
    assert sum(a for a, n, _ in token if n == 2) == F(1, 2)


class Recorder:
    """u_tests that reject every test (u = ONE_BELOW) and record which node each test was for."""

    def __init__(self):
        self.order = []

    def __getitem__(self, node):
        self.order.append(int(node))
        return kit.ONE_BELOW


def test_the_papers_figure_1_tree_is_traversed_leaves_up():
    """Figure 1's tree, X1, X2 children of the root, X3, X4 of X1, X5 of X2 (nodes 0..4): the tests come in the
    order X3, X4, X1, X5, X2, each parent only once its children are rejected; with every test rejected the round
    emits a sample of the root's residual."""
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(6), size=6), rng.dirichlet(np.ones(6), size=5)
    u = Recorder()
    path, _ = accept_tree_traversal([0, 1, 2, 3, 4], [-1, -1, 0, 0, 1], q, p, u, 0.5)
    assert path == [] and u.order == [2, 3, 0, 4, 1]


# ---- (d) through the API and the CLI

def test_greedy_traversal_is_plain_greedy_for_chains_and_trees():
    table = kit.random_table(5, seed=3)
    target = kit.TableModel(table, 5, 40)
    plain = speculative_generate(target, None, [1, 2], 12, temperature=0).ids
    for draft in (target, DistinctTreeDrafter(target, (2, 1)), TreeDrafter(target, (2, 2), "top-k")):
        got = speculative_generate(target, draft, [1, 2], 12, gamma=3, temperature=0, verify="traversal")
        assert got.ids == plain
        sampled = speculative_generate(target, draft, [1, 2], 12, gamma=3, rng=4, verify="traversal")
        assert len(sampled.ids) == 12 and sampled.stats.accepted > 0
    with pytest.raises(ValueError, match="lossless only for children drawn without replacement"):
        speculative_generate(target, TreeDrafter(target, (2,)), [1, 2], 4, gamma=1, verify="traversal")


def test_the_cli_runs_traversal_on_a_chain_and_a_tree():
    greedy = cli("--verify", "traversal", "--temperature", "0")
    assert greedy["ids"] == cli("--gamma", "0", "--temperature", "0")["ids"]
    sampled = cli("--verify", "traversal", "--seed", "2", "--tree", "2,1")  # children without replacement
    assert len(sampled["ids"]) == 24 and sampled["stats"]["accepted"] > 0
