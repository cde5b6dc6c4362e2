"""Block verification (Sun et al. 2025, Algorithm 2; npspec.decode.rules.block_accept), proven by exact enumeration.

ONE oracle, npspec.testing.blocks: `assert_block_keeps_target` is THE check of a block rule (the law of one round,
continued by the target, is the target's), called by the exhaustive tests and the hypothesis property alike; the
whole loop is enumerated by blocks.block_distribution on the grid the token rule is proven on
(tests/test_one_step.py::test_speculative_law_equals_target_law_exactly). Then: expected kept drafts never below
token-wise and never above the joint bound, the paper's example exactly (10/9, 11/9, 12/9), one-hot proposals
(block verification IS the token rule in law), temperature 0 (the same decision for every uniform), and the kit
catching the mistakes engines made (vLLM-Ascend before its PR #7808) and the obvious ones.
"""

import itertools
import math
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given

from npspec import testing as kit
from npspec.decode.rules import block_accept, block_thresholds, block_weights
from npspec.decode.sampling import residual, sample
from npspec.decode import accept
from npspec.testing import blocks
from npspec.testing.vectors import verification_cases
from npspec.testing.drafting import confident_drafter, ngram_drafter

from conftest import tiny_model
from test_one_step import SEQ_PROMPT, TRUNCATIONS, tables

PROMPT = (0,)
PAPER_P, PAPER_Q = [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]  # Sun et al.'s example: two tokens a, b


def assert_block_keeps_target(rule, p, q, gammas=(1, 2, 3), tol=1e-12):
    """THE check: one round of each gamma decided by the block rule, continued by the target, is the target's law
    (exactly for a rule in Fractions, within tol per outcome for a float rule)."""
    report = blocks.check_block_rule(rule, cases=[(p, q)], gammas=gammas, tol=tol)
    assert report.ok, str(report)


# ---- (a) lossless: one round, the whole loop, the same grid as the token rule

def test_block_verification_keeps_the_target_law_on_every_small_case():
    """Every pair of the kit's small cases (353: zeros, one-hot rows, p == q, disjoint supports) and its 8
    context-dependent pairs, gamma 1, 2, 3."""
    report = blocks.check_block_rule(blocks.block_verification_rule, gammas=(1, 2, 3))
    assert report.ok and report.tol == 0 and report.cases == len(list(kit.small_cases())) + 8, str(report)


@pytest.mark.parametrize("n_vocab", [3, 4, 5, 6])
@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=["none", "top_k2", "top_p2/3", "top_k3_top_p.9"])
def test_block_verification_keeps_the_target_law_on_the_token_rules_grid(n_vocab, truncation):
    """The whole loop, exactly: gamma 1..4, max_new_tokens 1..4, with and without EOS, with n_ctx cutting, on
    test_one_step's context-dependent tables; the heuristic gamma schedule too."""
    p, q = tables(n_vocab, truncation)
    assert_block_keeps_target(blocks.block_verification_rule, p, q, gammas=(2,))
    checked = 0
    for eos in (None, n_vocab - 1):
        for n_ctx in (None, len(SEQ_PROMPT) + 2):
            for max_new_tokens in range(1, 5):
                target = kit.sequence_distribution(p, SEQ_PROMPT, max_new_tokens, eos, n_ctx)
                for gamma in range(1, 5):
                    for schedule in ("constant", "heuristic") if n_vocab < 5 else ("constant",):
                        got = blocks.block_distribution(p, q, SEQ_PROMPT, gamma, max_new_tokens, eos, n_ctx,
                                                        schedule=schedule)
                        assert got == target, (eos, n_ctx, max_new_tokens, gamma, schedule)
                        checked += 1
    assert checked == 2 * 2 * 4 * 4 * (2 if n_vocab < 5 else 1)


def test_block_verification_keeps_the_target_law_with_npspecs_drafters():
    """n-gram lookup (one-hot q) and confidence stopping (fewer drafts than gamma), whole loop with EOS, exactly."""
    p = kit.random_table(3, seed=5)
    q = kit.random_table(3, seed=6)
    for drafter in (ngram_drafter(3, 1, 2), confident_drafter(q, F(1, 2))):
        for eos in (None, 2):
            target = kit.sequence_distribution(p, (0, 1, 0), 4, eos)
            for gamma in (1, 2, 3):
                assert blocks.block_drafter_distribution(p, drafter, (0, 1, 0), gamma, 4, eos) == target


