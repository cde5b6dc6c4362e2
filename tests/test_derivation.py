"""The claims of notes/derivation.md, checked numerically (issue 6).

Letters are Leviathan's: `p` the target, `q` the draft. Two kinds of check:
  * exact: `Fraction` arithmetic over enumerated distributions and every outcome of a round, so
    an equality is an equality;
  * through npspec: the law of `npspec.speculative.accept`'s output, computed without sampling.
    accept is a function of its uniforms, constant on boxes: u_i < cut_i or not, and u_final
    inside one CDF interval of the distribution it samples from. `accept_law` calls accept once
    at the midpoint of every box and weighs the answer by the box's volume, so the result is the
    exact law up to float64 rounding (tolerance 1e-12). The CDF cuts come from this file's own
    formula for the residual, not from npspec's, so a sampler that used another distribution would
    straddle cuts and fail.
"""

import itertools
from collections import defaultdict
from fractions import Fraction as F
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from npspec.sampling import residual, warp
from npspec.speculative import Stats, accept

# ---- exact math (Fractions) -------------------------------------------------------------------


def simplex(n_vocab, denominator):
    """Every probability vector over n_vocab tokens with entries k / denominator, as Fractions."""
    for cut in itertools.combinations(range(denominator + n_vocab - 1), n_vocab - 1):
        parts = np.diff([-1, *cut, denominator + n_vocab - 1]) - 1  # stars and bars
        yield tuple(F(int(k), denominator) for k in parts)


def exact_residual(p, q):
    """norm(max(0, p - q)); p itself when that mass is 0 (p == q: a rejection never happens)."""
    r = [max(a - b, 0) for a, b in zip(p, q)]
    mass = sum(r)
    return [x / mass for x in r] if mass else list(p)


def one_step_law(p, q, resid=exact_residual):
    """Law of the token one step emits: draft x ~ q, keep it w.p. min(1, p/q), else sample the residual."""
    law = [F(0)] * len(p)
    rejected = F(0)
    for x, qx in enumerate(q):
        if qx:
            keep = min(F(1), p[x] / qx)
            law[x] += qx * keep
            rejected += qx * (1 - keep)
    return [a + rejected * r for a, r in zip(law, resid(p, q))]


def round_law(P, Q, s, g):
    """Exact law of what one round emits at prefix s with g drafts: {emitted ids: probability}.

    P(ctx), Q(ctx): the target's and the draft's next-token distributions (Fractions) after ctx.
    """
    law = defaultdict(F)

    def go(d, w):
        p = P(s + d)
        if len(d) == g:  # every draft kept: the bonus token from p_{g+1}
            for z, pz in enumerate(p):
                law[d + (z,)] += w * pz
            return
        q = Q(s + d)
        r = exact_residual(p, q)
        for x, qx in enumerate(q):
            if not qx:
                continue
            keep = min(F(1), p[x] / qx)
            if keep:
                go(d + (x,), w * qx * keep)
            if keep < 1:
                for z, rz in enumerate(r):
                    law[d + (z,)] += w * qx * (1 - keep) * rz

    go((), F(1))
    return law


def sequence_law(round_law_at, s, n, gamma):
    """Law of the next n ids of speculative generation from prefix s, round after round.

    Each round uses g = min(gamma, n_left - 1) drafts, as speculative_generate clamps it.
    round_law_at(s, g) -> {emitted ids: probability}.
    """
    @lru_cache(maxsize=None)
    def go(s, n):
        if n == 0:
            return {(): 1}
        out = defaultdict(int)
        for y, w in round_law_at(s, min(gamma, n - 1)).items():
            for rest, w2 in go(s + y, n - len(y)).items():
                out[y + rest] += w * w2
        return dict(out)

    return go(tuple(s), n)


def target_law(P, s, n):
    """Law of n ids sampled from the target alone: prod_t p(y_t | s, y_<t) (the chain rule)."""
    law = {(): 1}
    for _ in range(n):
        law = {y + (z,): w * pz for y, w in law.items() for z, pz in enumerate(P(tuple(s) + y)) if pz}
    return law


# ---- the law of npspec's accept, by quadrature over its uniforms --------------------------------


