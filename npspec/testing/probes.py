"""npspec.testing.probes: black-box checks of a sampler given as two functions.

They are `propose(logits, uniform) -> (x, q)` and `accept(x, p, q, uniform) -> (accepted, token)`;
`uniform()` returns the next float in [0, 1). `check_sampler` runs deterministic probes with
injected uniforms (probe_proposal, probe_acceptance over ACCEPT_PROBES), then Pearson chi-square
tests at a stated false-alarm rate (statistical_check). A non-strict `u <= p/q` differs from the
correct `u < p/q` only when u equals p/q exactly, which sampling never hits: only the probes catch
it. Each finding names what was wrong (the decision, the accepted token, or the replacement).
`npspec_sampler` is npspec's own pair. Imports numpy, npspec.sampling, npspec.decode and
npspec.testing.usage (argument checks and bounds), nothing else of npspec.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from ..sampling import sample, warp
from ..decode import accept as accept_block
from .usage import (MAX_UNIFORMS_PER_CALL, KitUsageError, UniformsExhausted, need_alpha, need_callable, need_int,
                    need_samples)

ONE_BELOW = float(np.nextafter(1.0, 0.0))  # the largest double below 1: 1 - 2**-53


class Uniforms:
    """A uniform source for probes: hands out `values` in order, then draws from a seeded generator.

    Call it for the next float in [0, 1). `drawn` records the values handed out since the last
    `new_call()` (or since it was made); past `limit` of them (default MAX_UNIFORMS_PER_CALL) it
    raises UniformsExhausted: a sampler that loops is stopped, and nothing grows without bound.
    """

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


@dataclass
class SamplerReport:
    """The result of check_sampler: ok, every Finding, and the chi-square tests run.

    tests: list of dicts `{name, statistic, df, p_value, threshold}`; a test fails when
    p_value < threshold (threshold = alpha / number of tests).
    """

    ok: bool
    findings: list = field(default_factory=list)
    tests: list = field(default_factory=list)

    def __str__(self):
        if self.ok:
            return f"the sampler passes every probe and {len(self.tests)} chi-square tests"
        return "the sampler FAILS:\n" + "\n".join(f"  {f}" for f in self.findings)


def npspec_sampler(temperature=1.0, top_k=0, top_p=1.0):
    """npspec's own sampler as a (propose, accept) pair for check_sampler.

    propose(logits `[n_vocab]`, uniform) -> (x, q): q = npspec.sampling.warp(logits, ...), x = sample(q, uniform()).
    accept(x, p, q, uniform) -> (accepted, token): npspec.decode.acceptance.accept with gamma = 1,
    drawing the acceptance uniform first, then the replacement's.
    """
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

_LOGITS_PROBES = [
    [2.0, 1.0, 0.0, -1.0],
    [-np.inf, 0.0, 0.0, -np.inf],
    [10.0, -10.0, -np.inf, 10.0],
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
]


def _valid_row(q, n):
    q = np.asarray(q, dtype=np.float64)
    return q.shape == (n,) and np.all(np.isfinite(q)) and np.all(q >= 0) and abs(q.sum() - 1) <= 1e-9


MISS_BOUND = 1e-12  # the proposal probes' false-alarm rate per logits row


def probe_proposal(propose, streams=1024):
    """Probes of a proposal with injected uniforms: a list of Findings (empty: passed).

    For each logits row in the kit's list: with the first uniform 0, 1 - 2**-53, and `streams`
    seeded streams, the returned q must be a probability row (finite, >= 0, sums to 1 within
    1e-9), the same each time, and x an id with q[x] > 0 (exact checks). Two more checks that q is
    the array x was drawn from, each flagged only when a sampler drawing from q would fail it with
    probability below MISS_BOUND (1e-12):
      * "proposal-ignores-uniforms": the same x from every stream although q is not one-hot (an
        argmax proposal reporting a softmax q), when sum(q**streams) < 1e-12;
      * "proposal-q-not-sampled": an id y with q[y] > 0 never drawn, when (1 - q[y])**streams
        < 1e-12 (a draft that samples from its top-k or top-p but reports the full softmax as q;
        at the default 1024 streams, every id with q[y] > 0.027 must turn up).
    Calls of `propose` have no time limit: one that never returns hangs the check (npspec.testing says how to bound
    it).
    """
    findings = []
    for logits in _LOGITS_PROBES:
        logits = np.array(logits, dtype=np.float64)
        n = len(logits)
        xs, q0 = [], None
        sources = [Uniforms([0.0])] + [Uniforms([ONE_BELOW])] + [Uniforms(seed=s) for s in range(streams)]
        for k, src in enumerate(sources):
            try:
                x, q = propose(logits.copy(), src)
            except Exception as e:
                findings.append(Finding("proposal-raises", f"logits {logits.tolist()}: {type(e).__name__}: {e}"))
                break
            q = np.asarray(q, dtype=np.float64)
            if not _valid_row(q, n):
                findings.append(Finding("proposal-q", f"logits {logits.tolist()}: q = {q.tolist()} is not a "
                                        f"probability row over {n} ids"))
                break
            if q0 is None:
                q0 = q
            elif not np.array_equal(q, q0):
                findings.append(Finding("proposal-q", f"logits {logits.tolist()}: q changed between calls "
                                        f"({q0.tolist()} then {q.tolist()})"))
                break
            if int(x) != x or not 0 <= x < n or q[int(x)] <= 0:
                findings.append(Finding("proposal-support", f"logits {logits.tolist()}, uniforms {src.drawn}: "
                                        f"x = {x} is not an id with q[x] > 0 (q = {q.tolist()})"))
                break
            if k >= 2:
                xs.append(int(x))
        else:
            if len(set(xs)) == 1 and float(np.sum(q0 ** streams)) < MISS_BOUND:
                findings.append(Finding("proposal-ignores-uniforms", f"logits {logits.tolist()}: x = {xs[0]} for "
                                        f"all {streams} uniform streams although q = {q0.tolist()} (the token is "
                                        "not drawn from q: an argmax proposal reporting a softmax q?)"))
                continue
            missed = [y for y in range(n) if y not in set(xs) and (1 - q0[y]) ** streams < MISS_BOUND]
            if missed:
                findings.append(Finding("proposal-q-not-sampled", f"logits {logits.tolist()}: ids {missed} have "
                                        f"q = {[float(q0[y]) for y in missed]} but were never drawn in {streams} uniform "
                                        f"streams (a sampler drawing from q misses them with probability below "
                                        f"{MISS_BOUND:g}): q is not the array x was drawn from (a top-k or top-p "
                                        "draft reporting the full softmax?)"))
    return findings


def _replacement_problem(token, allowed, p, q):
    r = np.maximum(p - q, 0.0)
    source = (f"norm(max(0, p - q)), whose support is {sorted(np.flatnonzero(r).tolist())}" if r.sum() > 0 else
              "p, since max(0, p - q) has no mass here")
    return (f"rejected x as it should, but the replacement {token} is not one of {sorted(allowed)}: it must be "
            f"drawn from {source}")


def probe_acceptance(accept):
    """Deterministic probes of an acceptance function with injected uniforms (ACCEPT_PROBES).

    Convention: the FIRST uniform accept draws is the acceptance test's u (accept iff u < p[x]/q[x]);
    later ones are its replacement's. Each rejecting probe is run with the replacement uniforms
    0, 1/4, 1/2, 3/4, 1 - 2**-53 and must return an allowed id every time. Returns Findings, each
    naming what was wrong: the decision (accepted or rejected against the probe's u and p/q), an
    accepted token other than x, or a replacement outside the residual's support (p's, when the
    residual has no mass), or an exception.
    Calls of `accept` have no time limit: one that never returns hangs the check (npspec.testing says how to bound
    it).
    """
    findings = []
    for name, p, q, x, u, expect, allowed, why in ACCEPT_PROBES:
        p, q = np.array(p, dtype=np.float64), np.array(q, dtype=np.float64)
        for ur in (_REPLACEMENT_US if expect != "accept" else (0.5,)):
            src = Uniforms([u, ur])
            try:
                kept, token = accept(x, p.copy(), q.copy(), src)
            except Exception as e:
                inputs = f"(p = {p.tolist()}, q = {q.tolist()}, x = {x}, uniforms {src.drawn})"
                findings.append(Finding(name, f"raised {type(e).__name__}: {e} {inputs}; {why}"))
                break
            inputs = f"(p = {p.tolist()}, q = {q.tolist()}, x = {x}, uniforms {src.drawn})"
            test = f"u = {u!r}, p[x]/q[x] = {float(p[x] / q[x])!r}"
            problem = None
            if kept and expect == "reject":
                problem = f"accepted x at {test}: {why}"
            elif kept and token != x:
                problem = f"said it accepted x = {x} but returned token {token}"
            elif not kept and expect == "accept":
                problem = f"rejected x at {test}: {why}"
            elif not kept and token not in allowed:
                problem = _replacement_problem(token, allowed, p, q)
            if problem:
                findings.append(Finding(name, f"{problem} {inputs}"))
                break
    return findings


def chi2_sf(x, df):
    """P(X >= x) for X ~ chi-square with `df` degrees of freedom (integer df >= 1).

    Closed forms of the regularised upper incomplete gamma Q(df/2, x/2): a finite sum for even
    df, erfc plus a finite sum for odd df; terms are summed in log space (no overflow).
    """
    if x <= 0:
        return 1.0
    y = x / 2
    if df % 2 == 0:
        return min(1.0, sum(math.exp(-y + i * math.log(y) - math.lgamma(i + 1)) for i in range(df // 2)))
    terms = sum(math.exp(-y + (i - 0.5) * math.log(y) - math.lgamma(i + 0.5)) for i in range(1, (df - 1) // 2 + 1))
    return min(1.0, math.erfc(math.sqrt(y)) + terms)


def chi_square(counts, probs, min_expected=5.0):
    """Pearson's chi-square of observed `counts` against `probs` (same length).

    Cells with expected count below `min_expected` are pooled into one (merged into the
    smallest other cell if the pool is still below it), so the asymptotic law holds.
    Returns (statistic, df, p_value, impossible), where impossible lists the cells with a
    count but probability 0 (an exact failure, whatever the p-value).
    """
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
    """Chi-square tests of a black-box sampler. Returns (Findings, tests).

    For each (draft logits, p) of STATISTICAL_CASES, n_samples trials of x, q = propose(logits);
    (kept, token) = accept(x, p, q), one seeded uniform stream. Three tests per case:
      * "proposal": x against q (x must be drawn from the q the proposal reports);
      * "round": the joint (kept, token) against min(p, q) for kept, max(0, p - q) for replaced
        (Leviathan et al. 2023, Definition 3.1 and Theorem 3.5: acceptance rate beta = sum(min(p, q)) = 1 - TV(p, q));
      * "output": the emitted token against p (the theorem itself).
    False-alarm rate: at most alpha in total, asymptotically (alpha / 9 per test, Bonferroni).
    Power: a TV of d between the true and the claimed law gives a noncentrality of at least
    n_samples * (2 d)**2 (Cauchy-Schwarz); at the defaults, d = 0.03 is found with probability
    above 0.98 by each test (noncentral chi-square, up to 7 degrees of freedom).
    Calls of `propose` and `accept` have no time limit: one that never returns hangs the check (npspec.testing says
    how to bound it).
    """
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
    """Run every probe (probe_proposal, probe_acceptance) and, if `statistical`, statistical_check.

    propose(logits `[n_vocab]` float64, uniform) -> (x int, q `[n_vocab]`): draws x from the q it returns.
    accept(x, p `[n_vocab]`, q `[n_vocab]`, uniform) -> (accepted bool, token int): token is x if
    accepted, else the replacement; its first uniform is the acceptance test's u.
    uniform: a callable returning the next float in [0, 1).
    Returns a SamplerReport; the probes are exact (no false alarms), the statistical tests have a
    total false-alarm rate of at most alpha (asymptotic chi-square). Probes catch a non-strict
    u <= p/q, a missing or unguarded residual (also behind a non-strict test:
    "residual-zero-mass-above-ratio"), an argmax proposal and a q that is not the array x was
    drawn from (both with a false-alarm rate below MISS_BOUND per logits row; the acceptance
    probes are exact); the statistical tests catch any rule whose law is off by a TV of a few percent.
    A sampler that draws more than MAX_UNIFORMS_PER_CALL uniforms in one call is stopped (a finding).
    Raises KitUsageError (npspec.testing.usage), one line naming the argument, for a propose or accept
    that is not callable, or (if statistical) n_samples not an integer in [100, 1e7], alpha outside
    [1e-12, 0.05] (0 or NaN would turn the tests off), or a negative seed.
    Calls of `propose` and `accept` have no time limit: one that never returns hangs the check (npspec.testing says
    how to bound it).
    """
    where = "check_sampler"
    need_callable(propose, "propose", "propose(logits, uniform) -> (x, q)", where)
    need_callable(accept, "accept", "accept(x, p, q, uniform) -> (accepted, token)", where)
    if not isinstance(statistical, bool):
        raise KitUsageError(f"{where}: statistical must be True or False, got {statistical!r}")
    if statistical:
        n_samples, alpha = need_samples(n_samples, where), need_alpha(alpha, where)
        seed = need_int(seed, "seed", where, 0)
    findings = probe_proposal(propose) + probe_acceptance(accept)
    tests = []
    if statistical:
        more, tests = statistical_check(propose, accept, n_samples, alpha, seed)
        findings += more
    return SamplerReport(not findings, findings, tests)