def test_block_accept_decides_as_block_verification():
    """npspec.decode.rules.block_accept itself, integrated over its uniforms (blocks.function_rule), on every small case
    over 3 tokens, gamma 1..3: the target's law to float64 rounding; and its law equals the exact rule's."""
    rule = blocks.function_rule(block_accept)
    cases = [(p, q) for p, q in kit.small_cases() if len(p) == 3][:120]
    report = blocks.check_block_rule(rule, cases=cases, gammas=(1, 2, 3))
    assert report.ok and report.tol == 1e-12, str(report)
    for d in itertools.product(range(2), repeat=2):
        exact = law_by_token(blocks.block_verification_rule([PAPER_P] * 3, [PAPER_Q] * 2, d))
        got = law_by_token(rule([[float(x) for x in PAPER_P]] * 3, [[float(x) for x in PAPER_Q]] * 2, d))
        assert set(got) == set(exact) and max(abs(got[k] - exact[k]) for k in exact) <= 1e-12


@given(kit.probability_pairs(max_size=4))
def test_block_accept_keeps_the_target_law_on_random_rows(pq):
    """Property: float rows with zeros, one-hot rows, p == q and zero-mass residuals, through the same check."""
    p, q = pq
    assert_block_keeps_target(blocks.function_rule(block_accept), list(p), list(q), gammas=(1, 2))


def law_by_token(outcomes):
    """{(n, token): probability} of a block rule's [(probability, n, row)]."""
    law = {}
    for prob, n, row in outcomes:
        for y, ry in enumerate(row):
            if prob * ry:
                law[n, y] = law.get((n, y), 0) + prob * ry
    return law


# ---- (b) expected kept drafts: token-wise <= block <= the joint bound, and the paper's example

def test_the_papers_example_exactly():
    """p = (1/3, 2/3), q = (2/3, 1/3), gamma 2: token-wise keeps 10/9 drafts per round, block 11/9, bound 12/9."""
    p, q = kit.constant_table(PAPER_P), kit.constant_table(PAPER_Q)
    assert blocks.expected_accepted(p, q, PROMPT, 2, blocks.token_block_rule) == F(10, 9)
    assert blocks.expected_accepted(p, q, PROMPT, 2) == F(11, 9)
    assert blocks.joint_bound(p, q, PROMPT, 2) == F(12, 9)
    # the bound by hand: 1 - TV of one token (2/3) plus 1 - TV of two (1/9 + 2/9 + 2/9 + 1/9 = 6/9)
    assert F(2, 3) + sum(min(a * b, c * e) for (a, c), (b, e) in itertools.product(zip(PAPER_P, PAPER_Q), repeat=2)) \
        == F(12, 9)


@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
def test_block_keeps_at_least_as_many_as_token_wise_on_every_case(gamma):
    """Every small case (constant rows) and 20 random context-dependent pairs: E_token <= E_block <= joint bound,
    equal for gamma 1 (one draft: both are claim 2's maximal coupling)."""
    cases = [(kit.constant_table(p), kit.constant_table(q)) for p, q in kit.small_cases(3, 3 if gamma > 2 else 4)]
    cases += [(kit.random_table(3, seed=s), kit.random_table(3, seed=100 + s)) for s in range(20)]
    strictly = 0
    for p, q in cases:
        token = blocks.expected_accepted(p, q, PROMPT, gamma, blocks.token_block_rule)
        block = blocks.expected_accepted(p, q, PROMPT, gamma)
        assert token <= block <= blocks.joint_bound(p, q, PROMPT, gamma)
        assert gamma > 1 or block == token
        strictly += block > token
    assert (strictly > 0) == (gamma > 1)


# ---- (c) one-hot proposals: block verification IS token-wise verification, in law

