"""npspec.testing.blocks: the exact law of speculative decoding when a WHOLE BLOCK of drafts is verified jointly.

npspec.testing.oracle composes a per-token rule `rule(p, q, x) -> (a, r)` draft by draft; a block verifier
(block verification, Sun et al. 2025, npspec.rules.block_accept) decides after seeing every draft of the round,
so it needs the whole block. A *block rule* is

    block_rule(p_rows, q_rows, d) -> [(probability, n, row), ...]

for drafts d = (d_1..d_k) drawn from the draft rows q_rows `[k]`, with the target's rows p_rows `[k + 1]` (row i
after d_1..d_i): the law of the number n of drafts kept and of the row the round's last token is sampled from
(a residual, or p_rows[k] for the bonus). Rows are lists of Fractions (exact) or floats. `token_block_rule` is
the token rule (Leviathan et al. 2023, Algorithm 1) stated this way, `block_verification_rule` block verification
(Sun et al. 2025, Algorithm 2) in exact arithmetic, and `function_rule` turns a verifier FUNCTION with
npspec.decode.acceptance.accept's signature (block_accept's too) into a block rule by integrating it over its uniforms.
`block_round_distribution` (one round, continued by the target) and `block_distribution` (the whole loop, with
EOS, budget, n_ctx and npspec's gamma schedules) compose a block rule; `check_block_rule` compares it with the
target's own law on small cases. `expected_accepted` is the exact E[n] of a round, `joint_bound` the upper
bound sum_i P(X_1..i = Y_1..i) <= sum_i (1 - TV) any lossless verifier obeys, and `block_probes` runs a verifier
function on the uniforms where the strict test and the prefix weights matter. Imports numpy, npspec.rules,
npspec.decode and npspec.testing.oracle.
"""

import itertools
from collections import defaultdict
from fractions import Fraction

import numpy as np

from ..rules import block_thresholds, block_weights
from ..decode import accept, next_gamma, round_gamma
from .oracle import (Round, RuleReport, SpeculativePath, _differ, _is_exact, _nonzero, _start, _stopped,
                     constant_table, random_table, sequence_distribution, small_cases, table_drafter)

ONE_BELOW = float(np.nextafter(1.0, 0.0))  # the largest double below 1, as npspec.testing.probes.ONE_BELOW


def _norm(w, fallback):
    mass = Fraction(sum(w)) if _is_exact(w) else sum(w)
    return [x / mass for x in w] if mass > 0 else list(fallback)


def token_block_rule(p_rows, q_rows, d):
    """The token rule as a block rule: keep d_i while tested independently with min(1, p_i(d_i) / q_i(d_i)); at the
    first rejection the row norm(max(0, p_i - q_i)) (p_i if it has no mass), else the bonus row p_{k+1}."""
    out, reach = [], 1
    for i, x in enumerate(d):
        a = min(1, p_rows[i][x] / q_rows[i][x]) if q_rows[i][x] else (1 if p_rows[i][x] else 0)
        if a != 1:
            out.append((reach * (1 - a), i, _norm([max(0, pi - qi) for pi, qi in zip(p_rows[i], q_rows[i])],
                                                   p_rows[i])))
        reach *= a
        if not reach:
            return out
    return out + [(reach, len(d), list(p_rows[len(d)]))]


def weights(p_rows, q_rows, d):
    """Block verification's weights w_0..w_k, exactly: w_0 = 1, w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i))."""
    w = [Fraction(1) if _is_exact(p_rows[0]) else 1.0]
    for i, x in enumerate(d):
        ratio = p_rows[i][x] / q_rows[i][x] if q_rows[i][x] else (float("inf") if p_rows[i][x] else 0)
        w.append(0 * w[-1] if not w[-1] or not ratio else min(1, w[-1] * ratio))
    return w


def block_verification_rule(p_rows, q_rows, d):
    """Block verification (Sun et al. 2025, Algorithm 2) as a block rule, in the arithmetic of its rows.

    With weights w and h_k = w_k, h_i = Z_i / (Z_i + 1 - w_i), Z_i = sum(max(0, w_i p_{i+1} - q_{i+1})) (1 where
    the denominator is 0), the backward scan keeps d_1..d_i with probability h_i prod_{j > i} (1 - h_j) (i >= 1),
    none with prod_j (1 - h_j); it ends with the bonus row p_{k+1} at i = k, else norm(max(0, w_i p_{i+1} -
    q_{i+1})) (w_i p_{i+1} itself, renormalised, if that has no mass: npspec.sampling.residual's guard).
    """
    k = len(d)
    w = weights(p_rows, q_rows, d)
    h = []
    for i in range(k):
        z = sum(max(0, w[i] * pi - qi) for pi, qi in zip(p_rows[i], q_rows[i]))
        den = z + 1 - w[i]
        h.append((Fraction(z) if _is_exact([z]) else z) / den if den > 0 else 1)
    h.append(w[k])
    out, none_yet = [], 1  # none_yet: P(no test from k down to i + 1 passed)
    for i in range(k, -1, -1):
        prob = none_yet * (h[i] if i else 1)
        if prob:
            if i == k:
                row = list(p_rows[k])
            else:
                scaled = [w[i] * pi for pi in p_rows[i]]
                row = _norm([max(0, si - qi) for si, qi in zip(scaled, q_rows[i])], _norm(scaled, p_rows[i]))
            out.append((prob, i, row))
        none_yet *= 1 - h[i]
        if not none_yet:
            break
    return out


