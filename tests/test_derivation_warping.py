"""Claims 6 and 7 of notes/derivation.md, checked numerically: greedy is the temperature-0 limit, and p is
warped like plain decoding while accept is given the q the draft was sampled from. Exact Fractions through
npspec.testing's enumeration (test_one_step's oracle), and npspec's own accept in float64 (tolerance 1e-12)."""

from fractions import Fraction as F

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode.sampling import warp
from npspec.decode import accept

from test_one_step import ACCEPT_RULE, accept_law, assert_round_keeps_target, first_token, round_law

TOL = 1e-12


# ---- claim 6: greedy is the temperature-0 limit -------------------------------------------------

def test_greedy_step_is_target_argmax():
    """With one-hot p and q (temperature 0) accept emits argmax(p) for every uniform, whatever the draft."""
    rng = np.random.default_rng(1)
    for _ in range(40):
        logits = rng.integers(-2, 3, size=(2, 5)).astype(np.float32)  # small integers: many ties
        p, q = warp(logits, temperature=0)
        d = int(np.argmax(q))
        law = accept_law([d], np.stack([p, p]), q[None])
        target = int(np.argmax(logits[0]))  # lowest id among ties
        expected = {(d, target): 1.0} if d == target else {(target,): 1.0}
        assert law.keys() == expected.keys() and abs(sum(law.values()) - 1) <= TOL


def test_temperature_limit():
    """warp(logits, T) -> the one-hot warp(logits, 0) as T -> 0: the error is below (V-1) exp(-gap/T)."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(20, 50)).astype(np.float32)
    top2 = np.sort(logits.astype(np.float64), axis=-1)[:, -2:]
    gap = (top2[:, 1] - top2[:, 0]).min()
    assert gap > 0
    for t in (1.0, 0.3, 0.1, 0.03, gap / 40):
        err = np.abs(warp(logits, temperature=t) - warp(logits, temperature=0)).max()
        assert err <= 49 * np.exp(-gap / t) + 1e-15


# ---- claim 7: warp p like plain decoding, and pass the q that was sampled from ------------------

def test_argmax_proposal_with_softmax_q_is_biased():
    """Draft proposes argmax q but accept is given softmax q: the law is wrong; given the one-hot q it is right."""
    p, q = (F(1, 2), F(3, 10), F(1, 5)), (F(3, 5), F(3, 10), F(1, 10))
    argmax_q = (F(1), F(0), F(0))  # the proposal's real law: always m = 0, the argmax of q

    def given_softmax(rule, q_told):  # the rule is told q_told whatever the draft really drew from
        return lambda prow, qrow, x: rule(prow, q_told, x)

    wrong = first_token(round_law(given_softmax(kit.leviathan_rule, q), p, argmax_q)[0], 3)
    assert wrong == [F(5, 6), 0, F(1, 6)] != list(p)  # token 1 is never emitted
    assert_round_keeps_target(kit.leviathan_rule, p, argmax_q)  # the honest q of an argmax proposal: exact
    # the same through npspec's accept
    pf, qf = np.array([float(x) for x in p]), np.array([float(x) for x in q])
    got = first_token(round_law(given_softmax(ACCEPT_RULE, qf), pf, np.array([1.0, 0.0, 0.0]))[0], 3)
    np.testing.assert_allclose(got, [5 / 6, 0, 1 / 6], rtol=0, atol=TOL)


@pytest.mark.parametrize("args", [dict(top_k=2), dict(temperature=0.5), dict(top_p=0.6)])
def test_unwarped_p_gives_the_unwarped_law(args):
    """The output follows whatever p accept is given: warp q but not p and the output is the raw target,
    which puts mass where plain decoding with these options never would (or ignores the temperature)."""
    target_logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    draft_logits = np.log(np.array([0.25, 0.35, 0.3, 0.1]))
    q = warp(draft_logits, **args)
    p_raw, p_warped = warp(target_logits), warp(target_logits, **args)
    assert_round_keeps_target(ACCEPT_RULE, p_raw, q, atol=TOL)
    assert np.abs(p_raw - p_warped).max() > 0.05  # so the output is NOT what plain decoding would give
    assert_round_keeps_target(ACCEPT_RULE, p_warped, q, atol=TOL)


def test_strict_test_never_accepts_p_zero():
    """u = 0.0 is a possible draw (Generator.random returns k / 2^53); `u <= p/q` would keep a token with p = 0."""
    p = np.array([[0.0, 0.6, 0.4], [1 / 3, 1 / 3, 1 / 3]])  # the target forbids token 0 (e.g. cut by top-p)
    q = np.array([[0.5, 0.25, 0.25]])
    n, token = accept(np.array([0]), p, q, np.array([0.0]), 0.5)
    assert n == 0 and p[0, token] > 0  # rejected, and the replacement comes from the residual (a non-strict
    # comparison, 0.0 <= p/q = 0, would have kept it)
    assert np.random.default_rng(0).random() * 2**53 % 1 == 0  # uniforms are multiples of 2^-53