def cdf_cells(dists):
    """[0, 1) cut at every CDF breakpoint of the given distributions: a list of (lo, hi)."""
    cuts = {0.0, 1.0}
    for dist in dists:
        cuts.update(float(c) for c in np.cumsum(dist) / np.sum(dist) if 0 < c < 1)
    cuts = sorted(cuts)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def accept_law(d, p, q, accept=accept):
    """Law of (d[:n] + [token]) for n, token = accept(d, p, q, U, u), U ~ U[0,1)^g, u ~ U[0,1).

    d `[g]` ids, p `[g + 1, n_vocab]`, q `[g, n_vocab]` float64. Returns {emitted ids: probability}.
    """
    d = np.asarray(d, dtype=np.int64)
    g = len(d)
    cut = np.minimum(p[np.arange(g), d] / q[np.arange(g), d], 1.0)  # u_i < cut_i keeps d_i
    resid = [np.maximum(p[i] - q[i], 0.0) for i in range(g)]
    cells = cdf_cells([*p, *(r for r in resid if r.sum() > 0)])
    law = defaultdict(float)
    for kept in itertools.product((True, False), repeat=g):
        lo, hi = np.where(kept, 0.0, cut), np.where(kept, cut, 1.0)
        volume = float(np.prod(hi - lo))
        if volume == 0:
            continue
        for a, b in cells:
            n, token = accept(d, p, q, (lo + hi) / 2, (a + b) / 2)
            law[tuple(int(x) for x in d[:n]) + (int(token),)] += volume * (b - a)
    return dict(law)


def accept_round_law(P, Q, n_vocab):
    """round_law_at(s, g) for sequence_law, computed through npspec's accept (float64 P, Q)."""
    def at(s, g):
        law = defaultdict(float)
        for d in itertools.product(range(n_vocab), repeat=g):
            q = np.array([Q(s + d[:i]) for i in range(g)]).reshape(g, n_vocab)
            w = float(np.prod(q[np.arange(g), list(d)]))  # probability the draft proposes d
            if w == 0:
                continue
            p = np.array([P(s + d[:i]) for i in range(g + 1)])
            for y, wy in accept_law(d, p, q).items():
                law[y] += w * wy
        return law
    return at


# ---- small context-dependent "models" ---------------------------------------------------------

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

    def onehot(w):  # temperature 0: one-hot on the argmax, lowest id on ties (npspec.sampling.warp)
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


def as_float(P):
    return lambda c: np.array([float(x) for x in P(c)])


def assert_laws_close(a, b, atol=1e-12):
    for y in set(a) | set(b):
        assert abs(a.get(y, 0.0) - b.get(y, 0.0)) <= atol, (y, a.get(y, 0.0), b.get(y, 0.0))


# ---- claim 1: one accept/reject step preserves p ----------------------------------------------


def test_one_step_law_exact():
    """Every pair (p, q) on the 3-token grid of step 1/4 and the 4-token grid of step 1/3: law == p exactly."""
    pairs = 0
    for n_vocab, denominator in ((3, 4), (4, 3)):
        grid = list(simplex(n_vocab, denominator))
        for p in grid:
            for q in grid:
                assert one_step_law(p, q) == list(p)
                pairs += 1
    assert pairs == 15**2 + 20**2  # the grids really are exhaustive


def test_residual_matches_npspec():
    """npspec.sampling.residual equals the exact norm(max(0, p - q)) to float64 rounding, and p where p == q."""
    grid = list(simplex(4, 5))
    for p in grid:
        for q in grid:
            got = residual(np.array(p, dtype=np.float64), np.array(q, dtype=np.float64))
            np.testing.assert_allclose(got, [float(x) for x in exact_residual(p, q)], rtol=0, atol=1e-15)


def first_token_law(p, q, accept=accept):
    """Law of the first token accept emits for one draft d ~ q (p's second row is the unused bonus row)."""
    law = np.zeros(len(p))
    for x in np.flatnonzero(q > 0):
        for y, w in accept_law([x], np.stack([p, p]), q[None], accept).items():
            law[y[0]] += q[x] * w
    return law


def check_step_through_accept(p, q):
    """The first emitted token of npspec's accept, with d ~ q, is p-distributed (float64, atol 1e-12)."""
    np.testing.assert_allclose(first_token_law(p, q), p, rtol=0, atol=1e-12)


def test_one_step_law_through_accept():
    grid = [np.array(v, dtype=np.float64) for v in simplex(3, 4)]
    for p in grid:
        for q in grid:
            check_step_through_accept(p, q)


probability_vectors = st.integers(2, 7).flatmap(
    lambda n: st.tuples(*[arrays(np.float64, n, elements=st.one_of(st.just(0.0), st.floats(1e-9, 1.0)))] * 2))


@given(probability_vectors)
def test_one_step_law_through_accept_random(pq):
    p, q = (v / v.sum() if v.sum() > 0 else np.eye(len(v))[0] for v in pq)
    check_step_through_accept(p, q)


