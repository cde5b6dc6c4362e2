"""Speculative decoding gives EXACTLY the target's distribution (Leviathan et al. 2023, Theorem 3.5).

One oracle, three uses (npspec.testing): exact enumeration with fractions.Fraction on explicit
tables; the same enumeration in float64 on tiny GPT-2 models; and hypothesis properties on
random rows. Then every enumerated path is forced through npspec's real loop with injected
uniforms, so the loop is shown to make exactly the oracle's decisions.
"""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

from npspec import testing as kit
from npspec.sampling import residual, sample, warp
from npspec.speculative import accept, speculative_generate

from conftest import tiny_model

PROMPT = (0, 1)


def tables(n_vocab, truncation):
    """A target and a draft table (different random rows per context), with the same truncation."""
    base_p, base_q = kit.random_table(n_vocab, seed=10 + n_vocab), kit.random_table(n_vocab, seed=20 + n_vocab)
    return (lambda s: kit.truncate(base_p(s), **truncation)), (lambda s: kit.truncate(base_q(s), **truncation))


TRUNCATIONS = [{}, {"top_k": 2}, {"top_p": Fraction(2, 3)}, {"top_k": 3, "top_p": Fraction(9, 10)}]


@pytest.mark.parametrize("n_vocab", [3, 4, 5, 6])
@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=["none", "top_k2", "top_p2/3", "top_k3_top_p.9"])
def test_speculative_law_equals_target_law_exactly(n_vocab, truncation):
    """Every path of the loop, weighted exactly: the law of the output equals the target's, for
    gamma 1..4, max_new_tokens 1..4, with and without EOS, with n_ctx cutting the sequence."""
    p, q = tables(n_vocab, truncation)
    checked = 0
    for eos in (None, n_vocab - 1):
        for n_ctx in (None, len(PROMPT) + 2):
            for max_new_tokens in range(1, 5):
                target = kit.sequence_distribution(p, PROMPT, max_new_tokens, eos, n_ctx)
                assert sum(target.values()) == 1
                for gamma in range(1, 5):
                    spec = kit.speculative_distribution(p, q, PROMPT, gamma, max_new_tokens, eos, n_ctx)
                    assert spec == target, (eos, n_ctx, max_new_tokens, gamma)
                    checked += 1
    assert checked == 2 * 2 * 4 * 4


def test_enumeration_sees_eos_budget_and_context():
    """The oracle itself: output lengths are cut exactly as the loop cuts them."""
    p, q = tables(4, {})
    eos = next(i for i, v in enumerate(p(PROMPT)) if 0 < v < 1)  # a token the target may emit first
    lengths = {len(k) for k in kit.sequence_distribution(p, PROMPT, 4, eos)}
    assert min(lengths) == 1 and max(lengths) == 4  # EOS can end a sequence early
    assert all(k[-1] == eos for k in kit.sequence_distribution(p, PROMPT, 4, eos) if len(k) < 4)
    assert {len(k) for k in kit.sequence_distribution(p, PROMPT, 4, None, n_ctx=len(PROMPT) + 2)} == {2}
    for path in kit.speculative_paths(p, q, PROMPT, 4, 4, eos):
        assert len(path.ids) <= 4 and (len(path.ids) == 4 or path.ids[-1] == eos)
        for rnd in path.rounds:  # an accepted EOS ends its round with no target-produced token
            assert (rnd.token is None) == (rnd.accepted > 0 and rnd.drafted[rnd.accepted - 1] == eos)


def test_a_wrong_rule_gives_a_different_law():
    """The comparison can fail: sampling p instead of the residual after a rejection is visibly wrong."""
    p, q = tables(3, {})

    def no_residual(prow, qrow, x):
        return min(1, prow[x] / qrow[x]), list(prow)

    assert kit.speculative_distribution(p, q, PROMPT, 2, 3, rule=no_residual) != kit.sequence_distribution(p, PROMPT, 3)


# ---- the same enumeration in float64 on tiny GPT-2 models (5 tokens, so every path can be listed)

TOL = 1e-12  # float64: each path probability is a product of <= 13 factors, each a few roundings


@pytest.fixture(scope="module")
def gpt2_pair():
    target = tiny_model(seed=31, n_vocab=5, n_ctx=16, n_layer=2, eos_token_id=4)
    draft = tiny_model(seed=32, n_vocab=5, n_ctx=16, n_layer=1, eos_token_id=4)
    return target, draft


@pytest.mark.parametrize("warp_args", [dict(temperature=1.0), dict(temperature=0.6), dict(temperature=1.7, top_k=3),
                                       dict(temperature=1.3, top_p=0.8), dict(temperature=0.0)],
                         ids=["T1", "T0.6", "T1.7_k3", "T1.3_p0.8", "greedy"])
