"""Claims 1 to 3 of notes/derivation.md, checked numerically (claims 4-5: test_derivation_speedup.py,
6-7: test_derivation_warping.py).

Letters are Leviathan's: `p` the target, `q` the draft. The law of a round comes from ONE oracle,
npspec.testing's exact enumeration, through test_one_step.assert_round_keeps_target, given either
kit.leviathan_rule on `Fraction` rows (exact: an equality is an equality) or test_one_step's
`accept_rule`, npspec.decode.rules.accept measured by quadrature over its uniforms (float64,
tolerance 1e-12).
"""

import itertools
from collections import defaultdict
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from npspec import testing as kit
from npspec.decode.sampling import residual, sample, warp
from npspec.decode import accept

from test_one_step import (ACCEPT_RULE, accept_law, accept_rule, acceptance_probability,
                           assert_blocks_are_one_draft_at_a_time, assert_round_keeps_target, first_token, round_law)

TOL = 1e-12


def simplex(n_vocab, denominator):
    """Every probability vector over n_vocab tokens with entries k / denominator, as Fractions."""
    for cut in itertools.combinations(range(denominator + n_vocab - 1), n_vocab - 1):
        parts = np.diff([-1, *cut, denominator + n_vocab - 1]) - 1  # stars and bars
        yield tuple(F(int(k), denominator) for k in parts)


# ---- claim 1: one accept/reject step preserves p ----------------------------------------------

def test_one_step_law_exact():
    """Every pair (p, q) on the 3-token grid of step 1/4 and the 4-token grid of step 1/3: law == p exactly."""
    pairs = 0
    for n_vocab, denominator in ((3, 4), (4, 3)):
        grid = list(simplex(n_vocab, denominator))
        for p in grid:
            for q in grid:
                assert_round_keeps_target(kit.leviathan_rule, p, q)
                pairs += 1
    assert pairs == 15**2 + 20**2  # the grids really are exhaustive


def test_residual_matches_npspec():
    """npspec.decode.sampling.residual equals the exact norm(max(0, p - q)) to float64 rounding, and p where p == q."""
    grid = list(simplex(4, 5))
    for p in grid:
        for q in grid:
            exact = kit.leviathan_rule(p, q, next(x for x, v in enumerate(q) if v))[1]
            got = residual(np.array(p, dtype=np.float64), np.array(q, dtype=np.float64))
            np.testing.assert_allclose(got, [float(x) for x in exact], rtol=0, atol=1e-15)


def test_one_step_law_through_accept():
    grid = [np.array(v, dtype=np.float64) for v in simplex(3, 4)]
    for p in grid:
        for q in grid:
            assert_round_keeps_target(ACCEPT_RULE, p, q, atol=TOL)


probability_vectors = st.integers(2, 7).flatmap(
    lambda n: st.tuples(*[arrays(np.float64, n, elements=st.one_of(st.just(0.0), st.floats(1e-9, 1.0)))] * 2))


@given(probability_vectors)
def test_one_step_law_through_accept_random(pq):
    p, q = (v / v.sum() if v.sum() > 0 else np.eye(len(v))[0] for v in pq)
    assert_round_keeps_target(ACCEPT_RULE, p, q, atol=TOL)


def test_the_checks_can_fail():
    """Sampling p instead of the residual after a rejection: the exact law and the quadrature both see it."""
    def no_residual(p, q, x):
        return min(1, p[x] / q[x]), list(p)

    grid = list(simplex(3, 4))
    assert sum(not kit.check_rule(no_residual, cases=[(p, q)], gammas=(1,)).ok for p in grid for q in grid) > 100

    def accept_without_residual(d, p, q, u_accept, u_final):
        n, _ = accept(d, p, q, u_accept, u_final)
        return n, sample(p[n], u_final)

    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.75, 0.0, 0.25])
    law = first_token(round_law(accept_rule(accept_without_residual), p, q)[0], 3)
    np.testing.assert_allclose(law, [0.75, 0.25, 0.0], rtol=0, atol=TOL)  # != p
    assert_round_keeps_target(ACCEPT_RULE, p, q, atol=TOL)


