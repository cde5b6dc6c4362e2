"""The one-step law and the round law: speculative sampling emits exactly the target's distribution
(Leviathan et al. 2023, Appendix A.1; Chen et al. 2023, Theorem 1). Letters are Leviathan's: `p` the target,
`q` the draft.

ONE oracle, npspec.testing's exact enumeration: `assert_round_keeps_target` is THE check of a rule
`rule(p, q, x) -> (a, r)`: kit.leviathan_rule in Fractions, kit.npspec_rule in float64, or
`accept_rule`, the rule npspec.decode.rules.accept itself implements, measured without sampling.
accept is a function of its uniforms, constant on boxes (u_i < cut_i or not, u_final inside one
CDF interval of what it samples from): `accept_law` calls it once at the midpoint of every box
and weighs the answer by the box's volume, the exact law up to float64 rounding. The CDF cuts
come from this file's own formula for the residual, not npspec's, so a sampler that used another
distribution would straddle cuts. The exact tests and hypothesis properties here and the claims
of notes/derivation.md (test_derivation.py) all call the one check. Then the same enumeration
over whole generations (gamma, EOS, max_new_tokens, n_ctx), on explicit tables and GPT-2 rows.
"""

import itertools
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, strategies as st
from hypothesis.extra.numpy import arrays

from npspec import testing as kit
from npspec.decode.sampling import greedy, warp
from npspec.decode import Proposal, SamplingParams, accept, get_rule, round as rounds

from conftest import tiny_model

PROMPT = (0,)
ATOL = 1e-12  # float64: every quantity is a handful of operations on numbers in [0, 1]


def as_table(p):
    """A table (seq -> row) for a row or a table."""
    return p if callable(p) else kit.constant_table(p)


def round_law(rule, p, q, gamma=1):
    """(the law of one round of `gamma` drafts tested by `rule`, its ids continued by the target up to
    gamma + 1 ids; the target's own law of gamma + 1 ids), both `{ids: probability}` by the kit's enumeration.

    p, q: rows (constant tables) or tables.
    """
    p, q = as_table(p), as_table(q)
    return kit.round_distribution(p, q, PROMPT, gamma, rule=rule), kit.sequence_distribution(p, PROMPT, gamma + 1)


def first_token(law, n_vocab):  # {ids: probability} -> [n_vocab]: the law of the first id
    out = [0] * n_vocab
    for ids, w in law.items():
        out[ids[0]] += w
    return out


def assert_round_keeps_target(rule, p, q, gamma=1, atol=0):
    """THE check: a round of `gamma` drafts tested by `rule` leaves the target's law unchanged.

    With gamma = 1 and rows this is the one-step law: x ~ q, kept with probability a, else
    replaced from r, emits exactly p. atol = 0 (Fraction rows or tables): kit.check_rule, the two
    laws are equal. atol > 0 (float rows): the total variation between them and every
    first-token probability's distance to p's are at most atol.
    """
    if atol == 0:
        report = kit.check_rule(rule, cases=[(p, q)], gammas=(gamma,))
        assert report.ok, str(report)
        return
    got, want = round_law(rule, p, q, gamma)
    assert kit.total_variation(got, want) <= atol
    row = as_table(p)(PROMPT)
    assert max(abs(a - b) for a, b in zip(first_token(got, len(row)), row)) <= atol, (first_token(got, len(row)), row)


def acceptance_probability(rule, p, q):
    """P(the draft is kept) in one round of one draft, summed over the kit's enumerated paths."""
    paths = kit.speculative_paths(as_table(p), as_table(q), PROMPT, 1, 2, rule=rule)
    return sum(path.prob for path in paths if path.rounds[0].accepted == 1)


# ---- npspec's accept as a rule, by quadrature over its uniforms

def cdf_cells(dists):
    """[0, 1) cut at every CDF breakpoint of the given distributions: a list of (lo, hi)."""
    cuts = {0.0, 1.0}
    for dist in dists:
        cuts.update(float(c) for c in np.cumsum(dist) / np.sum(dist) if 0 < c < 1)
    cuts = sorted(cuts)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def uniform_boxes(d, p, q):
    """Every box of accept's uniforms for drafts d `[g]`, rows p `[g + 1, n_vocab]`, q `[g, n_vocab]`:
    (u_accept `[g]`, u_final) at its midpoint, and its volume."""
    d = np.asarray(d, dtype=np.int64)
    g = len(d)
    with np.errstate(over="ignore"):
        cut = np.minimum(p[np.arange(g), d] / q[np.arange(g), d], 1.0)  # u_i < cut_i keeps d_i
    resid = [np.maximum(p[i] - q[i], 0.0) for i in range(g)]
    cells = cdf_cells([*p, *(r for r in resid if r.sum() > 0)])
    for kept in itertools.product((True, False), repeat=g):
        lo, hi = np.where(kept, 0.0, cut), np.where(kept, cut, 1.0)
        volume = float(np.prod(hi - lo))
        if volume:
            for a, b in cells:
                yield (lo + hi) / 2, (a + b) / 2, volume * (b - a)


