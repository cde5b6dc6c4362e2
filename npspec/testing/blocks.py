"""npspec.testing.blocks: the exact law of speculative decoding when a WHOLE BLOCK of drafts is verified jointly.

A *block rule* `block_rule(p_rows, q_rows, d) -> [(probability, n, row), ...]`: for drafts d_1..d_k from q_rows `[k]`
and the target's p_rows `[k + 1]` (row i after d_1..d_i), the law of the number n kept and of the row the last token
is drawn from. token_block_rule is Leviathan et al. 2023's, block_verification_rule Sun et al. 2025's Algorithm 2
(notes/derivation.md, claim 10), exact_match_rule the engines' strict rule, function_rule a verifier function's;
acceptance_rate is one draft's chance of being kept; the rest mirrors npspec.testing.oracle.
Imports numpy, npspec.decode, npspec.decode.rules, npspec.testing.oracle and npspec.testing.probes (integer).
"""

import copy
import itertools
import math
from collections import defaultdict
from fractions import Fraction

import numpy as np

from ..decode.rules import block_thresholds, block_weights
from ..decode import accept, next_gamma, round_gamma
from .oracle import (Round, RuleReport, SpeculativePath, _continued, _differ, _first_gamma, _is_exact, _nonzero,
                     _prompt, _start, _stopped,
                     constant_table, random_table, sequence_distribution, small_cases, table_drafter)
from .probes import id_problem, integer
from .usage import (MAX_OUTCOMES, MAX_TOL, KitUsageError, largest, need_bounded, need_callable, need_int, need_ints,
                    need_real, need_row)
from .zoo import named

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