# ---- claim 2: beta = sum(min(p, q)) = 1 - TV(p, q) is the acceptance probability --------------------

def test_beta_is_one_minus_tv():
    grid = list(simplex(4, 4))
    for p in grid:
        for q in grid:
            beta = sum(min(a, b) for a, b in zip(p, q))
            tv = sum(abs(a - b) for a, b in zip(p, q)) / 2
            assert beta == 1 - tv == acceptance_probability(kit.leviathan_rule, p, q)
            assert 1 - beta == sum(max(a - b, 0) for a, b in zip(p, q))  # the residual's mass


def test_acceptance_probability_is_beta_through_accept():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p, q = rng.dirichlet(np.full(5, 0.5), size=2)
        p[rng.integers(5)] = 0.0  # exact zeros on both sides
        q[rng.integers(5)] = 0.0
        p, q = p / p.sum(), q / q.sum()
        assert abs(acceptance_probability(ACCEPT_RULE, p, q) - np.minimum(p, q).sum()) <= TOL


def integer_couplings(rows, cols):
    """Every non-negative integer matrix with the given row sums and column sums (a transportation polytope's
    integer points), as tuples of rows."""
    if not rows:
        if not any(cols):
            yield ()
        return
    for cut in itertools.combinations(range(rows[0] + len(cols) - 1), len(cols) - 1):
        row = tuple(int(k) for k in np.diff([-1, *cut, rows[0] + len(cols) - 1]) - 1)
        if all(a <= b for a, b in zip(row, cols)):
            for rest in integer_couplings(rows[1:], [b - a for a, b in zip(row, cols)]):
                yield (row, *rest)


def test_no_lossless_verifier_keeps_a_draft_more_often_than_beta():
    """Claim 2's coupling fact, exactly, on every pair of the 3-token grid of step 1/4.

    A single-draft verifier sees x ~ q and emits y; if it is lossless, y ~ p, so the joint law of (x, y) is a
    coupling of q and p, and P(keep) = P(y = x) is its diagonal mass. Enumerated here: every coupling whose
    entries are multiples of 1/4 (margins q, p in quarters, scaled to integers). The transportation polytope
    has integer vertices, so its linear maximum is reached at one of these: the largest diagonal over all
    couplings is the largest here, and it equals beta = sum min(p, q) = 1 - TV(p, q) for every pair."""
    grid = list(simplex(3, 4))
    below = 0
    for p in grid:
        for q in grid:
            beta = sum(min(a, b) for a, b in zip(p, q))
            diagonals = [F(sum(j[x][x] for x in range(3)), 4) for j in
                         integer_couplings([int(4 * v) for v in q], [int(4 * v) for v in p])]
            assert max(diagonals) == beta, (p, q)
            independent = sum(a * b for a, b in zip(p, q))  # the verifier that ignores x and samples p afresh
            assert independent <= beta
            below += independent < beta
    assert below > 100  # a lossless verifier can keep less than beta (144 of the 225 pairs); none keeps more