def test_the_checks_can_fail():
    """Sampling p instead of the residual after a rejection: the exact law and the quadrature both see it."""
    wrong = lambda p, q: list(p)
    grid = list(simplex(3, 4))
    assert sum(one_step_law(p, q, wrong) != list(p) for p in grid for q in grid) > 100

    def accept_without_residual(d, p, q, u_accept, u_final):
        n, _ = accept(d, p, q, u_accept, u_final)
        from npspec.sampling import sample
        return n, sample(p[n], u_final)

    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.75, 0.0, 0.25])
    law = first_token_law(p, q, accept_without_residual)
    np.testing.assert_allclose(law, [0.75, 0.25, 0.0], rtol=0, atol=1e-12)  # != p
    np.testing.assert_allclose(first_token_law(p, q), p, rtol=0, atol=1e-12)


# ---- claim 2: beta = sum(min(p, q)) = 1 - TV(p, q) is the acceptance probability --------------------


def test_beta_is_one_minus_tv():
    grid = list(simplex(4, 4))
    for p in grid:
        for q in grid:
            beta = sum(min(a, b) for a, b in zip(p, q))
            tv = sum(abs(a - b) for a, b in zip(p, q)) / 2
            accept_probability = sum(qx * min(F(1), px / qx) for px, qx in zip(p, q) if qx)
            assert beta == 1 - tv == accept_probability
            assert 1 - beta == sum(max(a - b, 0) for a, b in zip(p, q))  # the residual's mass


def test_acceptance_probability_is_beta_through_accept():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p, q = rng.dirichlet(np.full(5, 0.5), size=2)
        p[rng.integers(5)] = 0.0  # exact zeros on both sides
        q[rng.integers(5)] = 0.0
        p, q = p / p.sum(), q / q.sum()
        kept = sum(q[x] * sum(w for y, w in accept_law([x], np.stack([p, p]), q[None]).items() if len(y) == 2)
                   for x in np.flatnonzero(q > 0))
        assert abs(kept - np.minimum(p, q).sum()) <= 1e-12


# ---- claim 3: a whole round, and a whole sequence ----------------------------------------------


@pytest.mark.parametrize("kind", ["random", "greedy", "equal", "disjoint"])
@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_sequence_law_exact(kind, gamma):
    """All rounds enumerated with Fractions: the law of 5 generated ids == the target's chain-rule law."""
    P, Q = family(kind)
    spec = sequence_law(lambda s, g: round_law(P, Q, s, g), (0,), 5, gamma)
    assert {y: w for y, w in spec.items() if w} == target_law(P, (0,), 5)


def test_round_law_exact_is_not_the_draft_law():
    """The check can fail: the round's law differs from the draft's own chain-rule law."""
    P, Q = family("random")
    spec = sequence_law(lambda s, g: round_law(P, Q, s, g), (0,), 3, 2)
    assert {y: w for y, w in spec.items() if w} != target_law(Q, (0,), 3)


