"""npspec.testing.lossiness: the exact total variation of a rule's round from the target's law; 0 for every npspec
rule, exact positive values for lossy ones on hand-checkable cases (notes/derivation.md, claim 14)."""

import math
from fractions import Fraction as F

import pytest

from conftest import ROOT
from npspec.decode import RULES, get_rule
from npspec.testing import blocks, leviathan_rule, npspec_rule, small_cases
from npspec.testing.multidraft import without_replacement_expander
from npspec.testing.trees import multi_candidate, sampled_expander
from npspec.testing.lossy import (lossiness, no_residual_rule, relaxed_topk_rule, typical_acceptance_rule,
                                  typical_threshold)

from bench import common
from bench import gap as bench_gap

CASES = list(small_cases(3, 3))


@pytest.mark.parametrize("rule", [blocks.block_verification_rule, blocks.token_block_rule, blocks.exact_match_rule],
                         ids=["block", "token", "exact-match"])
def test_lossiness_is_exactly_zero_for_npspecs_rules_stated_in_fractions(rule):
    got = lossiness(rule, gammas=(1, 2, 3), block=True)
    assert got.tv == 0 and isinstance(got.tv, (int, F)) and len(got.by_case) == 3 * len(list(small_cases()))
    assert lossiness(rule, cases=blocks.context_cases(4), gammas=(2,), block=True).tv == 0
    assert lossiness(leviathan_rule, gammas=(1, 2)).tv == 0
    assert lossiness(npspec_rule, cases=CASES, gammas=(1, 2)).tv < 1e-12  # npspec's float64 token rule


@pytest.mark.parametrize("name", sorted(RULES))
def test_lossiness_of_every_registered_rule_is_zero_to_rounding(name):
    """Every --verify choice, its own float64 function integrated over its uniforms (blocks.function_rule)."""
    got = lossiness(blocks.function_rule(RULES[name].chain, draws=True), cases=CASES, gammas=(1, 2), block=True)
    assert got.tv < 1e-12


def test_lossy_rules_are_never_a_verify_choice():
    for name in ("typical", "typical-acceptance", "relaxed", "top-k"):
        with pytest.raises(ValueError, match="must be one of"):
            get_rule(name)


def test_medusa_typical_acceptance_by_hand():
    # uniform over 2 ids: H = ln 2 (less the code's 1e-5), alpha exp(-H) = 0.15, so the threshold is 0.09
    assert typical_threshold([F(1, 2), F(1, 2)]) == 0.09
    # a peaked row: H = 0.056..., alpha exp(-H) = 0.28, above 0.09
    assert typical_threshold([F(99, 100), F(1, 100)]) == 0.09
    # four equal ids and an alpha of 0.3: 0.3 / 4 = 0.075 (to the 1e-5) is below 0.09
    assert math.isclose(typical_threshold([F(1, 4)] * 4), 0.075, rel_tol=1e-4)
    rule = typical_acceptance_rule()
    # draft always 1 and p(1) = 1/4 > 0.09: always kept, so the first token is 1; the target gives it 1/4: TV 3/4
    assert lossiness(rule, cases=[([F(3, 4), F(1, 4)], [0, 1])], gammas=(1,)).tv == F(3, 4)
    # p(1) = 1/20 < 0.09: always rejected for the argmax 0, which the target gives 19/20: TV 1/20
    assert lossiness(rule, cases=[([F(19, 20), F(1, 20)], [0, 1])], gammas=(1,)).tv == F(1, 20)
    # p = (1/2, 1/3, 1/6) against q = (1/6, 1/3, 1/2): every p(x) > 0.09, every draft kept, the first token ~ q
    assert lossiness(rule, cases=[bench_gap.TOKEN_CASE], gammas=(1,)).tv == F(1, 3)


def test_relaxed_top_k_by_hand():
    flat, zero = [F(1, 3)] * 3, [1, 0, 0]
    # draft always 0, the target's top-1 (ties to the lower id): always kept where the target gives 1/3: TV 2/3
    assert lossiness(relaxed_topk_rule(1), cases=[(flat, zero)], gammas=(1,)).tv == F(2, 3)
    # top-2 keeps an id the target never emits: p = (1, 0), the draft always 1
    assert lossiness(relaxed_topk_rule(2), cases=[([1, 0], [0, 1])], gammas=(1,)).tv == 1
    # p == q one-hot: nothing to lose
    assert lossiness(relaxed_topk_rule(1), cases=[([1, 0], [1, 0])], gammas=(1, 2)).tv == 0