def test_npspec_verifier_is_a_maximal_coupling():
    """The joint law of (draft x, first emitted id y) under npspec's accept, by quadrature over its uniforms:
    its margins are q and p, and its diagonal mass is exactly beta: the best any lossless verifier can do.
    A rejected draft never comes back (the residual is 0 wherever q >= p), so P(y = x) is P(kept)."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        p, q = rng.dirichlet(np.full(4, 0.7), size=2)
        p[rng.integers(4)] = 0.0
        p /= p.sum()
        joint = np.zeros((4, 4))
        for x in np.flatnonzero(q):
            for ids, w in accept_law([x], np.stack([p, p]), q[None]).items():
                joint[x, ids[0]] += q[x] * w
        np.testing.assert_allclose(joint.sum(axis=1), q, rtol=0, atol=TOL)
        np.testing.assert_allclose(joint.sum(axis=0), p, rtol=0, atol=TOL)
        assert abs(np.trace(joint) - np.minimum(p, q).sum()) <= TOL


# ---- claim 3: a whole round, and a whole sequence ----------------------------------------------

N_VOCAB = 3


def weights(ctx, seed):  # a deterministic integer weight vector for a context, some entries 0
    w = np.random.default_rng([seed, len(ctx), *ctx]).integers(0, 4, N_VOCAB)
    if not w.any():
        w[len(ctx) % N_VOCAB] = 1
    return w


def family(kind):
    """(P, Q) returning tuples of Fractions for a context tuple."""
    def frac(w):
        return tuple(F(int(x), int(w.sum())) for x in w)

    def onehot(w):  # temperature 0: one-hot on the argmax, lowest id on ties (npspec.decode.sampling.warp)
        return tuple(F(int(x)) for x in warp(w.astype(np.float32), temperature=0))

    if kind == "random":
        return (lambda c: frac(weights(c, 1)), lambda c: frac(weights(c, 2)))
    if kind == "greedy":
        return (lambda c: onehot(weights(c, 3)), lambda c: onehot(weights(c, 4)))
    if kind == "equal":
        return (lambda c: frac(weights(c, 5)), lambda c: frac(weights(c, 5)))
    if kind == "disjoint":  # the draft only proposes token 2, which the target never emits: beta = 0
        return (lambda c: frac(np.append(weights(c, 6)[:2] + 1, 0)), lambda c: (F(0), F(0), F(1)))
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["random", "greedy", "equal", "disjoint"])
@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_sequence_law_exact(kind, gamma):
    """All rounds enumerated with Fractions: the law of 5 generated ids == the target's chain-rule law."""
    P, Q = family(kind)
    spec = kit.speculative_distribution(P, Q, (0,), gamma, 5)
    assert {y: w for y, w in spec.items() if w} == kit.sequence_distribution(P, (0,), 5)


def test_round_law_exact_is_not_the_draft_law():
    """The check can fail: the round's law differs from the draft's own chain-rule law."""
    P, Q = family("random")
    spec = kit.speculative_distribution(P, Q, (0,), 2, 3)
    assert {y: w for y, w in spec.items() if w} != kit.sequence_distribution(Q, (0,), 3)