def accept_law(d, p, q, accept=accept):
    """{emitted ids: probability}: the law of d[:n] + [token] for n, token = accept(d, p, q, U, u),
    U ~ U[0,1)^g, u ~ U[0,1); d `[g]` ids, p `[g + 1, n_vocab]`, q `[g, n_vocab]` float64."""
    law = defaultdict(float)
    for u_accept, u_final, w in uniform_boxes(d, p, q):
        n, token = accept(np.asarray(d, dtype=np.int64), p, q, u_accept, u_final)
        law[tuple(int(x) for x in d[:n]) + (int(token),)] += w
    return dict(law)


def accept_rule(accept=accept):
    """The rule `(p, q, x) -> (a, r)` an accept function implements, by quadrature: a = P(x kept),
    r = the law of the token on rejection (p itself when nothing is rejected, as kit.leviathan_rule)."""
    memo = {}

    def rule(p, q, x):
        key = (tuple(map(float, p)), tuple(map(float, q)), int(x))
        if key not in memo:
            p_, q_ = np.asarray(key[0]), np.asarray(key[1])
            law = accept_law([int(x)], np.stack([p_, p_]), q_[None], accept)
            assert all(y[0] == x for y in law if len(y) == 2)  # a kept draft is emitted as itself
            a = sum(w for y, w in law.items() if len(y) == 2)
            r = [sum(w for y, w in law.items() if y == (z,)) for z in range(len(p_))]
            memo[key] = (a, [v / sum(r) for v in r] if sum(r) else list(p_))
        return memo[key]

    return rule


ACCEPT_RULE = accept_rule()


def one_draft_at_a_time(d, p, q, u_accept, u_final):
    """accept's round as one-draft accepts in a row: stop at the first rejection, else the bonus from p[g]."""
    for i in range(len(d)):
        n, token = accept(d[i:i + 1], p[i:i + 2], q[i:i + 1], u_accept[i:i + 1], u_final)
        if n == 0:
            return i, token
    return len(d), token


def assert_blocks_are_one_draft_at_a_time(P, Q, prompt, gamma, max_new_tokens, n_vocab):
    """accept on every block of g drafts a round can test (every prefix after `prompt`, g clamped to
    max_new_tokens as the loop does, every d the draft can propose) equals one_draft_at_a_time on
    every box of its uniforms. P, Q: float64 tables. Returns the number of blocks checked."""
    blocks = 0
    for k in range(max_new_tokens - 1):
        for t in itertools.product(range(n_vocab), repeat=k):
            s, g = (*prompt, *t), min(gamma, max_new_tokens - k - 1)
            for d in itertools.product(range(n_vocab), repeat=g):
                q = np.array([Q(s + d[:i]) for i in range(g)]).reshape(g, n_vocab)
                if np.prod(q[np.arange(g), list(d)]) == 0:
                    continue  # the draft never proposes d
                p, d = np.array([P(s + d[:i]) for i in range(g + 1)]), np.array(d)
                for u_accept, u_final, _ in uniform_boxes(d, p, q):
                    assert accept(d, p, q, u_accept, u_final) == one_draft_at_a_time(d, p, q, u_accept, u_final)
                blocks += 1
    return blocks


# ---- the one-step law, properties on random rows (hypothesis), in float64

def normalise(w):
    w = w.copy()
    if w.sum() == 0:
        w[0] = 1.0
    return w / w.sum()


# pairs over 2..12 tokens with exact zeros allowed (the kit's pairs go to 8 tokens, with the hard cases)
weight_pairs = st.integers(2, 12).flatmap(lambda n: st.tuples(
    *[arrays(np.float64, n, elements=st.one_of(st.just(0.0), st.floats(1e-12, 1.0))).map(normalise)] * 2))