def test_one_hot_proposals_give_the_token_rules_law_exactly():
    """For one-hot draft rows (n-gram lookup, any deterministic drafter) the weights are products of p(d_i) <= 1,
    so w_i is the token rule's P(d_1..d_i all kept) and the residuals coincide: for every block of 1..2 drafts over
    3 tokens and every choice of target rows on the 1/4-grid, the law of (kept, token) is the token rule's."""
    rows = {d: list(dict.fromkeys(tuple(r) for r, _ in kit.small_cases(3, d) if len(r) == 3)) for d in (2, 4)}
    eye = [[F(int(i == j)) for i in range(3)] for j in range(3)]
    compared = 0
    for k, grid in ((1, rows[4]), (2, rows[4][:8]), (3, rows[2][:3])):  # 22 rows on the 1/2, 1/3, 1/4 grids; 6 on 1/2
        for d in itertools.product(range(3), repeat=k):
            for prows in itertools.product(grid, repeat=k + 1):
                prows, qrows = [list(r) for r in prows], [eye[x] for x in d]
                assert law_by_token(blocks.block_verification_rule(prows, qrows, d)) == \
                    law_by_token(blocks.token_block_rule(prows, qrows, d)), (d, prows)
                compared += 1
    assert (len(rows[4]), len(rows[2])) == (22, 6) and compared == 3 * 22 ** 2 + 9 * 8 ** 3 + 27 * 3 ** 4


def test_one_hot_proposals_keep_as_many_over_whole_generations():
    """The n-gram drafter over whole generations: the law of the total kept drafts is the same for both rules."""
    p, drafter = kit.random_table(3, seed=7), ngram_drafter(3, 1, 2)

    def kept_law(rule):
        law = {}
        for path in blocks.block_paths(p, drafter, (0, 1, 0, 1), 3, 5, rule=rule):
            n = sum(r.accepted for r in path.rounds)
            law[n] = law.get(n, 0) + path.prob
        return {n: v for n, v in law.items() if v}

    assert kept_law(blocks.block_verification_rule) == kept_law(blocks.token_block_rule)
    assert len(kept_law(blocks.token_block_rule)) > 2  # drafts were proposed and kept in several ways


# ---- temperature 0: the same decision for every uniform

def test_block_accept_is_the_token_rule_at_temperature_0():
    """One-hot p and q (warp at temperature 0): every block of 1..3 drafts over 3 ids, every target argmax row,
    uniforms at both ends and inside: block_accept returns accept's (n, token)."""
    eye, us = np.eye(3), (0.0, 0.5, kit.ONE_BELOW)
    cases = 0
    for k in (1, 2, 3):
        for d in itertools.product(range(3), repeat=k):
            for best in itertools.product(range(3), repeat=k + 1):
                p, q = eye[list(best)], eye[list(d)]
                for u in itertools.product(us, repeat=2) if k < 3 else ((0.0, 0.5), (kit.ONE_BELOW, 0.0)):
                    u_tests = np.full(k, u[0])
                    assert block_accept(np.array(d), p, q, u_tests, u[1]) == accept(np.array(d), p, q, u_tests, u[1])
                cases += 1
    assert cases == sum(3 ** k * 3 ** (k + 1) for k in (1, 2, 3))
    assert blocks.block_probes(block_accept) == []


# ---- (d) the kit catches the mistakes

def ascend_before_7808(p_rows, q_rows, d):
    """vLLM-Ascend's block verify before PR #7808 (issue #7807): uniforms multiplied, ratios clamped one by one, a
    non-strict test, then the token rule's residual; the kit's model of it (blocks.cumprod_rule), for 2 drafts."""
    return blocks.cumprod_rule()(p_rows, q_rows, d)


def token_residual(p_rows, q_rows, d):
    """Block verification's decision with the token rule's residual norm(max(0, p - q)): the wrong residual."""
    out = []
    for prob, n, row in blocks.block_verification_rule(p_rows, q_rows, d):
        if n < len(d):
            r = [max(0, a - b) for a, b in zip(p_rows[n], q_rows[n])]
            row = [x / sum(r) for x in r] if sum(r) else list(p_rows[n])
        out.append((prob, n, row))
    return out


def past_a_rejected_prefix(p_rows, q_rows, d):
    """The token rule's independent tests, but keeping up to the LAST passing test: a block kept past a rejected one."""
    a = [min(1, p_rows[i][x] / q_rows[i][x]) for i, x in enumerate(d)]
    out = []
    for n in range(len(d), -1, -1):
        prob = (a[n - 1] if n else 1) * math.prod(1 - x for x in a[n:])
        r = p_rows[n] if n == len(d) else [max(0, x - y) for x, y in zip(p_rows[n], q_rows[n])]
        out.append((prob, n, [x / sum(r) for x in r] if sum(r) else list(p_rows[n])))
    return out


