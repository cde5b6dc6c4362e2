"""Claims 4 and 5 of notes/derivation.md, checked numerically: the expected tokens per round under i.i.d.
acceptance (npspec.decode.evaluate.expected_tokens_per_round, npspec's Stats.alpha) and the speedup model
(npspec.decode.evaluate.predicted_speedup). Exact Fractions throughout; the rounds come from test_one_step's oracle."""

import itertools
from fractions import Fraction as F

import numpy as np
import pytest

from npspec.decode.evaluate import expected_tokens_per_round, predicted_speedup
from npspec.decode import Stats

from test_one_step import accept_law

TOL = 1e-12


# ---- claim 4: expected tokens per round under i.i.d. acceptance --------------------------------

ALPHAS = [F(0), F(1, 7), F(1, 2), F(4, 5), F(99, 100), F(1)]


def tokens_per_round_iid(alpha, gamma):
    """E[tokens per round] by enumeration: n leading accepts (alpha^n (1 - alpha), or alpha^gamma), then one token."""
    return sum((n + 1) * alpha**n * (1 - alpha) for n in range(gamma)) + (gamma + 1) * alpha**gamma


def test_expected_tokens_per_round_exact():
    for alpha in ALPHAS:
        for gamma in range(9):
            assert tokens_per_round_iid(alpha, gamma) == expected_tokens_per_round(alpha, gamma)


def test_one_plus_gamma_alpha_gap():
    """1 + gamma*alpha - E = sum_{k=1..gamma} (alpha - alpha^k) >= 0, zero iff gamma <= 1 or alpha in {0, 1}."""
    for alpha in ALPHAS:
        for gamma in range(9):
            gap = 1 + gamma * alpha - expected_tokens_per_round(alpha, gamma)
            assert gap == sum(alpha - alpha**k for k in range(1, gamma + 1))
            assert gap >= 0 and (gap == 0) == (gamma <= 1 or alpha in (0, 1))


def test_expected_tokens_through_accept():
    """npspec's accept on rows with acceptance probability alpha at every position: E[n + 1] = closed form."""
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for gamma in range(5):
            q = np.tile([1.0, 0.0, 0.0], (gamma, 1))  # the draft always proposes token 0 ...
            p = np.tile([alpha, 1 - alpha, 0.0], (gamma + 1, 1))  # ... which p keeps w.p. alpha
            expected = sum(w * len(y) for y, w in accept_law([0] * gamma, p, q).items())
            assert abs(expected - float(expected_tokens_per_round(F(alpha), gamma))) <= TOL


def test_npspec_alpha_is_a_ratio_of_expectations():
    """Under i.i.d. acceptance E[accepted] / E[accepted + rejected] == alpha exactly (npspec's Stats.alpha);
    accepted / drafted (Stats.draft_acceptance) is biased low for gamma >= 2."""
    for alpha in ALPHAS[1:-1]:
        for gamma in range(1, 9):
            accepted = sum(alpha**k for k in range(1, gamma + 1))  # E[leading accepts] = sum P(n >= k)
            rejected = 1 - alpha**gamma  # at most one rejection per round
            assert accepted / (accepted + rejected) == alpha
            assert (accepted / gamma < alpha) == (gamma >= 2)


@pytest.mark.parametrize("alpha", [F(1, 2), F(1, 7), F(4, 5)])
@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_stats_alpha_counts_rounds_as_the_ratio_of_expectations(alpha, gamma):
    """npspec's Stats, fed every round of an exact enumeration (each of the b**gamma equally likely patterns of
    gamma tests kept in a of b cases, alpha = a/b), through record_round as the loop records a round: Stats.alpha
    is exactly alpha, and draft_acceptance (accepted / drafted) is below it for gamma >= 2."""
    a, b = alpha.numerator, alpha.denominator
    stats = Stats()
    for pattern in itertools.product(range(b), repeat=gamma):
        n = next((i for i, t in enumerate(pattern) if t >= a), gamma)  # leading draws with t < a are kept
        stats.drafted += gamma
        stats.record_round(gamma, n + (n < gamma), n)
    assert stats.rounds == b ** gamma and stats.alpha == float(alpha)
    assert (stats.draft_acceptance < stats.alpha) == (gamma >= 2)