def exact_match_rule(p_rows, q_rows, d):
    """Exact-match ("strict") verification as a block rule: d_i kept iff the target's own sample equals it, with
    probability p_i(d_i); at the first mismatch the row p_i without d_i, renormalised (the target's sample given it is
    not d_i), else the bonus row p_{k+1}. q_rows are unread (npspec.decode.rules.exact_match_accept)."""
    out, reach = [], 1
    for i, x in enumerate(d):
        a = p_rows[i][x]
        if a != 1:
            out.append((reach * (1 - a), i, _norm([0 * pi if y == x else pi for y, pi in enumerate(p_rows[i])],
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
    """Block verification (Sun et al. 2025, Algorithm 2) as a block rule, in its rows' arithmetic: weights w,
    h_k = w_k, h_i = Z_i / (Z_i + 1 - w_i), Z_i = sum(max(0, w_i p_{i+1} - q_{i+1})) (1 where the denominator is 0);
    d_1..d_i kept with probability h_i prod_{j > i} (1 - h_j), then the bonus row p_{k+1} at i = k, else
    norm(max(0, w_i p_{i+1} - q_{i+1})) (w_i p_{i+1} renormalised if that has no mass)."""
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


def _mid(a, b):
    """A cell's midpoint as a uniform in [0, 1): that of (ONE_BELOW, 1) rounds to 1.0, so it is ONE_BELOW."""
    return min((a + b) / 2, ONE_BELOW)


def function_rule(verify=accept, draws=False):
    """A verifier FUNCTION `verify(d, p, q, u_tests, u_final) -> (n, token)` (npspec.decode.rules.accept's
    signature) as a block rule with float probabilities: u_tests cut where the token rule or block verification changes
    its decision (draws: also at p_i's CDF breakpoints, for a verifier that samples p_i with u_tests[i]), u_final at
    every CDF breakpoint, the function called at each box's midpoint and weighed by its volume: exact to rounding for
    a verifier deciding by those cuts; any other still gets a law, not the target's."""
    def rule(p_rows, q_rows, d):
        k = len(d)
        dd = np.asarray(d, dtype=np.int64)
        p = np.asarray(p_rows, dtype=np.float64).reshape(k + 1, -1)
        q = np.asarray(q_rows, dtype=np.float64).reshape(k, p.shape[1])  # k = 0: a plain target step
        w = block_weights(dd, p, q)
        h = block_thresholds(w, p, q)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            cut = np.nan_to_num(np.minimum(p[np.arange(k), dd] / q[np.arange(k), dd], 1.0))
        test_cells = [_cells([[c, 1 - c] for c in (cut[i], h[i + 1]) if 0 < c < 1] + ([p[i]] if draws else [])
                             or [[1.0]]) for i in range(k)]
        rows = [*p, *(np.maximum(p[i] - q[i], 0) for i in range(k)), *(np.maximum(w[i] * p[i] - q[i], 0)
                                                                       for i in range(k))]
        final_cells = _cells(rows)
        law = defaultdict(float)
        for box in itertools.product(*test_cells):
            volume = float(np.prod([b - a for a, b in box]))
            u_tests = np.array([_mid(a, b) for a, b in box])
            for a, b in final_cells:
                n, token = verify(dd, p, q, u_tests, _mid(a, b))
                law[int(n), int(token)] += volume * (b - a)
        n_vocab = p.shape[1]
        return [(prob, n, [float(t == x) for x in range(n_vocab)]) for (n, t), prob in law.items()]
    return rule


def _block_round(p, drafter, seq, g, eos, rule):
    """Yield (Round, emitted ids, probability) for every outcome of one round of at most g drafts after seq, all
    drafted first, then decided by the block rule; an accepted EOS cuts the round there (the later drafts took part)."""
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
    """Every path (SpeculativePath) of npspec's loop with a block rule (default block_verification_rule) and a
    drafter description (npspec.testing.oracle): oracle.drafter_paths with the round decided by the block."""
    rule = block_verification_rule if rule is None else rule
    prompt = _start(prompt, n_ctx)
    gamma = _first_gamma(gamma, max_new_tokens, n_ctx)

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
    """`{emitted ids: probability}` of the loop with a block rule and a drafter description: block_paths
    summed by output, each state (ids so far, scheduled gamma) expanded once."""
    rule = block_verification_rule if rule is None else rule
    prompt = _start(prompt, n_ctx)
    gamma = _first_gamma(gamma, max_new_tokens, n_ctx)
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
    outcomes = _block_round(p, table_drafter(q), prompt, gamma, eos, rule)
    return _nonzero(_continued(p, prompt, ((emitted, prob) for _, emitted, prob in outcomes), gamma + 1, eos))


def expected_accepted(p, q, prompt, gamma, rule=None):
    """E[drafts kept] in one round of gamma drafts from table q after prompt, decided by a block rule (no EOS)."""
    rule = block_verification_rule if rule is None else rule
    return sum(prob * rnd.accepted for rnd, _, prob in _block_round(p, table_drafter(q), tuple(prompt), gamma, None,
                                                                     rule))


def acceptance_rate(p_row, q_row, rule=None):
    """The chance that ONE draft from q_row is kept against p_row by a block rule (default block verification):
    exact for Fractions. Sum_x min(p, q) for the token rule (1 - total variation), sum_x p q for exact_match_rule.
    Raises KitUsageError unless both are probability rows of one length."""
    need_row(q_row, "q_row", "acceptance_rate", need_row(p_row, "p_row", "acceptance_rate"))
    return expected_accepted(constant_table(p_row), constant_table(q_row), (0,), 1, rule)


def joint_bound(p, q, prompt, gamma):
    """sum_{i <= gamma} sum_{x_1..x_i} min(P_p(x_1..x_i), P_q(x_1..x_i)): no lossless verifier of gamma drafts
    from q keeps more in expectation (notes/derivation.md, claim 10)."""
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


def cumprod_rule(q_one=False):
    """vllm-ascend's block verify before PR 7808 (issue 7807), as a block rule for up to 2 drafts: keep up to the LAST i
    with prod_{j<=i} u_j <= prod_{j<=i} c_j, c_j = min(1, p_j(d_j) / q_j(d_j)) (q_one: c_j = p_j(d_j), q taken as 1,
    PR 7603/7839's n-gram path), then the token rule's residual norm(max(0, p - q)) (q one-hot at d_i if q_one). For
    c_1 >= c_2 > 0, P(keep 2) = c_2 (1 - ln c_2): floats. Returns None for 3 drafts or more (no closed form here)."""
    def rule(p_rows, q_rows, d):
        if len(d) > 2:
            return None
        q_rows = [[float(y == x) for y in range(len(p_rows[0]))] for x in d] if q_one else q_rows
        c = list(itertools.accumulate((min(1.0, float(p_rows[i][x] / q_rows[i][x])) for i, x in enumerate(d)),
                                      lambda a, b: a * b))
        if len(d) == 1:
            probs = [1 - c[0], c[0]]
        elif c[1] > 0:
            probs = [1 - c[0] + c[1] * math.log(c[0]), c[0] - c[1] - c[1] * math.log(c[0] / c[1]),
                     c[1] * (1 - math.log(c[1]))]
        else:
            probs = [1 - c[0], c[0], 0.0]
        out = []
        for n, prob in enumerate(probs):
            row = p_rows[n] if n == len(d) else [max(0, a - b) for a, b in zip(p_rows[n], q_rows[n])]
            mass = sum(row)
            out.append((prob, n, [float(x / mass) for x in row] if mass else [float(x) for x in p_rows[n]]))
        return out
    return rule


# the zoo's block-rule classes, each as the block rule that reproduces it
BLOCK_DIAGNOSES = [("block-token-test", cumprod_rule()), ("block-q-one", cumprod_rule(q_one=True))]


class InputsMutated(Exception):
    """A rule wrote the rows or drafts it was handed."""


def guarded(rule):
    """`rule` checked at each call: its inputs unwritten (InputsMutated, bug class inputs-mutated) and each (probability,
    n, row) it returns with 0 <= n <= len(d) and a row over the vocabulary (ValueError, bug class placeholder-id)."""
    def call(p_rows, q_rows, d):
        before = copy.deepcopy((p_rows, q_rows, d))
        out = rule(p_rows, q_rows, d)
        for name, a, b in zip(("p_rows", "q_rows", "d"), before, (p_rows, q_rows, d)):
            if list(map(list, a) if name != "d" else a) != list(map(list, b) if name != "d" else b):
                raise InputsMutated(f"the rule wrote the caller's {name} in place" + named("inputs-mutated"))
        for prob, n, row in out:
            problem = id_problem(n, len(d) + 1, "n (the drafts kept)") if integer(n) is not None else None
            if problem or len(row) != len(p_rows[0]):
                raise ValueError(problem or f"returned a row of {len(row)} entries for {len(p_rows[0])} ids")
        return out
    return call


def _diagnose(pt, qt, prompt, gamma, eos, got):
    """'; it gives the law of ...' for the BLOCK_DIAGNOSES whose law equals `got` here (to 1e-9), else ''."""
    names = []
    for name, bug in BLOCK_DIAGNOSES:
        try:
            law = block_round_distribution(pt, qt, prompt, gamma, eos, bug)
        except Exception:  # no closed form here (None), or the bug cannot run on these rows
            continue
        if not _differ(law, got, 1e-9):
            names.append(name + named(name))
    return "; it gives the law of " + " / ".join(names) if names else ""


def _pairs(cases, where):  # -> [(p, q)]
    """The caller's cases as a list of pairs; raises KitUsageError for anything else."""
    try:
        pairs = [tuple(case) for case in cases]
    except TypeError:
        pairs = None
    if pairs is None or any(len(case) != 2 for case in pairs):
        raise KitUsageError(f"{where}: cases must be a sequence of (p, q) pairs, got {cases!r:.80}")
    return pairs


def check_block_rule(rule, cases=None, gammas=(1, 2, 3), prompt=(0,), eos=None, tol=1e-12):
    """oracle.check_rule for block rules, default cases small_cases() then context_cases(): a RuleReport, naming the
    zoo's block classes (BLOCK_DIAGNOSES) whose law the rule gives; a rule that writes its inputs or returns an n
    outside [0, len(d)] fails (bug classes inputs-mutated, placeholder-id). Raises KitUsageError as check_rule does
    (a non-callable rule, bad gammas, prompt, eos or tol, a row that is not a probability row, empty cases, an
    enumeration over MAX_OUTCOMES). A `rule` that never returns hangs the check (npspec.testing)."""
    where = "check_block_rule"
    need_callable(rule, "rule", "block_rule(p_rows, q_rows, d) -> [(probability, n, row), ...]", where)
    gammas = need_ints(gammas, "gammas", where, 1, why=" (gamma 0 drafts nothing: no rule would be tested)")
    prompt = _prompt(prompt, where)
    tol = need_real(tol, "tol", where, 0, MAX_TOL, why=" (a wrong rule is off by far more than rounding)")
    checked = guarded(rule)
    n, used = 0, 0
    for p, q in ([*small_cases(), *context_cases()] if cases is None else _pairs(cases, where)):
        n += 1
        try:
            pt = p if callable(p) else constant_table(p)
            qt = q if callable(q) else constant_table(q)
        except (TypeError, ValueError):
            raise KitUsageError(f"{where}: cases[{n - 1}] must be (p, q), each a probability row or a table "
                                f"function, got {p!r}, {q!r}") from None
        n_vocab = need_row(pt(prompt), f"cases[{n - 1}]'s p", where)
        need_row(qt(prompt), f"cases[{n - 1}]'s q", where, n_vocab)
        if max(prompt) >= n_vocab:
            raise KitUsageError(f"{where}: prompt id {max(prompt)} is not among cases[{n - 1}]'s {n_vocab} ids; "
                                f"use ids below {n_vocab}")
        if eos is not None:
            need_int(eos, "eos", where, 0, n_vocab - 1)
        for gamma in gammas:
            need_bounded(n_vocab ** (gamma + 1), f"gamma {gamma} over {n_vocab} ids ({n_vocab}**{gamma + 1} sequences)",
                         where, f"use gamma <= {largest(lambda g: n_vocab ** (g + 1) <= MAX_OUTCOMES)} here")
            expected = _nonzero(sequence_distribution(pt, prompt, gamma + 1, eos))
            try:
                got = block_round_distribution(pt, qt, prompt, gamma, eos, checked)
            except Exception as e:  # the rule's own exception is a finding
                return RuleReport(False, n, p, q, gamma, expected, None, f"{type(e).__name__}: {e}")
            case_tol = 0 if _is_exact(got.values()) else tol
            used = max(used, case_tol)
            if _differ(expected, got, case_tol):
                return RuleReport(False, n, p, q, gamma, expected, got, tol=case_tol,
                                  diagnosis=_diagnose(pt, qt, prompt, gamma, eos, got))
    if not n:
        raise KitUsageError(f"{where}: cases is empty: nothing would be checked; give at least one (p, q) "
                            "or leave it None (small_cases() and context_cases())")
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


def _decision(got, k, n_vocab):
    """The (n, token) a verifier of k drafts returned, as ints, or a line naming what is not an integer (never
    truncated) or is out of range (a -1 placeholder: bug class placeholder-id)."""
    pair = tuple(integer(v) for v in got[:2])
    if None in pair:
        return f"returned (n, token) = {tuple(got[:2])!r}: not integers (a count and an id are ints; never truncated " \
            "to fit)"
    problem = id_problem(pair[0], k + 1, "n (the drafts kept)") or id_problem(pair[1], n_vocab, "token")
    return f"returned {problem}" if problem else pair


def block_probes(verify):
    """Run a verifier function (block_accept's signature) on BLOCK_PROBES and on one-hot rows (where it must
    decide as npspec.decode.rules.accept). Returns [(probe, what was wrong)]; an n or token that is not an integer is wrong
    wherever it appears. A `verify` that never returns hangs the check."""
    findings = []
    for name, d, p, q, u, allowed, why in BLOCK_PROBES:
        got = _decision(verify(np.array(d), np.array(p, dtype=np.float64), np.array(q, dtype=np.float64),
                               np.array(u), 0.5), len(d), len(p[0]))
        if isinstance(got, str) or got not in allowed:
            findings.append((name, got if isinstance(got, str) else f"{why}; got (n, token) = {got}"))
    eye = np.eye(3)
    for d in itertools.product(range(3), repeat=2):
        for best in itertools.product(range(3), repeat=3):
            p, q = eye[list(best)], eye[list(d)]
            for u in (0.0, 0.5, ONE_BELOW):
                us = np.full(2, u)
                want, got = accept(np.array(d), p, q, us, u), _decision(verify(np.array(d), p, q, us, u), 2, 3)
                if got != want:
                    return findings + [("greedy", f"one-hot rows, drafts {d}, target argmax {best}, u = {u}: "
                                                  + (got if isinstance(got, str) else f"got {got}")
                                                  + f", the token rule {want}")]
    return findings