@given(st.one_of(kit.probability_pairs(), weight_pairs))
def test_one_step_law(pq):
    """q*min(1, p/q) + (1 - beta)*residual == p with npspec's ratio and residual (kit.npspec_rule), incl.
    zeros, one-hot rows, p == q, disjoint supports, near-denormal entries and a zero-mass residual."""
    p, q = pq
    assert_round_keeps_target(kit.npspec_rule, p, q, atol=ATOL)


@given(kit.probability_pairs(max_size=5))
def test_acceptance_probability_is_beta(pq):
    """P(accept) = sum_x q(x) min(1, p(x)/q(x)) = beta = sum(min(p, q)) = 1 - TV(p, q), from the enumerated paths."""
    p, q = pq
    beta = np.minimum(p, q).sum()
    assert abs(acceptance_probability(kit.npspec_rule, p, q) - beta) <= ATOL
    assert abs(beta - (1 - 0.5 * np.abs(p - q).sum())) <= ATOL


# ---- whole generations, exactly (Fractions on explicit tables)

def tables(n_vocab, truncation):
    """A target and a draft table (different random rows per context), with the same truncation."""
    base_p, base_q = kit.random_table(n_vocab, seed=10 + n_vocab), kit.random_table(n_vocab, seed=20 + n_vocab)
    return (lambda s: kit.truncate(base_p(s), **truncation)), (lambda s: kit.truncate(base_q(s), **truncation))


TRUNCATIONS = [{}, {"top_k": 2}, {"top_p": Fraction(2, 3)}, {"top_k": 3, "top_p": Fraction(9, 10)}]
SEQ_PROMPT = (0, 1)


@pytest.mark.parametrize("n_vocab", [3, 4, 5, 6])
@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=["none", "top_k2", "top_p2/3", "top_k3_top_p.9"])
def test_speculative_law_equals_target_law_exactly(n_vocab, truncation):
    """Every path of the loop, weighted exactly: the law of the output equals the target's, for
    gamma 1..4, max_new_tokens 1..4, with and without EOS, with n_ctx cutting the sequence."""
    p, q = tables(n_vocab, truncation)
    assert_round_keeps_target(kit.leviathan_rule, p, q, gamma=2)  # one round at the prompt, through the one check
    checked = 0
    for eos in (None, n_vocab - 1):
        for n_ctx in (None, len(SEQ_PROMPT) + 2):
            for max_new_tokens in range(1, 5):
                target = kit.sequence_distribution(p, SEQ_PROMPT, max_new_tokens, eos, n_ctx)
                assert sum(target.values()) == 1
                for gamma in range(1, 5):
                    spec = kit.speculative_distribution(p, q, SEQ_PROMPT, gamma, max_new_tokens, eos, n_ctx)
                    assert spec == target, (eos, n_ctx, max_new_tokens, gamma)
                    checked += 1
    assert checked == 2 * 2 * 4 * 4


def test_a_wrong_rule_gives_a_different_law():
    """The comparison can fail: sampling p instead of the residual after a rejection is visibly wrong."""
    p, q = tables(3, {})

    def no_residual(prow, qrow, x):
        return min(1, prow[x] / qrow[x]), list(prow)

    assert kit.speculative_distribution(p, q, SEQ_PROMPT, 2, 3, rule=no_residual) != \
        kit.sequence_distribution(p, SEQ_PROMPT, 3)
    assert not kit.check_rule(no_residual, cases=[(p, q)], gammas=(1,)).ok


# ---- the same enumeration in float64 on tiny GPT-2 models (5 tokens, so every path can be listed)

TOL = 1e-12  # float64: each path probability is a product of <= 13 factors, each a few roundings


@pytest.fixture(scope="module")
def gpt2_pair():
    target = tiny_model(seed=31, n_vocab=5, n_ctx=16, n_layer=2, eos_token_id=4)
    draft = tiny_model(seed=32, role="draft", n_vocab=5, n_ctx=16, n_layer=1, eos_token_id=4)
    return target, draft


@pytest.mark.parametrize("warp_args", [dict(temperature=1.0), dict(temperature=0.6), dict(temperature=1.7, top_k=3),
                                       dict(temperature=1.3, top_p=0.8), dict(temperature=0.0)],
                         ids=["T1", "T0.6", "T1.7_k3", "T1.3_p0.8", "greedy"])