def _cells(rows):
    """[0, 1) cut at every CDF breakpoint of the given rows: (lo, hi) pairs."""
    cuts = {0.0, 1.0}
    for r in rows:
        r = np.asarray(r, dtype=np.float64)
        if r.sum() > 0:
            cuts.update(float(c) for c in np.cumsum(r) / r.sum() if 0 < c < 1)
    cuts = sorted(cuts)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def function_rule(verify=accept):
    """A verifier FUNCTION `verify(d, p, q, u_tests, u_final) -> (n, token)` (npspec.decode.acceptance.accept's and
    npspec.rules.block_accept's signature) as a block rule, by integrating it over its uniforms.

    Each u_tests[i] is cut where the token rule (min(1, p_i/q_i)) and block verification (h_i) change their
    decision, u_final at every CDF breakpoint of the rows either rule samples from; the function is called once
    at the midpoint of every box and the box's volume weighs its answer. For a verifier that decides by those
    cuts this is its law to float64 rounding; a verifier that decides elsewhere is evaluated at the midpoints
    only, which is still a law, and the comparison shows it is not the target's. Returns float probabilities.
    """
    def rule(p_rows, q_rows, d):
        k = len(d)
        dd = np.asarray(d, dtype=np.int64)
        p = np.asarray(p_rows, dtype=np.float64).reshape(k + 1, -1)
        q = np.asarray(q_rows, dtype=np.float64).reshape(k, p.shape[1])  # k = 0: a plain target step
        w = block_weights(dd, p, q)
        h = block_thresholds(w, p, q)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            cut = np.nan_to_num(np.minimum(p[np.arange(k), dd] / q[np.arange(k), dd], 1.0))
        test_cells = [_cells([[c, 1 - c] for c in (cut[i], h[i + 1]) if 0 < c < 1] or [[1.0]]) for i in range(k)]
        rows = [*p, *(np.maximum(p[i] - q[i], 0) for i in range(k)), *(np.maximum(w[i] * p[i] - q[i], 0)
                                                                       for i in range(k))]
        final_cells = _cells(rows)
        law = defaultdict(float)
        for box in itertools.product(*test_cells):
            volume = float(np.prod([b - a for a, b in box]))
            u_tests = np.array([(a + b) / 2 for a, b in box])
            for a, b in final_cells:
                n, token = verify(dd, p, q, u_tests, (a + b) / 2)
                law[int(n), int(token)] += volume * (b - a)
        n_vocab = p.shape[1]
        return [(prob, n, [float(t == x) for x in range(n_vocab)]) for (n, t), prob in law.items()]
    return rule


def _block_round(p, drafter, seq, g, eos, rule):
    """Yield (Round, emitted ids, probability) for every outcome of one round of at most g drafts after seq, the
    drafts all drawn first, then decided by the block rule; an accepted EOS cuts the round there, as npspec's loop
    does (the later drafts still took part in the decision)."""
    def blocks(drafted, qrows, prob):
        step = drafter(seq, drafted) if len(drafted) < g else None
        proposal, qrow = step if step is not None else ((), None)
        stop = (1 - sum(proposal) if _is_exact(proposal) else 0) if step is not None else 1
        if stop:
            yield drafted, qrows, prob * stop
        for x, mx in enumerate(proposal):
            if mx:
                yield from blocks(drafted + (x,), qrows + [list(qrow)], prob * mx)

    for d, qrows, prob in blocks((), [], 1):
        prows = [list(p(seq + d[:i])) for i in range(len(d) + 1)]
        for rp, n, row in rule(prows, qrows, d):
            for y, ry in enumerate(row):
                if not (rp and ry):
                    continue
                emitted = d[:n] + (y,)
                if eos is not None and eos in emitted:
                    emitted = emitted[:emitted.index(eos) + 1]
                if len(emitted) <= n:  # an accepted EOS: the round ends on it, no token
                    yield Round(emitted, len(emitted), None, g), emitted, prob * rp * ry
                else:
                    yield Round(d, n, y, g), emitted, prob * rp * ry


