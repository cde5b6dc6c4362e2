"""npspec.testing.probes: black-box checks of a sampler given as two functions.

`propose(logits, uniform) -> (x, q)` and `accept(x, p, q, uniform) -> (accepted, token)`, uniform() the next float in
[0, 1): deterministic probes with injected uniforms (the only catch for a non-strict u <= p/q), then Pearson
chi-square tests at a stated false-alarm rate. Imports numpy, npspec.decode and npspec.testing.usage.
"""

import math
import operator
from dataclasses import dataclass, field

import numpy as np

from ..decode.sampling import sample, warp
from ..decode import accept as accept_block
from .zoo import named
from .usage import (MAX_UNIFORMS_PER_CALL, KitUsageError, UniformsExhausted, need_alpha, need_callable, need_int,
                    need_samples)

ONE_BELOW = float(np.nextafter(1.0, 0.0))  # the largest double below 1: 1 - 2**-53
GPT2_VOCAB = 50257


def realistic_logits(n_vocab, n_rows, seed, zipf=1.1, grid=0.125, banned=0.01):  # -> [n_rows, n_vocab] float64
    """Logits `[n_rows, n_vocab]` like a language model's: a Zipf tail plus Gumbel noise, on a grid of 1/8 (exact
    ties), a fraction `banned` at -inf (never a row's best), each row its own permutation of the ids."""
    rng = np.random.default_rng(seed)
    rows = np.empty((n_rows, n_vocab))
    for i in range(n_rows):
        x = -zipf * np.log(rng.permutation(n_vocab) + 1.0) + 0.3 * rng.gumbel(size=n_vocab)
        x = np.round(x / grid) * grid
        off = rng.random(n_vocab) < banned
        off[np.argmax(x)] = False
        rows[i] = np.where(off, -np.inf, x)
    return rows


def id_problem(value, n, what):
    """A line naming `what` = value as a placeholder (-1) or an id outside [0, n), or None for an id in range."""
    i = integer(value)
    if i is None or 0 <= i < n:
        return None
    kind = "the -1 placeholder" if i == -1 else "outside the vocabulary"
    return f"{what} = {i} is {kind}, not an id in [0, {n}){named('placeholder-id')}"


def mutated(before, after, names):
    """A line naming the caller's arrays a callback wrote in place (before: copies taken first), or None."""
    changed = [name for name, a, b in zip(names, before, after) if not np.array_equal(a, b, equal_nan=True)]
    return (f"wrote the caller's {', '.join(changed)} in place (a sampler must read its inputs, never overwrite "
            f"them){named('inputs-mutated')}") if changed else None


class Uniforms:
    """A uniform source, called for the next float in [0, 1): `values`, then a seeded generator. `drawn` holds the
    values since new_call(); past `limit` of them it raises UniformsExhausted (a sampler that loops)."""

    def __init__(self, values=(), seed=0, limit=MAX_UNIFORMS_PER_CALL):
        self.values = list(values)
        self.rng = np.random.default_rng(seed)
        self.drawn = []
        self.limit = limit

    def new_call(self):
        """Start counting (and recording) the uniforms of the sampler's next call afresh."""
        self.drawn = []

    def __call__(self):
        if len(self.drawn) >= self.limit:
            raise UniformsExhausted(f"the sampler drew more than {self.limit} uniforms in one call (one needs at "
                                    "most 2 per draft): it loops")
        u = self.values.pop(0) if self.values else float(self.rng.random())
        self.drawn.append(u)
        return u


@dataclass
class Finding:
    """One way a sampler failed: the probe's name and what happened, with its inputs."""

    probe: str
    problem: str

    def __str__(self):
        return f"[{self.probe}] {self.problem}"


def integer(x):
    """x as an int when it is an integer (a Python int, a NumPy or torch integer: operator.index), else None (3.5, 3.0,
    "3" and a bool are not: int() would truncate or convert them, and a returned count or id must be exact)."""
    if isinstance(x, (bool, np.bool_)):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


@dataclass
class SamplerReport:
    """The result of check_sampler: ok, every Finding, and the chi-square tests as dicts `{name, statistic, df,
    p_value, threshold}` (a test fails when p_value < threshold = alpha / number of tests)."""

    ok: bool
    findings: list = field(default_factory=list)
    tests: list = field(default_factory=list)

    def __str__(self):
        if self.ok:
            return f"the sampler passes every probe and {len(self.tests)} chi-square tests"
        return "the sampler FAILS:\n" + "\n".join(f"  {f}" for f in self.findings)


