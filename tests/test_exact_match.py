"""Exact-match ("strict") verification (npspec.decode.rules.exact_match_accept, `--verify exact-match`), proven by
exact enumeration with the kit: the rule as probabilities (blocks.exact_match_rule) keeps the target's law on every
small case and on the whole loop; the function itself decides as that rule (blocks.function_rule, draws=True); a
draft is kept with probability exactly sum_x p(x) q(x), never more than the token rule's sum_x min(p(x), q(x)), equal
only when the supports are disjoint or one row is one-hot; temperature 0 is plain greedy; trees are refused.
"""

import io
import itertools
import json
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given

from npspec.cli import generate
from npspec import testing as kit
from npspec.decode import RULES, accept, speculative_generate
from npspec.decode.drafters import TreeDrafter
from npspec.decode.rules import exact_match_accept
from npspec.testing import blocks

from test_one_step import SEQ_PROMPT, TRUNCATIONS, tables

PROMPT = (0,)
PAPER_P, PAPER_Q = [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]  # Sun et al.'s example (tests/test_block_verify.py)


def resample_rule(p_rows, q_rows, d):
    """A WRONG strict rule: at the first mismatch it draws the token again from the whole row p_i (d_i included),
    as if the rejected sample were forgotten; the kit must catch it."""
    return [(prob, n, list(p_rows[n])) for prob, n, _ in blocks.exact_match_rule(p_rows, q_rows, d)]


def keep_on_draft_rule(p_rows, q_rows, d):
    """A WRONG strict rule: it compares the draft with a second draft sample instead of the target's (kept with
    probability q_i(d_i)), then emits the target's row at the first mismatch."""
    out, reach = [], 1
    for i, x in enumerate(d):
        out.append((reach * (1 - q_rows[i][x]), i, list(p_rows[i])))
        reach *= q_rows[i][x]
    return out + [(reach, len(d), list(p_rows[len(d)]))]


def chain_kept(p, q, prompt, gamma, keep):
    """E[drafts kept] of a chain rule that tests each draft x on its own with probability keep(p_row, q_row, x),
    by the recursion sum_x q(x) keep(x) (1 + E after x): the definition the kit's enumeration must meet."""
    if gamma == 0:
        return 0
    prow, qrow = p(tuple(prompt)), q(tuple(prompt))
    return sum(qrow[x] * keep(prow, qrow, x) * (1 + chain_kept(p, q, tuple(prompt) + (x,), gamma - 1, keep))
               for x in range(len(qrow)) if qrow[x])


def dot(p, q):
    return sum(a * b for a, b in zip(p, q))


def overlap(p, q):
    return sum(min(a, b) for a, b in zip(p, q))


# ---- the registry

def test_exact_match_is_registered_for_chains_only():
    rule = RULES["exact-match"]
    assert rule.chain is exact_match_accept and rule.tree is None and rule.siblings == "iid"
    assert "exact-match" in generate.build_parser()._option_string_actions["--verify"].choices


# ---- (a) lossless, exactly

def test_exact_match_keeps_the_target_law_on_every_small_case():
    """Every pair of the kit's small cases (zeros, one-hot rows, p == q, disjoint supports) and its 8
    context-dependent pairs, gamma 1, 2, 3, in Fractions (tolerance 0)."""
    report = blocks.check_block_rule(blocks.exact_match_rule, gammas=(1, 2, 3))
    assert report.ok and report.tol == 0 and report.cases == len(list(kit.small_cases())) + 8, str(report)


@pytest.mark.parametrize("n_vocab", [3, 4])
@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=["none", "top_k2", "top_p2/3", "top_k3_top_p.9"])
def test_exact_match_keeps_the_target_law_on_the_whole_loop(n_vocab, truncation):
    """The whole loop, exactly, on test_one_step's context-dependent tables: gamma 1..3, max_new_tokens 1..3, with
    and without EOS, with n_ctx cutting, both gamma schedules."""
    p, q = tables(n_vocab, truncation)
    checked = 0
    for eos in (None, n_vocab - 1):
        for n_ctx in (None, len(SEQ_PROMPT) + 2):
            for max_new_tokens in range(1, 4):
                target = kit.sequence_distribution(p, SEQ_PROMPT, max_new_tokens, eos, n_ctx)
                for gamma, schedule in itertools.product((1, 2, 3), ("constant", "heuristic")):
                    got = blocks.block_distribution(p, q, SEQ_PROMPT, gamma, max_new_tokens, eos, n_ctx,
                                                    rule=blocks.exact_match_rule, schedule=schedule)
                    assert got == target, (eos, n_ctx, max_new_tokens, gamma, schedule)
                    checked += 1
    assert checked == 2 * 2 * 3 * 3 * 2


