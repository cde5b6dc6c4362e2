"""npspec.testing.gap: the optimal-transport ceiling of a whole drafted tree, exactly, and every lossless rule at or
below it (notes/derivation.md, claim 14); the committed tables are what `python -m bench.gap` writes."""

import itertools
from fractions import Fraction as F

import pytest

from conftest import ROOT
from npspec.testing import blocks, constant_table, multidraft, random_table, small_cases
from npspec.testing.gap import GAP_RULES, node_gap, tree_gap, tree_law, tree_ot_bound
from npspec.testing.trees import sampled_expander

from bench import common
from bench import gap as bench_gap

SUN_P, SUN_Q = [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]  # Sun et al. 2025's two-token example
CASES = list(small_cases(3, 3))
CONTEXT = blocks.context_cases(4)


@pytest.mark.parametrize("k", [2, 3])
def test_the_tree_ceiling_of_one_node_is_the_ot_bound(k):
    for p, q in CASES:
        for name, (factory, _) in GAP_RULES.items():
            bound = tree_ot_bound(constant_table(p), factory(constant_table(q), (k,)), (0,), 1)
            assert bound == multidraft.ot_bound(p, q, k, replacement=factory is sampled_expander), (p, q, name)


def test_the_tree_ceiling_of_a_chain_is_the_joint_bound():
    for p, q in [*[(constant_table(p), constant_table(q)) for p, q in CASES[::7]], *CONTEXT]:
        for depth in (1, 2, 3):
            expand = sampled_expander(q, (1,) * depth)
            assert tree_ot_bound(p, expand, (0,), depth) == blocks.joint_bound(p, q, (0,), depth)


def test_the_tree_law_draws_the_whole_tree():
    law = tree_law(sampled_expander(constant_table(SUN_Q), (2,)), (0,), 1)
    # two i.i.d. children: {0} with 4/9, {1} with 1/9, {0, 1} with 2 * 2/9
    assert law == {frozenset({(0,)}): F(4, 9), frozenset({(1,)}): F(1, 9), frozenset({(0,), (1,)}): F(4, 9)}
    law = tree_law(sampled_expander(constant_table(SUN_Q), (1, 1)), (0,), 2)
    assert sum(law.values()) == 1 and all(len(paths) == 2 for paths in law)  # a path and its prefix


@pytest.mark.parametrize("k", [2, 3])
def test_every_rule_keeps_at_most_its_ceiling_at_a_node(k):
    below = 0
    for p, q in CASES:
        for name, kept, bound in node_gap(p, q, k):
            assert 0 <= kept <= bound <= 1, (p, q, name)
            below += kept < bound
    assert below > 0  # the ceiling is not simply what the rules keep


@pytest.mark.parametrize("branching", [(1, 1), (1, 1, 1), (2, 1), (2, 2), (3, 1)])
def test_every_rule_keeps_at_most_its_ceiling_in_a_whole_tree(branching):
    for p, q in [(constant_table(SUN_P), constant_table(SUN_Q)), *CONTEXT[:2]]:
        rows = tree_gap(p, q, branching)
        assert len(rows) == len(GAP_RULES) + all(k == 1 for k in branching)
        for name, kept, bound in rows:
            assert 0 <= kept <= bound <= len(branching), (branching, name)


def test_p_equal_to_q_keeps_the_whole_ceiling():
    table = random_table(3, seed=7)
    for branching in [(1, 1), (2, 1), (2, 2)]:
        for name, kept, bound in tree_gap(table, table, branching):
            assert kept == bound == len(branching), (branching, name)


def test_sun_et_als_example_with_its_ceiling():
    """Block verification's paper, section 1: token 10/9, block 11/9, the joint bound 12/9 (the tree's ceiling)."""
    rows = {name: (kept, bound) for name, kept, bound in tree_gap(constant_table(SUN_P), constant_table(SUN_Q), (1, 1))}
    assert rows["i.i.d. children, token tree rule"] == (F(10, 9), F(12, 9))
    assert rows["block verification (chain)"] == (F(11, 9), F(12, 9))


def test_rsd_reaches_its_ceiling_where_it_draws_every_token():
    """RSD's k >= n_vocab children are every token: the node always keeps one (the claim 11 example, 1)."""
    for p, q in CASES:
        if all(q) and len(q) <= 3:
            assert dict((n, (a, b)) for n, a, b in node_gap(p, q, len(q)))["RSD (without replacement)"] == (1, 1)


def test_tree_gap_refuses_an_empty_tree():
    with pytest.raises(ValueError, match="branching is empty"):
        tree_gap(constant_table(SUN_P), constant_table(SUN_Q), ())


def _committed(name):
    rows, meta = common.read_table(ROOT / "bench" / "results" / "gap-exact" / f"{name}.csv")
    assert meta["command"] == "python -m bench.gap --out bench/results/gap-exact"
    return rows


def test_the_committed_gap_tables_are_what_bench_gap_writes():
    """Stale? Regenerate with the command in the table's header: python -m bench.gap --out bench/results/gap-exact."""
    node = _committed("gap_node")
    assert _close(node, bench_gap.node_rows(bench_gap.NODE_CASES, (2, 3)))
    tree = _committed("gap_tree")
    assert _close(tree, bench_gap.tree_rows(bench_gap.tree_cases(False), bench_gap.TREES))
    for row in itertools.chain(node, tree):
        assert F(row["kept"]) <= F(row["ceiling"]), row


def _close(committed, fresh):
    """Every exact column equal as text, the float column to 1e-12."""
    assert len(committed) == len(fresh)
    for old, new in zip(committed, fresh):
        for key, value in new.items():
            if isinstance(value, float):
                assert abs(float(old[key]) - value) < 1e-12, (key, old, new)
            else:
                assert old[key] == str(value), (key, old, new)
    return True


def test_the_quoted_spectr_gbv_expression_against_the_ceiling():
    """notes/reading.md: a third party's quote of SpecTr-GBV's Theorem 5.3 at one position exceeds the one-node
    ceiling as written, and stays at or below it with p and q exchanged (706 cases, equal on 510)."""
    def quoted(a, b, k):  # sum_x b(x) [1 - (1 - min(a(x) / b(x), 1))^k]
        return sum(F(y) * (1 - (1 - min(F(x) / F(y), 1)) ** k) for x, y in zip(a, b) if y)

    cases = [(p, q, k) for p, q in small_cases(3, 4) for k in (2, 3)]
    bounds = [multidraft.ot_bound(p, q, k) for p, q, k in cases]
    as_written = [quoted(p, q, k) for p, q, k in cases]
    exchanged = [quoted(q, p, k) for p, q, k in cases]
    assert len(cases) == 706 and any(a > b for a, b in zip(as_written, bounds))
    assert all(a <= b for a, b in zip(exchanged, bounds)) and sum(a == b for a, b in zip(exchanged, bounds)) == 510


@pytest.mark.parametrize("branching", [(1, 1), (2, 1), (2, 2), (3, 1)])
def test_traversal_keeps_at_least_the_node_by_node_rule_on_the_same_drafts_and_at_most_their_ceiling(branching):
    for p, q in [(constant_table(SUN_P), constant_table(SUN_Q)), *CONTEXT[:2]]:
        rows = {name: (kept, bound) for name, kept, bound in tree_gap(p, q, branching)}
        for drafts, node_by_node in (("without replacement", "RSD (without replacement)"),
                                     ("i.i.d. children", "i.i.d. children, token tree rule")):
            kept, bound = rows[f"traversal ({drafts})"]
            assert rows[node_by_node][0] <= kept <= bound == rows[node_by_node][1], (branching, drafts)