def npspec_sampler(temperature=1.0, top_k=0, top_p=1.0):
    """npspec's own sampler as check_sampler's (propose, accept): propose warps the logits (npspec.decode.sampling.warp)
    and samples q with uniform(); accept is npspec.decode.rules.accept with gamma = 1, its test's uniform first."""
    def propose(logits, uniform):
        q = warp(np.asarray(logits), temperature=temperature, top_k=top_k, top_p=top_p)
        return sample(q, uniform()), q

    def accept(x, p, q, uniform):
        p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
        u_accept, u_final = uniform(), uniform()
        n, token = accept_block(np.array([x]), np.stack([p, p]), q[None], np.array([u_accept]), u_final)
        return (True, int(x)) if n == 1 else (False, int(token))

    return propose, accept


_TINY = 2.0 ** -1074  # the smallest positive double (denormal)
_REPLACEMENT_US = (0.0, 0.25, 0.5, 0.75, ONE_BELOW)

# (name, p, q, x, u for the acceptance test, "accept" / "reject" / "either", ids allowed on
# rejection, the bug it targets)
# Rows are dyadic, so p/q is exact and `u < p/q` and `u * q < p` agree at every probe.
# the bug class a probe names when it keeps a draft it must reject
PROBE_CLASS = {"strict-u0-p0": "non-strict-test", "at-ratio": "non-strict-test", "one-hot-different": "non-strict-test",
               "disjoint-supports-2": "non-strict-test", "disjoint-supports-3": "non-strict-test"}

ACCEPT_PROBES = [
    ("strict-u0-p0", [0, .5, .5], [.5, .25, .25], 0, 0.0, "reject", {1, 2},
     "u = 0 with p(x) = 0 must reject (a non-strict u <= p/q accepts a token the target never emits)"),
    ("below-ratio", [.25, .75], [.5, .5], 0, float(np.nextafter(.5, 0)), "accept", None,
     "u just below p/q must accept"),
    ("at-ratio", [.25, .75], [.5, .5], 0, .5, "reject", {1}, "u == p/q must reject (the test is strict u < p/q)"),
    ("above-ratio", [.25, .75], [.5, .5], 0, float(np.nextafter(.5, 1)), "reject", {1},
     "u just above p/q must reject"),
    ("denormal-p", [_TINY, .5, .5 - _TINY], [.5, .25, .25], 0, 0.0, "accept", None,
     "u = 0 must accept a token with p(x) > 0, however small (here the smallest denormal)"),
    *[(f"p-equals-q-{x}", [.25, .25, .5], [.25, .25, .5], x, ONE_BELOW, "accept", None,
       "p == q must always accept") for x in range(3)],
    ("one-hot-same", [0, 1, 0], [0, 1, 0], 1, ONE_BELOW, "accept", None, "p == q one-hot must accept"),
    ("one-hot-different", [0, 0, 1], [1, 0, 0], 0, 0.0, "reject", {2},
     "one-hot p on 2, q on 0: must reject and replace with 2"),
    *[(f"disjoint-supports-{x}", [.5, .5, 0, 0], [0, 0, .25, .75], x, 0.0, "reject", {0, 1},
       "disjoint supports: must reject and replace inside p's support") for x in (2, 3)],
    ("residual-not-p", [.5, .5, 0], [1, 0, 0], 0, .75, "reject", {1},
     "after a rejection the replacement comes from norm(max(0, p - q)) = [0, 1, 0], not from p"),
    ("residual-zero-mass", [0, .5, .5 - 2.0 ** -54], [0, .5, .5], 2, ONE_BELOW, "either", {1, 2},
     "max(0, p - q) is all zero in floating point: a rejection must fall back to p, never divide by 0"),
    # p/q = 1 - 2**-51 and u = 1 - 2**-52, two ulps above it: even a non-strict u <= p/q rejects here, so the
    # residual (which has no mass) is reached; at u == p/q (the probe above) a non-strict test hides it
    ("residual-zero-mass-above-ratio", [0, .5, .5 - 2.0 ** -52], [0, .5, .5], 2, 1 - 2.0 ** -52, "reject", {1, 2},
     "u above p/q must reject, and max(0, p - q) is all zero in floating point: the replacement must fall back "
     "to p, never divide by 0"),
]

