"""notes/derivation.md, claim 4, when acceptance is NOT independent: E[tokens per round] <= 1 + gamma * alpha for
both meanings of alpha (the first position's P(d_1 kept), and the pooled kept / tested that npspec's Stats.alpha
estimates), exactly, by enumerating one round with context-dependent tables (every position, every context has
its own p and q, so the tests of a round are neither independent nor equally likely to pass).

The tables and the round are the kit's oracle (npspec.testing.oracle), as in tests/test_derivation.py.
"""

from collections import defaultdict
from fractions import Fraction as F

import pytest

from npspec import testing as kit
from npspec.decode.evaluate import expected_tokens_per_round

CASES = [(n_vocab, seed) for n_vocab in (2, 3) for seed in range(4)]


def first_round(p, q, gamma):
    """{(tested, kept): probability} of the first round of gamma drafts after the prompt (0,), its tests counted
    as the oracle's Round.drafted (the drafts up to the rejected one) and its kept drafts as Round.accepted."""
    law = defaultdict(F)
    for path in kit.speculative_paths(p, q, (0,), gamma, gamma + 1):
        r = path.rounds[0]
        law[len(r.drafted), r.accepted] += path.prob
    return dict(law)


@pytest.mark.parametrize("gamma", [2, 3, 4])
@pytest.mark.parametrize("n_vocab, seed", CASES)
def test_one_plus_gamma_alpha_bounds_tokens_per_round_under_dependent_acceptance(n_vocab, seed, gamma):
    p = kit.random_table(n_vocab, seed=seed, zero_prob=F(1, 5))
    q = kit.random_table(n_vocab, seed=seed + 100, zero_prob=F(1, 5))
    law = first_round(p, q, gamma)
    assert sum(law.values()) == 1
    tokens = 1 + sum(w * kept for (_, kept), w in law.items())
    tested = sum(w * t for (t, _), w in law.items())
    alpha_1 = sum(w for (_, kept), w in law.items() if kept >= 1)
    alpha = (tokens - 1) / tested  # E[accepted] / E[tested], the long-run Stats.alpha
    assert tokens <= 1 + gamma * alpha_1  # the first bullet: P(d_1..d_k kept) <= P(d_1 kept)
    assert tokens <= 1 + gamma * alpha  # the second: a round tests at most gamma drafts
    assert tested <= gamma


def test_the_dependent_cases_are_dependent_and_the_geometric_formula_is_no_bound_there():
    """The check above is not the i.i.d. case in disguise: in some of its cases the second test passes more often
    than the first given the first (so E[tokens] exceeds the geometric (1 - a^(g+1)) / (1 - a) at a = alpha_1),
    in others less often; 1 + gamma * alpha bounds both, the geometric formula neither."""
    above = below = 0
    for n_vocab, seed in CASES:
        p = kit.random_table(n_vocab, seed=seed, zero_prob=F(1, 5))
        q = kit.random_table(n_vocab, seed=seed + 100, zero_prob=F(1, 5))
        law = first_round(p, q, 2)
        tokens = 1 + sum(w * kept for (_, kept), w in law.items())
        alpha_1 = sum(w for (_, kept), w in law.items() if kept >= 1)
        if 0 < alpha_1 < 1:
            geometric = expected_tokens_per_round(alpha_1, 2)
            above += tokens > geometric
            below += tokens < geometric
    assert above and below