def block_paths(p, drafter, prompt, gamma, max_new_tokens, eos=None, n_ctx=None, rule=None, schedule="constant"):
    """Every path through npspec's loop with a block rule (default block_verification_rule) and a drafter
    description (npspec.testing.oracle), with its probability: oracle.drafter_paths with the round decided by
    the block. Yields SpeculativePath (paths of probability 0 skipped)."""
    rule = block_verification_rule if rule is None else rule
    prompt = _start(prompt, n_ctx)
    gamma = min(gamma, max_new_tokens - 1, n_ctx - 1) if n_ctx is not None else min(gamma, max_new_tokens - 1)

    def go(seq, prob, rounds, scheduled):
        if _stopped(seq, len(prompt), max_new_tokens, eos, n_ctx):
            yield SpeculativePath(seq[len(prompt):], prob, rounds)
            return
        g = max(0, round_gamma(scheduled, max_new_tokens - (len(seq) - len(prompt)), n_ctx, len(seq)))
        for rnd, emitted, rp in _block_round(p, drafter, seq, g, eos, rule):
            yield from go(seq + emitted, prob * rp, rounds + (rnd,), next_gamma(schedule, scheduled, rnd.accepted))

    yield from go(prompt, 1, (), gamma)


def block_distribution(p, q, prompt, gamma, max_new_tokens, eos=None, n_ctx=None, rule=None, schedule="constant"):
    """`{emitted ids: probability}` of the loop with a block rule and a draft model of table q: block_paths summed."""
    return block_drafter_distribution(p, table_drafter(q), prompt, gamma, max_new_tokens, eos, n_ctx, rule, schedule)


def block_drafter_distribution(p, drafter, prompt, gamma, max_new_tokens, eos=None, n_ctx=None, rule=None,
                               schedule="constant"):
    """`{emitted ids: probability}` of the loop with a block rule and a drafter description (oracle's): the law of
    block_paths summed by output, computed state by state (ids so far, scheduled gamma) so that a state reached
    along several paths is expanded once."""
    rule = block_verification_rule if rule is None else rule
    prompt = _start(prompt, n_ctx)
    gamma = min(gamma, max_new_tokens - 1, n_ctx - 1) if n_ctx is not None else min(gamma, max_new_tokens - 1)
    dist, states = defaultdict(int), {(prompt, gamma): 1}
    while states:
        (seq, scheduled) = min(states, key=lambda s: len(s[0]))  # every path into it comes from a shorter state
        prob = states.pop((seq, scheduled))
        if _stopped(seq, len(prompt), max_new_tokens, eos, n_ctx):
            dist[seq[len(prompt):]] += prob
            continue
        g = max(0, round_gamma(scheduled, max_new_tokens - (len(seq) - len(prompt)), n_ctx, len(seq)))
        for rnd, emitted, rp in _block_round(p, drafter, seq, g, eos, rule):
            key = (seq + emitted, next_gamma(schedule, scheduled, rnd.accepted))
            states[key] = states.get(key, 0) + prob * rp
    return _nonzero(dist)


def block_round_distribution(p, q, prompt, gamma, eos=None, rule=None):
    """The law of ONE round of gamma drafts from table q decided by a block rule, continued by the target alone to
    gamma + 1 ids (shorter at eos): equal to sequence_distribution(p, prompt, gamma + 1, eos) for a lossless rule."""
    rule = block_verification_rule if rule is None else rule
    prompt = _start(prompt, None)
    dist = defaultdict(int)
    for _, emitted, prob in _block_round(p, table_drafter(q), prompt, gamma, eos, rule):
        if eos is not None and emitted[-1] == eos:
            dist[emitted] += prob
            continue
        for tail, tp in sequence_distribution(p, prompt + emitted, gamma + 1 - len(emitted), eos).items():
            dist[emitted + tail] += prob * tp
    return _nonzero(dist)


def expected_accepted(p, q, prompt, gamma, rule=None):
    """E[drafts kept] in one round of gamma drafts from table q after prompt, decided by a block rule (no EOS)."""
    rule = block_verification_rule if rule is None else rule
    return sum(prob * rnd.accepted for rnd, _, prob in _block_round(p, table_drafter(q), tuple(prompt), gamma, None,
                                                                     rule))


def joint_bound(p, q, prompt, gamma):
    """sum_{i=1..gamma} sum_{x_1..x_i} min(P_p(x_1..x_i), P_q(x_1..x_i)): no lossless verifier of gamma drafts from
    q keeps more in expectation, since d_1..d_i is kept only if the output starts with it, and a coupling of the
    two laws of i tokens agrees with probability at most 1 - TV (notes/derivation.md, claim 10)."""
    total, level = 0, {(): (1, 1)}
    for _ in range(gamma):
        nxt = {}
        for xs, (pp, qq) in level.items():
            prow, qrow = p(tuple(prompt) + xs), q(tuple(prompt) + xs)
            for x in range(len(prow)):
                if prow[x] * pp or qrow[x] * qq:
                    nxt[xs + (x,)] = (pp * prow[x], qq * qrow[x])
        total += sum(min(a, b) for a, b in nxt.values())
        level = nxt
    return total