# (logits, uniform streams): small rows, and one of GPT-2's 50,257 ids (a top-50 draft cuts half its mass)
_LOGITS_PROBES = [
    ([2.0, 1.0, 0.0, -1.0], 1024),
    ([-np.inf, 0.0, 0.0, -np.inf], 1024),
    ([10.0, -10.0, -np.inf, 10.0], 1024),
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 1024),
    (realistic_logits(GPT2_VOCAB, 1, seed=53)[0], 96),
]


def _valid_row(q, n):
    q = np.asarray(q, dtype=np.float64)
    return q.shape == (n,) and np.all(np.isfinite(q)) and np.all(q >= 0) and abs(q.sum() - 1) <= 1e-9


MISS_BOUND = 1e-12  # the proposal probes' false-alarm rate per logits row


def _never_drawn(q, xs, streams):
    """Sets of ids chosen from q alone (single ids, gathered in one set; the ids outside q's k most likely, k = 1, 2, 4,
    ...) no stream drew, though a sampler drawing from q misses each with probability below MISS_BOUND / the number
    of sets."""
    order = np.argsort(-q, kind="stable")
    tails = [order[k:] for k in 2 ** np.arange(int(np.log2(len(q))) + 1) if k < len(q)]
    bound = MISS_BOUND / (len(q) + len(tails))
    seen = np.zeros(len(q), dtype=bool)
    seen[xs] = True
    single = np.flatnonzero(~seen & ((1 - q) ** streams < bound))
    return ([single] if len(single) else []) + [t for t in tails
                                                if not seen[t].any() and (1 - q[t].sum()) ** streams < bound]


def probe_proposal(propose, streams=None):
    """Probes of a proposal with injected uniforms (0, 1 - 2**-53, seeded streams: `streams` or each row's own, 96 on
    GPT-2's 50,257 ids); returns Findings. q must be the same probability row each time, x an id with q[x] > 0, the
    caller's logits unwritten; flagged only below MISS_BOUND false alarms: "proposal-ignores-uniforms" (one x every
    time, q not one-hot: argmax-draft) and "proposal-q-not-sampled" (ids, or the ids outside q's k most likely, whose
    mass no stream drew: q-unwarped). A `propose` that never returns hangs the check."""
    findings = []
    for logits, row_streams in _LOGITS_PROBES:
        streams_here = streams or row_streams
        logits = np.array(logits, dtype=np.float64)
        n = len(logits)
        xs, q0 = [], None
        sources = [Uniforms([0.0])] + [Uniforms([ONE_BELOW])] + [Uniforms(seed=s) for s in range(streams_here)]
        for k, src in enumerate(sources):
            given = logits.copy()
            try:
                x, q = propose(given, src)
            except Exception as e:
                findings.append(Finding("proposal-raises", f"logits {_short(logits)}: {type(e).__name__}: {e}"))
                break
            q = np.asarray(q, dtype=np.float64)
            if not _valid_row(q, n):
                findings.append(Finding("proposal-q", f"logits {_short(logits)}: q = {_short(q)} is not a "
                                        f"probability row over {n} ids"))
                break
            if q0 is None:
                q0 = q
            elif not np.array_equal(q, q0):
                findings.append(Finding("proposal-q", f"logits {_short(logits)}: q changed between calls "
                                        f"({_short(q0)} then {_short(q)})"))
                break
            if problem := mutated([logits], [given], ["logits"]):
                findings.append(Finding("proposal-inputs", f"logits {_short(logits)}: the proposal {problem}"))
                break
            if problem := id_problem(x, n, "x"):
                findings.append(Finding("proposal-support", f"logits {_short(logits)}, uniforms {src.drawn}: {problem}"))
                break
            if integer(x) is None or q[int(x)] <= 0:
                findings.append(Finding("proposal-support", f"logits {_short(logits)}, uniforms {src.drawn}: "
                                        f"x = {x} is not an id with q[x] > 0 (q = {_short(q)})"))
                break
            if k >= 2:
                xs.append(int(x))
        else:
            if len(set(xs)) == 1 and float(np.sum(q0 ** streams_here)) < MISS_BOUND:
                findings.append(Finding("proposal-ignores-uniforms", f"logits {_short(logits)}: x = {xs[0]} for all "
                                        f"{streams_here} uniform streams although q = {_short(q0)} (the token is not "
                                        "drawn from q: an argmax proposal reporting a softmax q?)" + named("argmax-draft")))
                continue
            missed = _never_drawn(q0, xs, streams_here)
            if missed:
                ids = missed[0]
                which = (f"ids {[int(y) for y in ids]}" if len(ids) <= 8 else
                         f"the {len(ids)} ids outside q's {n - len(ids)} most likely")
                findings.append(Finding("proposal-q-not-sampled", f"logits {_short(logits)}: {which} "
                                        f"hold q mass {float(q0[missed[0]].sum()):.4g} but none was drawn in "
                                        f"{streams_here} uniform streams (a sampler drawing from q misses them with "
                                        f"probability below {MISS_BOUND:g}): q is not the array x was drawn from (a "
                                        "top-k or top-p draft reporting the full softmax?)" + named("q-unwarped")))
    return findings