@pytest.mark.parametrize("wrong", [resample_rule, keep_on_draft_rule])
def test_the_kit_catches_a_wrong_strict_rule(wrong):
    report = blocks.check_block_rule(wrong, gammas=(1, 2))
    assert not report.ok and report.got is not None and report.got != report.expected


def law_by_token(outcomes):
    """{(n, token): probability} of a block rule's [(probability, n, row)]."""
    law = {}
    for prob, n, row in outcomes:
        for y, ry in enumerate(row):
            if prob * ry:
                law[n, y] = law.get((n, y), 0) + prob * ry
    return law


def test_exact_match_accept_decides_as_the_exact_rule():
    """The function, integrated over its uniforms (u_tests also cut at p_i's CDF breakpoints: it samples p_i with
    them), on 120 small cases over 3 tokens, gamma 1..3: the target's law to float64 rounding; and its law
    (n kept, token) equals blocks.exact_match_rule's on every draft pair of the paper's example."""
    rule = blocks.function_rule(exact_match_accept, draws=True)
    cases = [(p, q) for p, q in kit.small_cases() if len(p) == 3][:120]
    report = blocks.check_block_rule(rule, cases=cases, gammas=(1, 2, 3))
    assert report.ok and report.tol == 1e-12, str(report)
    for d in itertools.product(range(2), repeat=2):
        exact = law_by_token(blocks.exact_match_rule([PAPER_P] * 3, [PAPER_Q] * 2, d))
        got = law_by_token(rule([[float(x) for x in PAPER_P]] * 3, [[float(x) for x in PAPER_Q]] * 2, d))
        assert set(got) == set(exact) and max(abs(got[k] - exact[k]) for k in exact) <= 1e-12


def test_without_the_draws_cuts_the_integration_misses_the_rule():
    """function_rule's draws=True is needed: with the token rule's cuts only, the midpoints miss p's breakpoints and
    the integrated law is not the target's (so the test above can fail)."""
    report = blocks.check_block_rule(blocks.function_rule(exact_match_accept), gammas=(1,),
                                     cases=[([F(1, 3), F(1, 3), F(1, 3)], [F(1, 2), F(1, 2), 0])])
    assert not report.ok


@given(kit.probability_pairs(max_size=4))
def test_exact_match_accept_keeps_the_target_law_on_random_rows(pq):
    """Property: float rows with zeros, one-hot rows, p == q and zero-mass residuals."""
    p, q = pq
    report = blocks.check_block_rule(blocks.function_rule(exact_match_accept, draws=True),
                                     cases=[(list(p), list(q))], gammas=(1, 2))
    assert report.ok, str(report)


def test_one_hot_rows_decide_as_the_token_rule_for_every_uniform():
    """Greedy rows: the target's sample is its argmax whatever the uniform, so exact-match and the token rule agree."""
    eye = np.eye(3)
    for d in itertools.product(range(3), repeat=2):
        for best in itertools.product(range(3), repeat=3):
            p, q = eye[list(best)], eye[list(d)]
            for u in (0.0, 0.5, kit.ONE_BELOW):
                us = np.full(2, u)
                assert exact_match_accept(np.array(d), p, q, us, u) == accept(np.array(d), p, q, us, u)


# ---- (b) what it keeps: sum p q per position, never above the token rule's sum min(p, q)

def test_a_draft_is_kept_with_probability_sum_p_q_exactly():
    """One draft, every small case (Fractions): acceptance_rate is sum_x p(x) q(x) for exact-match and
    sum_x min(p(x), q(x)) for the token rule; the paper's example: 4/9 against 2/3."""
    n = 0
    for p, q in kit.small_cases():
        assert kit.acceptance_rate(p, q, blocks.exact_match_rule) == dot(p, q)
        assert kit.acceptance_rate(p, q, blocks.token_block_rule) == overlap(p, q)
        n += 1
    assert n == len(list(kit.small_cases()))
    assert kit.acceptance_rate(PAPER_P, PAPER_Q, blocks.exact_match_rule) == F(4, 9)
    assert kit.acceptance_rate(PAPER_P, PAPER_Q, blocks.token_block_rule) == F(2, 3)


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_expected_kept_drafts_are_sum_p_q_per_position_on_a_chain(gamma):
    """A chain of gamma drafts on context-dependent tables: the enumerated E[kept] equals the recursion with
    keep(x) = p(x), i.e. each draft, given the ones before it kept, is kept with probability sum_x p q of its
    position's rows; constant rows give sum_{i <= gamma} (sum p q)^i."""
    for s in range(8):
        p, q = kit.random_table(3, seed=s), kit.random_table(3, seed=100 + s)
        assert blocks.expected_accepted(p, q, PROMPT, gamma, blocks.exact_match_rule) == \
            chain_kept(p, q, PROMPT, gamma, lambda prow, qrow, x: prow[x])
    a = dot(PAPER_P, PAPER_Q)
    assert blocks.expected_accepted(kit.constant_table(PAPER_P), kit.constant_table(PAPER_Q), PROMPT, gamma,
                                    blocks.exact_match_rule) == sum(a ** i for i in range(1, gamma + 1))