def test_float64_law_on_tiny_gpt2(gpt2_pair, warp_args):
    """Rows from real GPT-2 forwards, warped as npspec warps them; npspec's own residual (npspec_rule)."""
    target, draft = gpt2_pair
    p, q = kit.model_table(target, **warp_args), kit.model_table(draft, **warp_args)
    for eos in (None, 4):
        for max_new_tokens in (1, 2, 4):
            ref = kit.sequence_distribution(p, PROMPT, max_new_tokens, eos)
            assert abs(sum(ref.values()) - 1) <= TOL
            for gamma in (1, 2, 3, 4):
                spec = kit.speculative_distribution(p, q, PROMPT, gamma, max_new_tokens, eos, rule=kit.npspec_rule)
                assert max(abs(spec.get(k, 0) - ref.get(k, 0)) for k in set(spec) | set(ref)) <= TOL
                if warp_args["temperature"] == 0:
                    assert spec == ref and list(ref.values()) == [1.0]  # greedy: one path, exactly


# ---- every enumerated path, forced through npspec's real loop

def cell_midpoint(row, token):
    """A uniform u with sample(row, u) == token: the middle of its inverse-CDF interval."""
    cdf = np.cumsum(row)
    lo = cdf[token - 1] if token else 0.0
    u = (lo + cdf[token]) / 2 / cdf[-1]
    assert sample(row, u) == token
    return u


def forcing_uniforms(path, p, q, prompt, gamma, max_new_tokens):
    """The uniforms that make npspec's loop follow `path`, in its documented order, and each round's g."""
    seq, values, sizes = tuple(prompt), [], []
    for rnd in path.rounds:
        g = min(gamma, max_new_tokens - (len(seq) - len(prompt)) - 1)
        drafts, accepts = [0.5] * g, [0.5] * g
        for i, x in enumerate(rnd.drafted):
            ctx = seq + rnd.drafted[:i]
            drafts[i] = cell_midpoint(q(ctx), x)
            ratio = p(ctx)[x] / q(ctx)[x]
            accepts[i] = min(ratio, 1.0) / 2 if i < rnd.accepted else (ratio + 1) / 2
        final = 0.5
        if rnd.token is not None:
            ctx = seq + rnd.drafted[:rnd.accepted]
            rejected = rnd.accepted < len(rnd.drafted)
            row = residual(p(ctx), q(ctx)) if rejected else p(ctx)
            final = cell_midpoint(row, rnd.token)
        values += drafts + accepts + [final]
        sizes.append(2 * g + 1)
        seq += rnd.drafted[:rnd.accepted] + ((rnd.token,) if rnd.token is not None else ())
    return values, sizes


@pytest.mark.parametrize("gamma, max_new_tokens, eos", [(1, 3, None), (2, 3, 2), (3, 4, None), (4, 4, 2)])
def test_every_path_replays_through_the_real_loop(gamma, max_new_tokens, eos):
    """For every path the oracle enumerates, uniforms at the middle of its cells drive
    speculative_generate down the same path: same ids, same rounds (drafts, accepted count,
    corrected or bonus token), 2g + 1 uniforms per round with g clamped as documented."""
    p_exact, q_exact = tables(3, {})
    target = kit.TableModel.from_table(p_exact, 3, eos_token_id=eos)
    draft = kit.TableModel.from_table(q_exact, 3, eos_token_id=eos)
    p, q = kit.model_table(target), kit.model_table(draft)  # float64 rows exactly as the loop sees them
    paths = list(kit.speculative_paths(p, q, PROMPT, gamma, max_new_tokens, eos, rule=kit.npspec_rule))
    rounds = [rnd for path in paths for rnd in path.rounds]
    assert any(rnd.token is not None and rnd.accepted < len(rnd.drafted) for rnd in rounds)  # a rejection
    full = min(gamma, max_new_tokens - 1)
    assert any(rnd.token is not None and rnd.accepted == len(rnd.drafted) == full for rnd in rounds)  # a bonus
    assert eos is None or any(rnd.token is None for rnd in rounds)  # an accepted EOS
    for path in paths:
        values, sizes = forcing_uniforms(path, p, q, PROMPT, gamma, max_new_tokens)
        rng = kit.ScriptedRng(values)
        gen = speculative_generate(target, draft, list(PROMPT), max_new_tokens, gamma=gamma, temperature=1.0,
                                   rng=rng, trace=True)
        assert tuple(gen.ids) == path.ids
        assert rng.sizes == sizes and not rng.values
        assert len(gen.trace) == len(path.rounds)
        for rec, rnd in zip(gen.trace, path.rounds):
            assert rec["accepted"] == rnd.accepted and rec["token"] == rnd.token
            assert tuple(rec["drafted"][: len(rnd.drafted)]) == rnd.drafted


# ---- properties on random rows (hypothesis), the same checker

ATOL = 1e-12  # float64: every quantity is a handful of operations on numbers in [0, 1]