def _short(row):
    """A row for a message: its values if it has at most 8, else its size."""
    row = np.asarray(row)
    return str(row.tolist()) if row.size <= 8 else f"(a row of {row.size} ids)"


def _replacement_problem(token, allowed, p, q):
    r = np.maximum(p - q, 0.0)
    source = (f"norm(max(0, p - q)), whose support is {sorted(np.flatnonzero(r).tolist())}" if r.sum() > 0 else
              "p, since max(0, p - q) has no mass here")
    return (f"rejected x as it should, but the replacement {token} is not one of {sorted(allowed)}: it must be "
            f"drawn from {source}")


def probe_acceptance(accept):
    """Deterministic probes of an acceptance function (ACCEPT_PROBES), its FIRST uniform the test's u (accept iff
    u < p[x]/q[x]), the next the replacement's (0, 1/4, 1/2, 3/4, 1 - 2**-53). Returns Findings: a wrong decision or
    token, a replacement outside the residual's support (p's when it has no mass), an exception. An `accept` that never
    returns hangs the check."""
    findings = []
    for name, p, q, x, u, expect, allowed, why in ACCEPT_PROBES:
        p, q = np.array(p, dtype=np.float64), np.array(q, dtype=np.float64)
        for ur in (_REPLACEMENT_US if expect != "accept" else (0.5,)):
            src = Uniforms([u, ur])
            given = [p.copy(), q.copy()]
            try:
                kept, token = accept(x, *given, src)
            except Exception as e:
                inputs = f"(p = {p.tolist()}, q = {q.tolist()}, x = {x}, uniforms {src.drawn})"
                findings.append(Finding(name, f"raised {type(e).__name__}: {e} {inputs}; {why}"))
                break
            inputs = f"(p = {p.tolist()}, q = {q.tolist()}, x = {x}, uniforms {src.drawn})"
            test = f"u = {u!r}, p[x]/q[x] = {float(p[x] / q[x])!r}"
            problem = mutated([p, q], given, ["p", "q"]) or id_problem(token, len(p), "token")
            if problem:
                name = "inputs" if "in place" in problem else name
            elif kept and expect == "reject":
                problem = f"accepted x at {test}: {why}" + named(PROBE_CLASS.get(name, ""))
            elif kept and token != x:
                problem = f"said it accepted x = {x} but returned token {token}"
            elif not kept and expect == "accept":
                problem = f"rejected x at {test}: {why}"
            elif not kept and token not in allowed:
                problem = _replacement_problem(token, allowed, p, q) + named("no-residual" if p[token] > 0 else "")
            if problem:
                findings.append(Finding(name, f"{problem} {inputs}"))
                break
    return findings


# p, q with p(0)/q(0) = 1/4 exactly and residual norm(max(0, p - q)) = [0, 1/2, 1/2]: inverse CDF draws id 1 below
# 1/2 and id 2 above it
_UNIFORM_P, _UNIFORM_Q = [.125, .4375, .4375], [.5, .25, .25]