# ---- claim 5: the speedup model, predicted_speedup(alpha, gamma, c, v) with v = v(gamma) ---------

def best_gamma(alpha, c, v, gamma_max=32):
    """The smallest gamma in 0..gamma_max with the largest modelled speedup; v(g) = t_target(g+1) / t_target(1)."""
    s = [predicted_speedup(alpha, g, c, v(g)) for g in range(gamma_max + 1)]
    return s.index(max(s))


GRID_ALPHA = [F(k, 20) for k in range(1, 20)]
GRID_C = [F(0), F(1, 100), F(1, 20), F(1, 5), F(1, 2), F(1)]


def test_speedup_is_leviathan_at_v1():
    """v = 1 gives Leviathan et al.'s (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + 1))."""
    for alpha in GRID_ALPHA:
        for c in GRID_C:
            for gamma in range(8):
                assert predicted_speedup(alpha, gamma, c, 1) == \
                    (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))


def test_speedup_is_tokens_over_time_of_a_round():
    """Renewal-reward: long-run tokens/s over plain tokens/s, from enumerated rounds and a cost table."""
    t1 = F(3)  # seconds for one target position (any unit)
    t_target = {n: t1 * (1 + F(n - 1, 4)) for n in range(1, 10)}  # a made-up affine cost table
    t_draft = F(1, 5)
    for alpha in GRID_ALPHA:
        for gamma in range(8):
            seconds_per_round, plain_tokens_per_s = gamma * t_draft + t_target[gamma + 1], 1 / t_target[1]
            assert (tokens_per_round_iid(alpha, gamma) / seconds_per_round) / plain_tokens_per_s == \
                predicted_speedup(alpha, gamma, t_draft / t1, t_target[gamma + 1] / t_target[1])


def test_affine_verify_cost_is_a_larger_c():
    """v(gamma) = 1 + k*gamma is Leviathan's model with c' = c + k."""
    for alpha in GRID_ALPHA[::3]:
        for c in GRID_C:
            for k in (F(0), F(1, 10), F(1, 2), F(1)):
                for gamma in range(8):
                    affine = predicted_speedup(alpha, gamma, c, 1 + k * gamma)
                    assert affine == predicted_speedup(alpha, gamma, c + k, 1)


def test_compute_bound_verify_never_speeds_up():
    """If v(gamma) >= gamma + 1 (verifying costs gamma+1 separate forwards) and c > 0, speedup < 1 for gamma >= 1."""
    for alpha in [*GRID_ALPHA, F(1)]:
        for c in GRID_C[1:]:
            for gamma in range(1, 10):
                assert predicted_speedup(alpha, gamma, c, gamma + 1) < 1
    assert predicted_speedup(F(1), 4, F(0), 4 + 1) == 1  # the bound is tight only for a free, perfect draft


def test_some_gamma_pays_iff_alpha_above_c_plus_k():
    """With v(gamma) = 1 + k*gamma, some gamma >= 1 beats plain decoding iff alpha > c + k
    (E_gamma <= 1 + gamma*alpha bounds every gamma; gamma = 1 attains it)."""
    for alpha in GRID_ALPHA:
        for c in GRID_C:
            for k in (F(0), F(1, 20), F(1, 4)):
                pays = max(predicted_speedup(alpha, g, c, 1 + k * g) for g in range(1, 33)) > 1
                assert pays == (alpha > c + k)