@pytest.mark.parametrize("kind", ["random", "greedy", "disjoint"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_sequence_law_through_accept(kind, gamma):
    """The same, with every round computed by npspec's accept (float64, atol 1e-12): 4 ids."""
    P, Q = (as_float(f) for f in family(kind))
    spec = sequence_law(accept_round_law(P, Q, N_VOCAB), (0,), 4, gamma)
    target = {y: float(w) for y, w in target_law(family(kind)[0], (0,), 4).items()}
    assert_laws_close(spec, target)


# ---- claim 4: expected tokens per round under i.i.d. acceptance --------------------------------

ALPHAS = [F(0), F(1, 7), F(1, 2), F(4, 5), F(99, 100), F(1)]


def tokens_per_round_iid(alpha, gamma):
    """E[tokens per round] by enumeration: n leading accepts (alpha^n (1 - alpha), or alpha^gamma), then one token."""
    return sum((n + 1) * alpha**n * (1 - alpha) for n in range(gamma)) + (gamma + 1) * alpha**gamma


def closed_form(alpha, gamma):
    return gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def test_expected_tokens_per_round_exact():
    for alpha in ALPHAS:
        for gamma in range(9):
            assert tokens_per_round_iid(alpha, gamma) == closed_form(alpha, gamma)


def test_one_plus_gamma_alpha_gap():
    """1 + gamma*alpha - E = sum_{k=1..gamma} (alpha - alpha^k) >= 0, zero iff gamma <= 1 or alpha in {0, 1}."""
    for alpha in ALPHAS:
        for gamma in range(9):
            gap = 1 + gamma * alpha - closed_form(alpha, gamma)
            assert gap == sum(alpha - alpha**k for k in range(1, gamma + 1))
            assert gap >= 0 and (gap == 0) == (gamma <= 1 or alpha in (0, 1))
            # 1 + gamma*alpha is exact when acceptance is all-or-nothing (the gamma tests perfectly correlated)
            assert alpha * (gamma + 1) + (1 - alpha) * 1 == 1 + gamma * alpha


def test_expected_tokens_through_accept():
    """npspec's accept on rows with acceptance probability alpha at every position: E[n + 1] = closed form."""
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for gamma in range(5):
            q = np.tile([1.0, 0.0, 0.0], (gamma, 1))  # the draft always proposes token 0 ...
            p = np.tile([alpha, 1 - alpha, 0.0], (gamma + 1, 1))  # ... which p keeps w.p. alpha
            law = accept_law([0] * gamma, p, q)
            expected = sum(w * len(y) for y, w in law.items())
            assert abs(expected - float(closed_form(F(alpha), gamma))) <= 1e-12


def test_npspec_alpha_is_a_ratio_of_expectations():
    """Under i.i.d. acceptance E[accepted] / E[accepted + rejected] == alpha exactly (npspec's Stats.alpha);
    accepted / drafted (Stats.draft_acceptance) is biased low for gamma >= 2."""
    for alpha in ALPHAS[1:-1]:
        for gamma in range(1, 9):
            accepted = sum(alpha**k for k in range(1, gamma + 1))  # E[leading accepts] = sum P(n >= k)
            rejected = 1 - alpha**gamma  # at most one rejection per round
            assert accepted / (accepted + rejected) == alpha
            assert (accepted / gamma < alpha) == (gamma >= 2)
            # and the same through npspec's Stats with these expected counts per round
            s = Stats(accepted=accepted, rejected=rejected, drafted=gamma)
            assert s.alpha == alpha


# ---- claim 5: the speedup model ----------------------------------------------------------------


def speedup(alpha, gamma, c, v):
    """E[tokens/round] / (gamma*c + v(gamma)); v is a function gamma -> t_target(gamma+1) / t_target(1)."""
    return closed_form(alpha, gamma) / (gamma * c + v(gamma))


def best_gamma(alpha, c, v, gamma_max=32):
    """The smallest gamma in 0..gamma_max with the largest modelled speedup."""
    s = [speedup(alpha, g, c, v) for g in range(gamma_max + 1)]
    return s.index(max(s))


GRID_ALPHA = [F(k, 20) for k in range(1, 20)]
GRID_C = [F(0), F(1, 100), F(1, 20), F(1, 5), F(1, 2), F(1)]


def test_speedup_is_leviathan_at_v1():
    """v = 1 gives Leviathan et al.'s (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + 1))."""
    for alpha in GRID_ALPHA:
        for c in GRID_C:
            for gamma in range(8):
                assert speedup(alpha, gamma, c, lambda g: 1) == \
                    (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))


def test_speedup_is_tokens_over_time_of_a_round():
    """Renewal-reward: long-run tokens/s over plain tokens/s, from enumerated rounds and a cost table."""
    t1 = F(3)  # seconds for one target position (any unit)
    t_target = {n: t1 * (1 + F(n - 1, 4)) for n in range(1, 10)}  # a made-up affine cost table
    t_draft = F(1, 5)
    for alpha in GRID_ALPHA:
        for gamma in range(8):
            seconds_per_round = gamma * t_draft + t_target[gamma + 1]
            tokens_per_round = tokens_per_round_iid(alpha, gamma)
            plain_tokens_per_s = 1 / t_target[1]
            v = lambda g: t_target[g + 1] / t_target[1]
            assert (tokens_per_round / seconds_per_round) / plain_tokens_per_s == \
                speedup(alpha, gamma, t_draft / t1, v)


def test_affine_verify_cost_is_a_larger_c():
    """v(gamma) = 1 + k*gamma is Leviathan's model with c' = c + k."""
    for alpha in GRID_ALPHA[::3]:
        for c in GRID_C:
            for k in (F(0), F(1, 10), F(1, 2), F(1)):
                for gamma in range(8):
                    assert speedup(alpha, gamma, c, lambda g: 1 + k * g) == speedup(alpha, gamma, c + k, lambda g: 1)


def test_compute_bound_verify_never_speeds_up():
    """If v(gamma) >= gamma + 1 (verifying costs gamma+1 separate forwards) and c > 0, speedup < 1 for gamma >= 1."""
    for alpha in [*GRID_ALPHA, F(1)]:
        for c in GRID_C[1:]:
            for gamma in range(1, 10):
                assert speedup(alpha, gamma, c, lambda g: g + 1) < 1
    assert speedup(F(1), 4, F(0), lambda g: g + 1) == 1  # the bound is tight only for a free, perfect draft


def test_some_gamma_pays_iff_alpha_above_c_plus_k():
    """With v(gamma) = 1 + k*gamma, some gamma >= 1 beats plain decoding iff alpha > c + k
    (E_gamma <= 1 + gamma*alpha bounds every gamma; gamma = 1 attains it)."""
    for alpha in GRID_ALPHA:
        for c in GRID_C:
            for k in (F(0), F(1, 20), F(1, 4)):
                v = lambda g: 1 + k * g
                pays = max(speedup(alpha, g, c, v) for g in range(1, 33)) > 1
                assert pays == (alpha > c + k)


def test_break_even_for_one_draft():
    """gamma = 1 beats plain decoding iff alpha > c + v(1) - 1."""
    for alpha in GRID_ALPHA:
        for c in GRID_C:
            for v1 in (F(1), F(11, 10), F(3, 2), F(2)):
                assert (speedup(alpha, 1, c, lambda g: 1 if g == 0 else v1) > 1) == (alpha > c + v1 - 1)


def test_marginal_draft_rule():
    """Adding draft gamma+1 helps iff alpha^(gamma+1) / E_gamma > (c + v(gamma+1) - v(gamma)) / (gamma*c + v(gamma))."""
    v = lambda g: 1 + F(g, 8) + F(g * g, 200)  # convex, made up
    for alpha in GRID_ALPHA:
        for c in GRID_C:
            for g in range(10):
                better = speedup(alpha, g + 1, c, v) > speedup(alpha, g, c, v)
                rule = alpha ** (g + 1) / closed_form(alpha, g) > (c + v(g + 1) - v(g)) / (g * c + v(g))
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


def test_best_gamma_is_zero_when_drafting_cannot_pay():
    for alpha in GRID_ALPHA:
        assert best_gamma(alpha, F(1), lambda g: 1) == 0  # a draft as slow as the target never pays
        assert best_gamma(alpha, F(1, 100), lambda g: g + 1) == 0  # nor does a compute-bound verify


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
        assert law.keys() == expected.keys() and abs(sum(law.values()) - 1) <= 1e-12


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
    m = 0  # argmax q
    keep = min(F(1), p[m] / q[m])
    r = exact_residual(p, q)
    wrong = [(keep if x == m else 0) + (1 - keep) * r[x] for x in range(3)]
    assert wrong == [F(5, 6), 0, F(1, 6)] != list(p)  # token 1 is never emitted
    assert one_step_law(p, (F(1), F(0), F(0))) == list(p)  # the honest q of an argmax proposal: exact
    # the same through npspec's accept
    pf, qf = np.array([float(x) for x in p]), np.array([float(x) for x in q])
    law = accept_law([m], np.stack([pf, pf]), qf[None])
    got = [sum(w for y, w in law.items() if y[0] == x) for x in range(3)]
    np.testing.assert_allclose(got, [5 / 6, 0, 1 / 6], rtol=0, atol=1e-12)


@pytest.mark.parametrize("args", [dict(top_k=2), dict(temperature=0.5), dict(top_p=0.6)])
def test_unwarped_p_gives_the_unwarped_law(args):
    """The output follows whatever p accept is given: warp q but not p and the output is the raw target,
    which puts mass where plain decoding with these options never would (or ignores the temperature)."""
    target_logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    draft_logits = np.log(np.array([0.25, 0.35, 0.3, 0.1]))
    q = warp(draft_logits, **args)
    p_raw, p_warped = warp(target_logits), warp(target_logits, **args)
    np.testing.assert_allclose(first_token_law(p_raw, q), p_raw, rtol=0, atol=1e-12)
    assert np.abs(p_raw - p_warped).max() > 0.05  # so the output is NOT what plain decoding would give
    np.testing.assert_allclose(first_token_law(p_warped, q), p_warped, rtol=0, atol=1e-12)


def test_strict_test_never_accepts_p_zero():
    """u = 0.0 is a possible draw (Generator.random returns k / 2^53); `u <= p/q` would keep a token with p = 0."""
    p = np.array([[0.0, 0.6, 0.4], [1 / 3, 1 / 3, 1 / 3]])  # the target forbids token 0 (e.g. cut by top-p)
    q = np.array([[0.5, 0.25, 0.25]])
    n, token = accept(np.array([0]), p, q, np.array([0.0]), 0.5)
    assert n == 0 and p[0, token] > 0  # rejected, and the replacement comes from the residual
    assert 0.0 <= p[0, 0] / q[0, 0]  # the non-strict comparison would have kept it
    assert np.random.default_rng(0).random() * 2**53 % 1 == 0  # uniforms are multiples of 2^-53