def test_float64_law_on_tiny_gpt2(gpt2_pair, warp_args):
    """Rows from real GPT-2 forwards, warped as npspec warps them; npspec's own ratio and residual (npspec_rule)."""
    target, draft = gpt2_pair
    p, q = kit.model_table(target, **warp_args), kit.model_table(draft, **warp_args)
    for eos in (None, 4):
        for max_new_tokens in (1, 2, 4):
            ref = kit.sequence_distribution(p, SEQ_PROMPT, max_new_tokens, eos)
            assert abs(sum(ref.values()) - 1) <= TOL
            for gamma in (1, 2, 3, 4):
                spec = kit.speculative_distribution(p, q, SEQ_PROMPT, gamma, max_new_tokens, eos, rule=kit.npspec_rule)
                assert max(abs(spec.get(k, 0) - ref.get(k, 0)) for k in set(spec) | set(ref)) <= TOL
                if warp_args["temperature"] == 0:
                    assert spec == ref and list(ref.values()) == [1.0]  # greedy: one path, exactly


# ---- npspec's accept on any rows

@given(kit.probability_pairs(), st.sampled_from([0.0, 0.5, kit.ONE_BELOW]), st.sampled_from([0.0, 0.5, kit.ONE_BELOW]))
@example(pq=(np.array([0.0, 0.5, 0.5]), np.array([0.5, 0.25, 0.25])), u_accept=0.0, u_final=0.5)  # u == p/q == 0
@example(pq=(np.array([0.25, 0.75]), np.array([0.5, 0.5])), u_accept=0.5, u_final=0.0)  # u == p/q == 1/2
def test_no_nan_reaches_a_sampler_in_accept(pq, u_accept, u_final):
    """accept() on any rows returns a token the target can emit, never NaN or an out-of-range id, and its test is
    strict: it keeps x exactly when u < p(x)/q(x) (the examples put u on p/q, where `u <= p/q` would keep x)."""
    p, q = pq
    for x in np.flatnonzero(q):
        n, token = accept(np.array([x]), np.stack([p, p]), q[None], np.array([u_accept]), u_final)
        assert n in (0, 1) and 0 <= token < len(p) and p[token] > 0
        with np.errstate(over="ignore"):  # a denormal q(x) makes p/q inf: kept, as min(1, p/q) = 1 says
            assert (n == 1) == (u_accept < p[x] / q[x])  # strict: kept iff u < p/q


def test_strict_acceptance_u_zero_never_accepts_p_zero():
    p = np.array([[0.0, 1.0], [0.5, 0.5]])
    q = np.array([[0.5, 0.5]])
    assert accept(np.array([0]), p, q, np.array([0.0]), 0.0) == (0, 1)  # p(0) = 0: rejected though u = 0
    assert accept(np.array([1]), p, q, np.array([kit.ONE_BELOW]), 0.0)[0] == 1  # ratio 2: always kept


US = (0.0, 0.3, 0.5, kit.ONE_BELOW)  # uniforms, both ends included


def greedy_round(d, p_logits):  # -> (n accepted, token)
    """The round's accept step at temperature 0 (the one place greedy is handled) on a chain of drafts d."""
    path, token, *_ = rounds.accept(Proposal.chain(d), p_logits, SamplingParams(temperature=0.0), get_rule("token"),
                                    False, None, None, p_logits.shape[-1])
    assert path == list(range(len(path)))
    return len(path), token


def test_greedy_round_equals_accept_on_one_hot_rows():
    """The round's greedy accept (argmax of the logits, no rows built) equals the token rule on the one-hot rows:
    every draft and every target table over 3 ids (ties included), gamma 1 and 2, all uniforms in US."""
    rows = [np.array(r, dtype=np.float32) for r in itertools.product((0.0, 1.0), repeat=3) if any(r)]
    rows.append(np.array([0.0, 0.0, 0.0], dtype=np.float32))  # all tied
    cases = 0
    for gamma in (1, 2):
        for d in itertools.product(range(3), repeat=gamma):
            for p_logits in itertools.product(rows, repeat=gamma + 1):
                p_logits = np.stack(p_logits)
                p = warp(p_logits, temperature=0)
                q = warp(np.eye(3, dtype=np.float32)[list(d)], temperature=0)  # the draft's one-hot on d_i
                fast = greedy_round(list(d), p_logits)
                for u in US:
                    assert accept(np.array(d), p, q, np.full(gamma, u), u) == fast
                cases += 1
    assert cases == sum(3 ** g * 8 ** (g + 1) for g in (1, 2))