def probe_uniforms(accept):
    """Probes whose uniforms differ only where one draw should matter, on x = 0 with p/q = 1/4: the decision must
    follow the first uniform (kept at 0, rejected at 1 - 2**-53), the replacement the second one alone (the test's
    uniform moved from 3/8 to 1 - 2**-53, both rejecting, must not change it; the replacement's moved from 0 to
    1 - 2**-53 must). Returns Findings "constant-uniform" and "uniform-reused". An `accept` that never returns hangs."""
    p, q = np.array(_UNIFORM_P), np.array(_UNIFORM_Q)

    def run(u, ur):
        try:
            kept, token = accept(0, p.copy(), q.copy(), Uniforms([u, ur]))
            return bool(kept), integer(token)
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    at = {(u, ur): run(u, ur) for u in (0.0, 0.375, ONE_BELOW) for ur in (0.0, ONE_BELOW)}
    if any(isinstance(v, str) for v in at.values()):
        return []  # probe_acceptance reports an accept that raises
    rows = f"(p = {_UNIFORM_P}, q = {_UNIFORM_Q}, x = 0, p/q = 1/4)"
    if at[0.0, 0.0][0] == at[ONE_BELOW, 0.0][0]:
        return [Finding("constant-uniform", f"{'kept' if at[0.0, 0.0][0] else 'rejected'} x both at u = 0 and at "
                        f"u = 1 - 2**-53 {rows}: the test ignores its uniform (a hard-coded u?)"
                        + named("constant-uniform"))]
    if at[0.375, 0.0] != at[ONE_BELOW, 0.0] or at[0.375, ONE_BELOW] != at[ONE_BELOW, ONE_BELOW]:
        return [Finding("uniform-reused", f"after a rejection the replacement changed with the TEST's uniform (u = 3/8: "
                        f"{at[0.375, 0.0][1]}, u = 1 - 2**-53: {at[ONE_BELOW, 0.0][1]}, the replacement's uniform 0 both "
                        f"times) {rows}: one uniform drives two draws, so the replacement is not independent of the "
                        "test" + named("uniform-reused"))]
    if not at[0.375, 0.0][0] and at[0.375, 0.0] == at[0.375, ONE_BELOW]:
        return [Finding("constant-uniform", f"after a rejection the replacement is {at[0.375, 0.0][1]} for its uniform 0 "
                        f"and 1 - 2**-53 alike {rows}, though the residual [0, 1/2, 1/2] splits them: the replacement "
                        "ignores its uniform (a constant or a reused one)" + named("constant-uniform"))]
    return []