def test_the_no_residual_mistake_by_hand():
    """p = (2/3, 1/3), the draft always 0: kept with 2/3, else a sample of p, so P(0 first) = 2/3 + 1/3 * 2/3 = 8/9
    against 2/3 (TV 2/9); two drafts: (0, 0) 20/27, (0, 1) 4/27, (1, 0) 2/27, (1, 1) 1/27 against 12, 6, 6, 3 / 27."""
    case = [([F(2, 3), F(1, 3)], [1, 0])]
    assert lossiness(no_residual_rule, cases=case, gammas=(1,)).tv == F(2, 9)
    assert lossiness(no_residual_rule, cases=case, gammas=(2,)).tv == F(8, 27)


def test_lossiness_reports_the_worst_case_and_the_mean():
    got = lossiness(no_residual_rule, cases=[([F(2, 3), F(1, 3)], [1, 0]), ([F(1, 2)] * 2, [F(1, 2)] * 2)],
                    gammas=(1, 2))
    assert (got.tv, got.p, got.gamma) == (F(8, 27), [F(2, 3), F(1, 3)], 2)
    assert got.mean == (F(2, 9) + F(8, 27)) / 4  # p == q loses nothing: a rejection never happens
    with pytest.raises(ValueError, match="no case"):
        lossiness(no_residual_rule, cases=[])


def test_the_committed_lossiness_table_is_what_bench_gap_writes():
    """Stale? Regenerate with python -m bench.gap --out bench/results/gap-exact."""
    rows, meta = common.read_table(ROOT / "bench" / "results" / "gap-exact" / "lossiness.csv")
    assert meta["command"] == "python -m bench.gap --out bench/results/gap-exact"
    fresh = bench_gap.lossy_rows(False)
    assert len(rows) == len(fresh)
    for old, new in zip(rows, fresh):
        for key, value in new.items():
            assert (abs(float(old[key]) - value) < 1e-12) if isinstance(value, float) else old[key] == str(value)
    assert rows[0]["worst TV, small cases"] == "0" and all(F(r["worst TV, small cases"]) > 0 for r in rows[1:])


def test_the_no_residual_mistake_costs_half_the_distance_from_min_to_beta_p():
    """One draft: the first token's law is min(p, q) + (1 - beta) p, so the TV is 1/2 sum |min(p, q) - beta p|."""
    for p, q in CASES:
        beta = sum(min(F(a), F(b)) for a, b in zip(p, q))
        want = sum(abs(min(F(a), F(b)) - beta * F(a)) for a, b in zip(p, q)) / 2
        assert lossiness(no_residual_rule, cases=[(p, q)], gammas=(1,)).tv == want, (p, q)


def test_typical_acceptance_that_keeps_every_draft_costs_the_whole_distance():
    """Where every id q can draw has p above Medusa's threshold, each draft is kept: the round emits q's token,
    at TV(p, q) = 1 - beta from the target, the most a first token can be off given q."""
    checked, rule = 0, typical_acceptance_rule()
    for p, q in CASES:
        if all(rule(p, q, x)[0] == 1 for x in range(len(q)) if q[x]):
            checked += 1
            beta = sum(min(F(a), F(b)) for a, b in zip(p, q))
            assert lossiness(rule, cases=[(p, q)], gammas=(1,)).tv == 1 - beta, (p, q)
    assert checked >= 20


@pytest.mark.parametrize("branching", [(2,), (2, 1), (3,)])
def test_lossiness_of_the_tree_rules_is_exactly_zero(branching):
    """Claim 9's rule on i.i.d. children and RSD's children; and testing against p, not the running residual, is
    lossy (claim 9's classic mistake)."""
    cases = [*CASES[::5], *blocks.context_cases(2)]
    for factory in (sampled_expander, without_replacement_expander):
        assert lossiness(multi_candidate, cases=cases, tree=(factory, branching)).tv == 0
    assert lossiness(against_p, cases=cases, tree=(sampled_expander, branching)).tv > 0


def against_p(r, kids):
    """Claim 9's classic mistake: every child tested against the node's p, never the running residual."""
    out, reach = [], F(1)
    for j, (x, qrow) in enumerate(kids):
        a = min(1, F(r[x]) / F(qrow[x])) if qrow[x] else F(0)
        if a:
            out.append((reach * a, ("keep", j)))
        reach *= 1 - a
        if not reach:
            return out
    rest = [max(0, F(a) - F(b)) for a, b in zip(r, kids[-1][1])] if kids else []
    return out + [(reach, ("emit", [v / sum(rest) for v in rest] if sum(rest) else list(r)))]