def rows_of_the_tested_position(p_rows, q_rows, d):
    """Block verification with Z_i taken from the rows d_i was tested against (p_i, q_i) instead of the rows after
    d_1..d_i (p_{i+1}, q_{i+1}), as the PyTorch fallback of vLLM-Ascend's PR #7808 reads to me (its Triton kernel
    takes the next rows). Invisible when the rows do not depend on the context."""
    k, w, out = len(d), blocks.weights(p_rows, q_rows, d), []
    h = [0] + [(F(z) / (z + 1 - w[i]) if z + 1 - w[i] > 0 else 0) for i in range(1, k)
               for z in [sum(max(0, w[i] * a - b) for a, b in zip(p_rows[i - 1], q_rows[i - 1]))]] + [w[k]]
    none_yet = 1
    for n in range(k, -1, -1):
        prob = none_yet * (h[n] if n else 1)
        r = p_rows[k] if n == k else [max(0, w[n] * a - b) for a, b in zip(p_rows[n], q_rows[n])]
        out.append((prob, n, [F(x) / sum(r) for x in r] if sum(r) else list(p_rows[n])))
        none_yet *= 1 - h[n]
    return out


def test_a_row_index_mistake_needs_rows_that_depend_on_the_context():
    """Taking Z_i from the tested position's rows passes every constant-row case and fails on context-dependent
    tables: the kit's check_block_rule adds such tables to its default cases for that reason."""
    assert blocks.check_block_rule(rows_of_the_tested_position, cases=kit.small_cases(), gammas=(2,)).ok
    report = blocks.check_block_rule(rows_of_the_tested_position, gammas=(2,))
    assert not report.ok and report.cases > len(list(kit.small_cases())) and callable(report.p), str(report)


@pytest.mark.parametrize("mistake", [ascend_before_7808, token_residual, past_a_rejected_prefix],
                         ids=lambda f: f.__name__)
def test_the_kit_catches_wrong_block_verifiers(mistake):
    """Each mistake is caught on a small case at gamma 2 (at gamma 1 each is the token rule, so it passes there)."""
    report = blocks.check_block_rule(mistake, gammas=(2,))
    assert not report.ok and report.gamma == 2 and report.error is None, str(report)
    assert "differs" in str(report)
    assert blocks.check_block_rule(mistake, gammas=(1,)).ok


def non_strict(d, p, q, u_tests, u_final):
    """block_accept with the paper's non-strict test u <= h: the same law, but u = 0 keeps a prefix of weight 0."""
    w = block_weights(d, p, q)
    h = block_thresholds(w, p, q)
    kept = np.asarray(u_tests) <= h[1:]
    tau = int(np.flatnonzero(kept)[-1]) + 1 if kept.any() else 0
    return (tau, sample(p[tau], u_final)) if tau == len(d) else (tau, sample(residual(w[tau] * p[tau], q[tau]),
                                                                             u_final))


def per_token_weights(d, p, q, u_tests, u_final):
    """Thresholds from each token's own ratio (w_i = min(1, p_i/q_i), the prefix forgotten): keeps past a dead one."""
    w = np.append(1.0, np.minimum(1.0, p[np.arange(len(d)), d] / q[np.arange(len(d)), d]))
    h = block_thresholds(w, p, q)
    kept = np.asarray(u_tests) < h[1:]
    tau = int(np.flatnonzero(kept)[-1]) + 1 if kept.any() else 0
    return (tau, sample(p[tau], u_final)) if tau == len(d) else (tau, sample(residual(w[tau] * p[tau], q[tau]),
                                                                             u_final))


def test_the_probes_catch_what_the_law_cannot_see():
    """A non-strict test differs from block_accept on a set of probability 0, so the law is the target's; the
    probe with u = 0 on a prefix of weight 0 catches it. Forgetting the prefix is caught by both; the token
    rule is lossless but is not block verification (it rejects the paper's a, b with u = 0.9)."""
    assert blocks.check_block_rule(blocks.function_rule(non_strict), cases=[(PAPER_P, PAPER_Q)]).ok
    assert [name for name, _ in blocks.block_probes(non_strict)] == ["zero-weight-u0", "greedy"]  # greedy: u = 0
    assert "past-a-dead-prefix" in [name for name, _ in blocks.block_probes(per_token_weights)]
    assert not blocks.check_block_rule(blocks.function_rule(per_token_weights), gammas=(2,)).ok
    assert [name for name, _ in blocks.block_probes(accept)] == ["dip-then-recover"]
    assert blocks.check_block_rule(blocks.function_rule(accept), cases=[(PAPER_P, PAPER_Q)]).ok