def context_cases(n=8, n_vocab=3):
    """n pairs of random tables whose rows depend on the context (oracle.random_table): a block rule that reads the
    row of the wrong position is right on every constant-row case and wrong on these."""
    return [(random_table(n_vocab, seed=s), random_table(n_vocab, seed=1000 + s)) for s in range(n)]


def check_block_rule(rule, cases=None, gammas=(1, 2, 3), prompt=(0,), eos=None, tol=1e-12):
    """Does a block rule give exactly the target's law? oracle.check_rule for block rules: for each (p, q) (rows
    or tables; default oracle.small_cases() then context_cases()) and gamma, block_round_distribution against
    sequence_distribution, exactly when the law is in Fractions, else within tol per outcome. Returns an
    oracle.RuleReport.
    Calls of `rule` have no time limit: one that never returns hangs the check (npspec.testing says how to bound
    it).
    """
    n, used = 0, 0
    for p, q in ([*small_cases(), *context_cases()] if cases is None else cases):
        n += 1
        pt = p if callable(p) else constant_table(p)
        qt = q if callable(q) else constant_table(q)
        for gamma in gammas:
            expected = _nonzero(sequence_distribution(pt, prompt, gamma + 1, eos))
            try:
                got = block_round_distribution(pt, qt, prompt, gamma, eos, rule)
            except Exception as e:  # the rule's own exception is a finding
                return RuleReport(False, n, p, q, gamma, expected, None, f"{type(e).__name__}: {e}")
            case_tol = 0 if _is_exact(got.values()) else tol
            used = max(used, case_tol)
            if _differ(expected, got, case_tol):
                return RuleReport(False, n, p, q, gamma, expected, got, tol=case_tol)
    return RuleReport(True, n, tol=used)


# name, drafts, p rows, q rows, u_tests, what a lossless strict verifier must return (n, token) or a set of tokens
BLOCK_PROBES = [
    ("zero-weight-u0", [0, 1], [[0, 1], [.5, .5], [.5, .5]], [[1, 0], [0, 1]], [0.0, 0.0], {(0, 1)},
     "a prefix of weight 0 (p(d_1) = 0) was kept with u = 0: the test must be strict (u < h)"),
    ("past-a-dead-prefix", [0, 1], [[0, 1], [0, 1], [.5, .5]], [[.5, .5], [.5, .5]], [0.5, 0.5], {(0, 1)},
     "d_2 was kept past d_1, which the target never emits: the weights must carry the prefix (w_i = min(1, "
     "w_{i-1} p/q), a zero stays zero)"),
    ("p-equals-q-one-below", [0, 1], [[.5, .5]] * 3, [[.5, .5]] * 2, [ONE_BELOW, ONE_BELOW], {(2, 0), (2, 1)},
     "p == q must keep the whole block for any uniform (h_k = w_k = 1)"),
    ("dip-then-recover", [0, 1], [[1 / 3, 2 / 3]] * 3, [[2 / 3, 1 / 3]] * 2, [0.9, 0.9], {(2, 0), (2, 1)},
     "the paper's example: d_1 alone would be rejected (u = 0.9 >= 1/2) but the block a, b has weight 1 and "
     "must be kept"),
]


def block_probes(verify):
    """Run a verifier function (block_accept's signature) on BLOCK_PROBES and on one-hot rows (temperature 0, where
    it must decide as npspec.decode.acceptance.accept for every uniform). Returns [(probe name, what was wrong)].
    Calls of `verify` have no time limit: one that never returns hangs the check (npspec.testing says how to bound
    it).
    """
    findings = []
    for name, d, p, q, u, allowed, why in BLOCK_PROBES:
        got = verify(np.array(d), np.array(p, dtype=np.float64), np.array(q, dtype=np.float64), np.array(u), 0.5)
        if (int(got[0]), int(got[1])) not in allowed:
            findings.append((name, f"{why}; got (n, token) = ({int(got[0])}, {int(got[1])})"))
    eye = np.eye(3)
    for d in itertools.product(range(3), repeat=2):
        for best in itertools.product(range(3), repeat=3):
            p, q = eye[list(best)], eye[list(d)]
            for u in (0.0, 0.5, ONE_BELOW):
                us = np.full(2, u)
                want, got = accept(np.array(d), p, q, us, u), verify(np.array(d), p, q, us, u)
                if (int(got[0]), int(got[1])) != want:
                    return findings + [("greedy", f"one-hot rows, drafts {d}, target argmax {best}, u = {u}: "
                                                  f"got {tuple(map(int, got))}, the token rule {want}")]
    return findings