@pytest.mark.parametrize("kind", ["random", "greedy", "disjoint"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_sequence_law_through_accept(kind, gamma):
    """The same, with every round computed by npspec's accept (float64, atol 1e-12): 4 ids. accept on a
    block of g drafts equals g one-draft accepts on every box of its uniforms; the kit composes the rule."""
    P, Q = ((lambda c, f=f: np.array([float(x) for x in f(c)])) for f in family(kind))
    spec = kit.speculative_distribution(P, Q, (0,), gamma, 4, rule=ACCEPT_RULE)
    target = {y: float(w) for y, w in kit.sequence_distribution(family(kind)[0], (0,), 4).items()}
    for y in set(spec) | set(target):
        assert abs(spec.get(y, 0.0) - target.get(y, 0.0)) <= TOL, (y, spec.get(y, 0.0), target.get(y, 0.0))
    assert assert_blocks_are_one_draft_at_a_time(P, Q, (0,), gamma, 4, N_VOCAB) > 10


def adaptive_law(P, Q, prompt, n_new, more, outcome=None):
    """{emitted ids: probability} of n_new ids from rounds whose length the drafter decides draft by draft (exact).

    Before drafting d_i the drafter asks more(past, drafts): past = the ids before the round, drafts =
    d_1..d_{i-1}; False (or the budget: at most remaining - 1 drafts, as npspec's loop) ends the round with a
    bonus token from p. Each d_i ~ q is tested with kit.leviathan_rule: kept with probability a, else replaced
    from the residual. outcome(p_row, q_row, d, a) -> (P(kept), P(rejected)) models a drafter that breaks the
    rule: with the rest of the probability it takes d back after drawing it, and the target samples p there.
    """
    law = defaultdict(int)

    def new_round(seq, w):
        if len(seq) - len(prompt) == n_new:
            law[seq[len(prompt):]] += w
        else:
            position(seq, len(seq), w)

    def sample_p(seq, w):
        for y, py in enumerate(P(seq)):
            if py:
                new_round(seq + (y,), w * py)

    def position(seq, start, w):
        remaining = n_new - (start - len(prompt))
        if len(seq) - start >= remaining - 1 or not more(seq[:start], seq[start:]):
            return sample_p(seq, w)  # the bonus token (or a plain target step)
        prow, qrow = P(seq), Q(seq)
        for d, qd in enumerate(qrow):
            if not qd:
                continue
            a, r = kit.leviathan_rule(prow, qrow, d)
            kept, rejected = outcome(prow, qrow, d, a) if outcome else (a, 1 - a)
            back = 1 - kept - rejected
            if kept:
                position(seq + (d,), start, w * qd * kept)
            if rejected:
                for y, ry in enumerate(r):
                    if ry:
                        new_round(seq + (y,), w * qd * rejected * ry)
            if back:
                sample_p(seq, w * qd * back)

    new_round(tuple(prompt), F(1))
    return {y: w for y, w in law.items() if w}


DRAFT_LENGTHS = {
    "fixed gamma 3": lambda past, drafts: len(drafts) < 3,
    "from the past": lambda past, drafts: len(drafts) < 1 + (len(past) + sum(past)) % 3,  # gamma 1..3 by round
    "stop after a 2": lambda past, drafts: not drafts or drafts[-1] != 2,  # depends on the drafter's own samples
    "confidence": lambda past, drafts: len(drafts) < 5 and all(  # SpecDec++-like: its own q of what it drew
        family("random")[1](past + drafts[:i])[x] >= F(1, 3) for i, x in enumerate(drafts)),
}


@pytest.mark.parametrize("name", DRAFT_LENGTHS)
def test_draft_length_may_depend_on_the_past_and_the_drafts(name):
    """Claim 3 with a data-dependent gamma: whatever the drafter's stopping rule, so long as the decision to draw
    d_i uses only the past and d_1..d_{i-1}, the law of 5 emitted ids is the target's, exactly."""
    P, Q = family("random")
    law = adaptive_law(P, Q, (0,), 5, DRAFT_LENGTHS[name])
    assert law == kit.sequence_distribution(P, (0,), 5)
    if name == "fixed gamma 3":  # the enumerator agrees with the kit's own, which the loop replays
        assert law == {y: w for y, w in kit.speculative_distribution(P, Q, (0,), 3, 5).items() if w}


@pytest.mark.parametrize("outcome", [
    lambda p, q, d, a: (a, 0),  # an oracle: it ends the round where a draft would be rejected (reads the uniform)
    lambda p, q, d, a: (0, 0) if q[d] < F(1, 3) else (a, 1 - a),  # takes back a draft it is unsure of, once drawn
    lambda p, q, d, a: (0, 0) if p[d] < q[d] else (a, 1 - a),  # takes back a draft the round's target row dislikes
], ids=["oracle", "own-sample", "target-row"])
def test_draft_length_that_peeks_is_not_exact(outcome):
    """The check can fail: a drafter that decides about d_i after seeing d_i itself, the target's row of this
    round or the acceptance uniform changes the law (the emitted token is then not p at that position)."""
    P, Q = family("random")
    assert adaptive_law(P, Q, (0,), 3, DRAFT_LENGTHS["fixed gamma 3"], outcome) != kit.sequence_distribution(P, (0,), 3)