# ---- the exported vectors (python -m npspec.testing vectors)

@pytest.mark.parametrize("c", verification_cases()["block_verification"], ids=lambda c: c["name"])
def test_the_block_vectors_are_block_accepts_laws(c):
    """Each exported block case: its output law sums to 1, npspec's float64 block_accept, integrated over its
    uniforms, reproduces the first round's law of (kept, token) to 1e-12, and token-wise <= block <= the bound; the
    row-index mistake reproduces every constant-row case and not the context-dependent one."""
    if "p_after_last_id" in c:  # rows that depend on the last id
        p_after, q_after = ({int(x): [F(v) for v in row] for x, row in c[key].items()}
                            for key in ("p_after_last_id", "q_after_last_id"))
        p, q = (lambda seq: p_after[seq[-1]]), (lambda seq: q_after[seq[-1]])
    else:
        p, q = (kit.constant_table([F(v) for v in c[key]]) for key in ("p_warped", "q_warped"))
    g, eos, prompt = c["first_round_gamma"], c["eos_token_id"], tuple(c["prompt"])
    assert sum(F(e["probability"]) for e in c["output_law"]) == 1
    want = {}
    for e in c["first_round_law"]:
        emitted = tuple(e["drafted"][:e["accepted"]]) + (() if e["token"] is None else (e["token"],))
        want[emitted] = want.get(emitted, 0) + F(e["probability"])

    def first_round(rule, table=lambda t: t):
        got = {}
        for _, emitted, prob in blocks._block_round(table(p), kit.table_drafter(table(q)), prompt, g, eos, rule):
            got[emitted] = got.get(emitted, 0) + prob
        return {k: v for k, v in got.items() if v > 1e-15}

    floats = first_round(blocks.function_rule(block_accept), lambda t: (lambda seq: [float(x) for x in t(seq)]))
    assert set(floats) == set(want) and max(abs(floats[k] - float(v)) for k, v in want.items()) <= 1e-12
    assert (first_round(rows_of_the_tested_position) == want) == ("p_after_last_id" not in c or g < 2)
    e = {k: F(v) for k, v in c["expected_accepted_first_round"].items()}
    assert e["token"] <= e["block"] <= e["joint_bound"]
    if c["name"] == "paper-example":
        assert (e["token"], e["block"], e["joint_bound"]) == (F(10, 9), F(11, 9), F(12, 9))


# ---- real GPT-2 rows, warped as npspec warps them

@pytest.mark.parametrize("warp_args", [dict(temperature=1.0), dict(temperature=1.7, top_k=3),
                                       dict(temperature=1.3, top_p=0.8), dict(temperature=0.0)],
                         ids=["T1", "T1.7_k3", "T1.3_p0.8", "greedy"])
def test_block_accept_keeps_the_law_on_tiny_gpt2_rows(warp_args):
    """Rows from real forwards of two tiny GPT-2 models (5 tokens, context-dependent), npspec's float64 block_accept
    integrated over its uniforms, the whole loop for 4 ids with gamma 2, with and without EOS: the target's
    law to 1e-12 (test_one_step's float64 check of the token rule, for the block rule)."""
    target = tiny_model(seed=31, n_vocab=5, n_ctx=16, n_layer=2, eos_token_id=4)
    draft = tiny_model(seed=32, role="draft", n_vocab=5, n_ctx=16, n_layer=1, eos_token_id=4)
    p, q = kit.model_table(target, **warp_args), kit.model_table(draft, **warp_args)
    for eos in (None, 4):
        ref = kit.sequence_distribution(p, SEQ_PROMPT, 4, eos)
        for gamma in (2,):
            got = blocks.block_distribution(p, q, SEQ_PROMPT, gamma, 4, eos, rule=blocks.function_rule(block_accept))
            assert max(abs(got.get(k, 0) - ref.get(k, 0)) for k in set(got) | set(ref)) <= 1e-12, (eos, gamma)