def test_never_above_token_wise_and_equal_only_for_disjoint_supports_or_a_one_hot_row():
    """p q <= min(p, q) max(p, q) <= min(p, q) termwise, so sum p q <= sum min(p, q); equality needs every x with
    min(p(x), q(x)) > 0 to have max(p(x), q(x)) = 1: disjoint supports (both 0) or p or q one-hot. Checked both
    ways on every small case."""
    strictly = 0
    for p, q in kit.small_cases():
        em = kit.acceptance_rate(p, q, blocks.exact_match_rule)
        token = kit.acceptance_rate(p, q, blocks.token_block_rule)
        assert em <= token
        assert (em == token) == (overlap(p, q) == 0 or max(p) == 1 or max(q) == 1), (p, q)
        strictly += em < token
    assert strictly > 0


@pytest.mark.parametrize("gamma", [2, 3])
def test_never_above_token_wise_on_chains(gamma):
    """keep(x) = p(x) <= min(1, p(x) / q(x)) for every x, so the chain's E[kept] is never above the token rule's
    (and block verification's): every small case with constant rows and 12 context-dependent pairs, exactly."""
    cases = [(kit.constant_table(p), kit.constant_table(q)) for p, q in kit.small_cases(3, 3)]
    cases += [(kit.random_table(3, seed=s), kit.random_table(3, seed=200 + s)) for s in range(12)]
    strictly = 0
    for p, q in cases:
        em = blocks.expected_accepted(p, q, PROMPT, gamma, blocks.exact_match_rule)
        token = blocks.expected_accepted(p, q, PROMPT, gamma, blocks.token_block_rule)
        assert em <= token <= blocks.expected_accepted(p, q, PROMPT, gamma)
        strictly += em < token
    assert strictly > 0


# ---- (c) through the API and the CLI

def cli(*argv):
    out = io.StringIO()
    generate.run(generate.build_parser().parse_args([*argv, "--json", "--quiet", "--max-new-tokens", "24"]),
                 out=out, err=io.StringIO())
    return json.loads(out.getvalue())


def test_greedy_with_exact_match_is_plain_greedy_and_sampled_runs():
    """--verify exact-match --temperature 0 emits plain greedy decoding's ids (the round decides greedy rounds
    itself); sampled, it runs through the rule and keeps drafts; a tree drafter is refused with the reason."""
    greedy = cli("--verify", "exact-match", "--temperature", "0")
    assert greedy["ids"] == cli("--gamma", "0", "--temperature", "0")["ids"] and greedy["stats"]["accepted"] > 0
    sampled = cli("--verify", "exact-match", "--seed", "2")
    assert len(sampled["ids"]) == 24 and sampled["stats"]["accepted"] > 0
    with pytest.raises(ValueError, match=r"the exact-match rule \(--verify exact-match\) verifies chains only"):
        cli("--verify", "exact-match", "--tree", "2,1")


def test_the_api_takes_verify_exact_match_and_refuses_trees():
    table = kit.random_table(5, seed=3)
    target = kit.TableModel(table, 5, 40)
    greedy = speculative_generate(target, target, [1, 2], 12, gamma=3, temperature=0, verify="exact-match")
    assert greedy.ids == speculative_generate(target, None, [1, 2], 12, temperature=0).ids
    same = speculative_generate(target, target, [1, 2], 12, gamma=3, rng=4, verify="exact-match")
    assert len(same.ids) == 12 and same.stats.accepted > 0
    with pytest.raises(ValueError, match="verifies chains only") as e:
        speculative_generate(target, TreeDrafter(target, (2,)), [1, 2], 4, gamma=1, verify="exact-match")
    assert "\n" not in str(e.value)