def test_break_even_for_one_draft():
    """gamma = 1 beats plain decoding iff alpha > c + v(1) - 1."""
    for alpha in GRID_ALPHA:
        for c in GRID_C:
            for v1 in (F(1), F(11, 10), F(3, 2), F(2)):
                assert (predicted_speedup(alpha, 1, c, v1) > 1) == (alpha > c + v1 - 1)


def test_marginal_draft_rule():
    """Adding draft gamma+1 helps iff alpha^(gamma+1) / E_gamma > (c + v(gamma+1) - v(gamma)) / (gamma*c + v(gamma))."""
    v = lambda g: 1 + F(g, 8) + F(g * g, 200)  # convex, made up
    for alpha in GRID_ALPHA:
        for c in GRID_C:
            for g in range(10):
                better = predicted_speedup(alpha, g + 1, c, v(g + 1)) > predicted_speedup(alpha, g, c, v(g))
                rule = alpha ** (g + 1) / expected_tokens_per_round(alpha, g) > (c + v(g + 1) - v(g)) / (g * c + v(g))
                assert better == rule


def test_best_gamma_monotone():
    """The best gamma never decreases as alpha grows, and never increases as c grows when v(gamma)/gamma
    is nonincreasing (monotone comparative statics; Topkis)."""
    # v(g)/g is nonincreasing for each: free verify, affine, and concave (saturating) cost
    tables = [lambda g: 1, lambda g: 1 + F(g, 3), lambda g: 1 + F(4 * g, 4 + g)]
    seen = set()
    for v in tables:
        for c in GRID_C:
            best = [best_gamma(alpha, c, v) for alpha in GRID_ALPHA]
            assert best == sorted(best)
            seen.update(best)
        for alpha in GRID_ALPHA:
            best = [best_gamma(alpha, c, v) for c in GRID_C[1:]]
            assert best == sorted(best, reverse=True)
    assert len(seen) > 5  # the grid exercises many different optima


def test_best_gamma_never_grows_with_c_for_any_verify_cost():
    """Claim 5: a costlier draft never makes a longer round best, whatever the measured v, even where
    v(gamma)/gamma increases (Topkis' condition fails). The lemma: E_g'/E_g <= (g' + 1)/(g + 1) < g'/g for
    g' > g >= 1, so a longer round with the larger v(g)/g never wins, and against one with the smaller,
    its relative cost (g' c + v')/(g c + v) only grows with c. Exact, on superlinear, jumpy and
    decreasing tables, and on random ones."""
    for alpha in GRID_ALPHA + [F(1)]:
        for g in range(1, 9):
            for h in range(g + 1, 10):
                assert expected_tokens_per_round(alpha, h) / expected_tokens_per_round(alpha, g) < F(h, g)
    rng = np.random.default_rng(11)
    tables = [lambda g: 1 + F(g * g, 6), lambda g: 1 + F(g, 10) + (F(3, 2) if g >= 3 else 0),
              lambda g: F(1, 1 + g) if g else 1]  # superlinear; a jump (v/g rises from 2 to 3); decreasing
    tables += [lambda g, w=tuple(F(int(x), 8) for x in rng.integers(8, 40, 9)): w[g] if g else 1 for _ in range(20)]
    grid_c = GRID_C + [F(2), F(5)]
    rising = 0
    for v in tables:
        rising += any(v(g + 1) * g > v(g) * (g + 1) for g in range(1, 8))  # Topkis' condition fails
        for alpha in GRID_ALPHA[::3] + [F(99, 100)]:
            best = [best_gamma(alpha, c, v, gamma_max=8) for c in grid_c]
            assert best == sorted(best, reverse=True), (alpha, best)
    assert rising >= 10


def test_best_gamma_is_zero_when_drafting_cannot_pay():
    for alpha in GRID_ALPHA:
        assert best_gamma(alpha, F(1), lambda g: 1) == 0  # a draft as slow as the target never pays
        assert best_gamma(alpha, F(1, 100), lambda g: g + 1) == 0  # nor does a compute-bound verify