def chi2_sf(x, df):
    """P(X >= x) for X ~ chi-square with integer df >= 1: the closed forms of Q(df/2, x/2) (a finite sum for even
    df, erfc plus a finite sum for odd df), summed in log space."""
    if x <= 0:
        return 1.0
    y = x / 2
    if df % 2 == 0:
        return min(1.0, sum(math.exp(-y + i * math.log(y) - math.lgamma(i + 1)) for i in range(df // 2)))
    terms = sum(math.exp(-y + (i - 0.5) * math.log(y) - math.lgamma(i + 0.5)) for i in range(1, (df - 1) // 2 + 1))
    return min(1.0, math.erfc(math.sqrt(y)) + terms)


def chi_square(counts, probs, min_expected=5.0):
    """Pearson's chi-square of `counts` against `probs`, cells expected below min_expected pooled. Returns (statistic,
    df, p_value, impossible), impossible the cells counted though their probability is 0 (an exact failure)."""
    counts, probs = np.asarray(counts, dtype=np.float64), np.asarray(probs, dtype=np.float64)
    n = counts.sum()
    impossible = [int(i) for i in np.flatnonzero((probs <= 0) & (counts > 0))]
    expected = n * probs
    big = expected >= min_expected
    cells_e, cells_o = list(expected[big]), list(counts[big])
    pool_e, pool_o = expected[~big].sum(), counts[~big].sum()
    if pool_e > 0:
        if pool_e >= min_expected or not cells_e:
            cells_e.append(pool_e)
            cells_o.append(pool_o)
        else:
            i = int(np.argmin(cells_e))
            cells_e[i] += pool_e
            cells_o[i] += pool_o
    if len(cells_e) < 2:
        return 0.0, 0, 1.0, impossible
    e, o = np.array(cells_e), np.array(cells_o)
    stat = float(np.sum((o - e) ** 2 / e))
    return stat, len(e) - 1, chi2_sf(stat, len(e) - 1), impossible


# (draft logits, target row p): the cases of the statistical test
STATISTICAL_CASES = [
    ([1.0, 0.5, 0.0, -1.0], [0.1, 0.2, 0.3, 0.4]),
    ([0.0, 0.0, 0.0, -np.inf], [0.7, 0.1, 0.1, 0.1]),
    ([3.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]),
]


def statistical_check(propose, accept, n_samples=20000, alpha=1e-6, seed=0):
    """Chi-square tests of a black-box sampler on STATISTICAL_CASES, n_samples seeded trials each; returns (Findings,
    tests). "proposal": x against q; "round": (kept, token) against min(p, q) and max(0, p - q) (Leviathan et al. 2023,
    Theorem 3.5); "output": token against p. False alarms <= alpha in all (Bonferroni); at the defaults a TV of 0.03 is
    found with probability > 0.98 per test. A `propose` or `accept` that never returns hangs the check."""
    n_samples, alpha = need_samples(n_samples, "statistical_check"), need_alpha(alpha, "statistical_check")
    src = Uniforms(seed=need_int(seed, "seed", "statistical_check", 0))
    findings, tests = [], []
    per_test = alpha / (3 * len(STATISTICAL_CASES))
    for c, (logits, p) in enumerate(STATISTICAL_CASES):
        logits, p = np.array(logits, dtype=np.float64), np.array(p, dtype=np.float64)
        n = len(p)
        xs, kept_tokens, tokens = np.zeros(n), np.zeros(2 * n), np.zeros(n)
        q0 = None
        try:
            for _ in range(n_samples):
                src.new_call()
                x, q = propose(logits.copy(), src)
                if q0 is None:
                    q0 = np.asarray(q, dtype=np.float64)
                src.new_call()
                kept, token = accept(int(x), p.copy(), np.asarray(q, dtype=np.float64).copy(), src)
                xs[int(x)] += 1
                kept_tokens[int(token) + (0 if kept else n)] += 1
                tokens[int(token)] += 1
        except Exception as e:
            findings.append(Finding(f"statistical-case-{c}", f"raised {type(e).__name__}: {e}"))
            continue
        round_law = np.concatenate([np.minimum(p, q0), np.maximum(p - q0, 0)])  # [kept as y; replaced by y]
        laws = {"proposal": (xs, q0), "round": (kept_tokens, round_law), "output": (tokens, p)}
        for name, (counts, probs) in laws.items():
            stat, df, pv, impossible = chi_square(counts, probs / probs.sum())
            tests.append(dict(name=f"case {c} {name}", statistic=stat, df=df, p_value=pv, threshold=per_test))
            if impossible or pv < per_test:
                findings.append(Finding(f"statistical-{name}", f"case {c} (draft logits {logits.tolist()}, "
                                        f"p = {p.tolist()}): counts {counts.astype(int).tolist()} against "
                                        f"probabilities {np.round(probs, 6).tolist()}: chi-square {stat:.1f}, df {df}, "
                                        f"p-value {pv:.3g} < {per_test:.3g}" + (f"; impossible cells {impossible}"
                                                                               if impossible else "")))
    return findings, tests


def check_sampler(propose, accept, n_samples=20000, alpha=1e-6, seed=0, statistical=True):
    """Run probe_proposal, probe_acceptance, probe_uniforms and, if `statistical`, statistical_check: a SamplerReport.

    propose(logits `[n_vocab]` float64, uniform) -> (x int, q `[n_vocab]`), x drawn from q; accept(x, p, q, uniform) ->
    (accepted bool, token int), its first uniform the test's u. Exact probes (up to GPT-2's 50,257 ids) catch the bug
    classes of npspec.testing.zoo.BUGS this interface can express, each finding naming its class; chi-square tests a
    law off by a few percent TV (false alarms <= alpha); a call drawing over MAX_UNIFORMS_PER_CALL uniforms is a
    finding. Raises KitUsageError for a non-callable propose or accept, or (if statistical) n_samples outside [100,
    1e7], alpha outside [1e-12, 0.05] or a negative seed. A callback that never returns hangs the check.
    """
    where = "check_sampler"
    need_callable(propose, "propose", "propose(logits, uniform) -> (x, q)", where)
    need_callable(accept, "accept", "accept(x, p, q, uniform) -> (accepted, token)", where)
    if not isinstance(statistical, bool):
        raise KitUsageError(f"{where}: statistical must be True or False, got {statistical!r}")
    if statistical:
        n_samples, alpha = need_samples(n_samples, where), need_alpha(alpha, where)
        seed = need_int(seed, "seed", where, 0)
    findings = probe_proposal(propose) + probe_acceptance(accept) + probe_uniforms(accept)
    tests = []
    if statistical:
        more, tests = statistical_check(propose, accept, n_samples, alpha, seed)
        findings += more
    return SamplerReport(not findings, findings, tests)