def one_step_law(p, q):  # [n], [n] -> [n]: the law of the first emitted token, q*min(1, p/q) + (1 - beta)*residual
    with np.errstate(over="ignore"):  # a denormal q gives p/q = inf, and min(1, inf) = 1
        a = np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 0.0)
    beta = np.minimum(p, q).sum()
    return q * a + (1 - beta) * residual(p, q)


@given(kit.probability_pairs())
def test_one_step_law(pq):
    """q*min(1, p/q) + (1 - beta)*residual == p (Leviathan et al. 2023, Theorem 3.5), incl. zeros,
    one-hot rows, p == q, disjoint supports, near-denormal entries and a zero-mass residual."""
    p, q = pq
    np.testing.assert_allclose(one_step_law(p, q), p, rtol=0, atol=ATOL)


@given(kit.probability_pairs(max_size=5))
def test_one_round_law_by_enumeration(pq):
    """The same statement through the oracle: one round of gamma = 1, then the target, equals the target."""
    p, q = pq
    pt, qt = kit.constant_table(p), kit.constant_table(q)
    got = kit.round_distribution(pt, qt, (0,), 1, rule=kit.npspec_rule)
    assert kit.total_variation(got, kit.sequence_distribution(pt, (0,), 2)) <= ATOL


@given(kit.probability_pairs())
def test_residual_is_a_distribution(pq):
    """residual(p, q) is finite, >= 0 and sums to 1 (in particular whenever beta < 1): norm(max(0, p - q))
    when that has mass, else p. (In float64 beta can round to 1 while max(0, p - q) keeps a denormal mass.)"""
    p, q = pq
    r = residual(p, q)
    assert np.all(np.isfinite(r)) and np.all(r >= 0) and abs(r.sum() - 1) <= ATOL
    if np.maximum(p - q, 0).sum() > 0:
        np.testing.assert_allclose(r, np.maximum(p - q, 0) / np.maximum(p - q, 0).sum(), rtol=0, atol=ATOL)
    else:
        assert r is p


@given(kit.probability_pairs(max_size=5))
def test_acceptance_probability_is_beta(pq):
    """P(accept) = sum_x q(x) min(1, p(x)/q(x)) = beta = sum(min(p, q)) = 1 - TV(p, q), from the enumerated paths."""
    p, q = pq
    paths = kit.speculative_paths(kit.constant_table(p), kit.constant_table(q), (0,), 1, 2, rule=kit.npspec_rule)
    accepted = sum(path.prob for path in paths if path.rounds[0].accepted == 1)
    beta = np.minimum(p, q).sum()
    assert abs(accepted - beta) <= ATOL
    assert abs(beta - (1 - 0.5 * np.abs(p - q).sum())) <= ATOL


@given(kit.probability_pairs(), st.sampled_from([0.0, 0.5, kit.ONE_BELOW]), st.sampled_from([0.0, 0.5, kit.ONE_BELOW]))
def test_no_nan_reaches_a_sampler_in_accept(pq, u_accept, u_final):
    """accept() on any rows returns a token the target can emit, never NaN or an out-of-range id."""
    p, q = pq
    for x in np.flatnonzero(q):
        n, token = accept(np.array([x]), np.stack([p, p]), q[None], np.array([u_accept]), u_final)
        assert n in (0, 1) and 0 <= token < len(p) and p[token] > 0
        assert n == 1 or u_accept >= p[x] / q[x]  # strict: rejected only when u >= p/q


@given(st.integers(2, 8).flatmap(lambda n: st.tuples(kit.logits_rows(size=n), kit.logits_rows(size=n))),
       st.sampled_from([0.0, 1e-300, 0.3, 1.0, 5.0, 1e300]), st.integers(0, 3), st.sampled_from([1.0, 0.9, 0.5, 1e-9]))
def test_no_nan_reaches_a_sampler_from_logits(rows, temperature, top_k, top_p):
    """warp() of rows with -inf, +/-10 and wide values, at any temperature, gives finite rows summing to 1;
    sampling and accept then only return ids of positive probability."""
    p, q = (warp(row, temperature, top_k, top_p) for row in rows)
    for row in (p, q):
        assert np.all(np.isfinite(row)) and np.all(row >= 0) and abs(row.sum() - 1) <= ATOL
    for u in (0.0, 0.5, kit.ONE_BELOW):
        x = sample(q, u)
        assert q[x] > 0
        _, token = accept(np.array([x]), np.stack([p, p]), q[None], np.array([u]), u)
        assert p[token] > 0


@pytest.mark.parametrize("row", [[np.nan, 0.0], [np.inf, 0.0], [-np.inf, -np.inf]])
def test_warp_refuses_rows_with_nothing_to_sample(row):
    with pytest.raises(ValueError, match="NaN or \\+inf, or a row is entirely -inf"):
        warp(np.array(row, dtype=np.float32))
