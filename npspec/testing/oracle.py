"""npspec.testing.oracle: the exact law of speculative decoding, by enumeration, for a rule stated as probabilities.

A *rule* `rule(p, q, x) -> (a, r)`: accept the draft x ~ q with probability a, else sample the row r (Leviathan's
letters: p target, q draft). A *table* `table(seq) -> row`: the next-token law after ids seq, Fractions or floats. A
*drafter description* `drafter(seq, drafted) -> (proposal, q)` or None: proposal[x] the probability of proposing x
next (missing mass: stop), q the row tested; lossless iff proposal == q. check_rule proves a rule exact on small
cases (Leviathan et al. 2023, Appendix A.1; Chen et al. 2023, Theorem 1; notes/derivation.md, claims 1 and 3). An
enumeration past MAX_OUTCOMES paths raises KitUsageError. Imports numpy, npspec.decode and npspec.testing.usage.
"""

import random
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..decode.sampling import residual, warp
from ..decode import next_gamma, round_gamma
from .usage import (MAX_OUTCOMES, MAX_TOL, KitUsageError, largest, need_bounded, need_callable, need_int, need_ints,
                    need_real, need_row)


def leviathan_rule(p, q, x):
    """Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023, Algorithm 2), rows `[n_vocab]` of Fractions or
    floats: (a, r), a = min(1, p[x] / q[x]) for q[x] > 0, r = norm(max(0, p - q)), or p when that has no mass."""
    a = min(1, p[x] / q[x])
    r = [max(0, pi - qi) for pi, qi in zip(p, q)]
    mass = sum(r)
    return a, ([ri / mass for ri in r] if mass > 0 else list(p))


def npspec_rule(p, q, x):
    """npspec's rule in float64: (min(1, p[x] / q[x]), npspec.decode.sampling.residual(p, q) `[n_vocab]`)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    with np.errstate(over="ignore"):  # p/q overflows to inf for a denormal q: min(1, inf) == 1, as it should
        return min(1.0, p[x] / q[x]), residual(p, q)


@dataclass(frozen=True)
class Round:
    """One round of a path, as a `--trace` record: the drafts that decided it (up to the rejected one or the
    accepted EOS), how many were kept, the corrected or bonus id (None after an accepted EOS), the clamped gamma."""

    drafted: tuple
    accepted: int
    token: int | None
    gamma: int | None = None


@dataclass(frozen=True)
class SpeculativePath:
    """One path through the speculative loop: the emitted ids (prompt excluded), its probability, its rounds."""

    ids: tuple
    prob: object
    rounds: tuple


class RuleError(ValueError):
    """A rule returned something that is not a probability and a distribution."""


def _check_output(a, r, p, x, exact):
    tol = 0 if exact else 1e-9
    if not -tol <= a <= 1 + tol:
        raise RuleError(f"acceptance probability {a} for x={x} is outside [0, 1]")
    if len(r) != len(p):
        raise RuleError(f"replacement row has {len(r)} entries, expected {len(p)}")
    if any(not ri >= 0 for ri in r) or abs(sum(r) - 1) > tol:  # `not >=` also catches NaN
        raise RuleError(f"replacement row {list(r)} for x={x} is not a distribution")


def _is_exact(row):
    return all(isinstance(v, (Fraction, int)) for v in row)


def table_drafter(q):
    """The drafter description of a draft model with table q: it proposes x with probability q(ctx)[x] and reports q(ctx)."""
    def drafter(seq, drafted):
        row = q(seq + drafted)
        return row, row
    return drafter


class _Budget:
    """Counts the paths an enumeration walks; past MAX_OUTCOMES, a one-line KitUsageError instead of memory or hours."""

    def __init__(self, what):
        self.left, self.what = MAX_OUTCOMES, what

    def spend(self):
        self.left -= 1
        if self.left < 0:
            raise KitUsageError(f"{self.what} walks more than {MAX_OUTCOMES} paths (npspec.testing.usage.MAX_OUTCOMES): "
                                "use a smaller gamma, budget or vocabulary")


def _round(p, drafter, seq, g, eos, rule, budget=None):
    """Yield (Round, emitted ids, probability) for every outcome of one round of at most g drafts after seq."""
    budget = budget or _Budget("the round's enumeration")

    def walk(drafted, prob):
        budget.spend()
        ctx = seq + drafted
        prow = p(ctx)
        step = drafter(seq, drafted) if len(drafted) < g else None
        proposal, qrow = step if step is not None else ((), None)
        stop = (1 - sum(proposal) if _is_exact(proposal) else 0) if step is not None else 1
        if stop:  # no more drafts: every draft was kept, the bonus token comes from p
            for y, py in enumerate(prow):
                if py:
                    yield Round(drafted, len(drafted), y, g), drafted + (y,), prob * stop * py
        exact = _is_exact(prow) and (qrow is None or _is_exact(qrow))
        for x, mx in enumerate(proposal):
            if not mx:
                continue
            a, r = rule(prow, qrow, x)
            _check_output(a, r, prow, x, exact and _is_exact([a]) and _is_exact(r))
            kept = drafted + (x,)
            if a and x == eos:  # an accepted EOS ends the round and the generation
                yield Round(kept, len(kept), None, g), kept, prob * mx * a
            elif a:
                yield from walk(kept, prob * mx * a)
            if a != 1:
                for y, ry in enumerate(r):
                    if ry:
                        yield Round(kept, len(drafted), y, g), drafted + (y,), prob * mx * (1 - a) * ry

    yield from walk((), 1)


def _stopped(seq, n_prompt, max_new_tokens, eos, n_ctx):
    out = seq[n_prompt:]
    return (len(out) >= max_new_tokens or (n_ctx is not None and len(seq) >= n_ctx)
            or (eos is not None and len(out) > 0 and out[-1] == eos))


def _first_gamma(gamma, max_new_tokens, n_ctx):  # the loop's first scheduled gamma: room for a bonus token
    return min(gamma, max_new_tokens - 1, n_ctx - 1) if n_ctx is not None else min(gamma, max_new_tokens - 1)


def _start(prompt, n_ctx):
    prompt = tuple(int(i) for i in prompt)
    if not prompt:
        raise ValueError("the prompt is empty: give at least one id")
    if n_ctx is not None and len(prompt) > n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} ids but n_ctx is {n_ctx}")
    return prompt


def sequence_distribution(p, prompt, max_new_tokens, eos=None, n_ctx=None):
    """The target's own law `{emitted ids: probability}` from table p after prompt (at least one id):
    stops after max_new_tokens ids, an emitted eos (kept) or n_ctx ids in all, as npspec's loop does. Raises
    ValueError for an empty or too long prompt."""
    prompt = _start(prompt, n_ctx)
    dist = defaultdict(int)

    budget = _Budget("the target's enumeration")

    def go(seq, prob):
        budget.spend()
        if _stopped(seq, len(prompt), max_new_tokens, eos, n_ctx):
            dist[seq[len(prompt):]] += prob
            return
        for y, py in enumerate(p(seq)):
            if py:
                go(seq + (y,), prob * py)

    go(prompt, 1)
    return dict(dist)


def drafter_paths(p, drafter, prompt, gamma, max_new_tokens, eos=None, n_ctx=None, rule=leviathan_rule,
                  schedule="constant"):
    """Every path (SpeculativePath, probability > 0) of npspec's loop with table p and a drafter description:
    a round drafts at most round_gamma's clamp of the scheduled gamma (next_gamma moves it), tests the drafts in order
    with `rule`, emits the kept ones and the replacement or bonus; an accepted EOS ends it. Stops as
    sequence_distribution does. Raises RuleError for a rule that returns an invalid probability or row."""
    prompt = _start(prompt, n_ctx)
    gamma = _first_gamma(gamma, max_new_tokens, n_ctx)

    budget = _Budget("the loop's enumeration")

    def go(seq, prob, rounds, scheduled):
        if _stopped(seq, len(prompt), max_new_tokens, eos, n_ctx):
            yield SpeculativePath(seq[len(prompt):], prob, rounds)
            return
        g = max(0, round_gamma(scheduled, max_new_tokens - (len(seq) - len(prompt)), n_ctx, len(seq)))
        for rnd, emitted, rp in _round(p, drafter, seq, g, eos, rule, budget):
            yield from go(seq + emitted, prob * rp, rounds + (rnd,), next_gamma(schedule, scheduled, rnd.accepted))

    yield from go(prompt, 1, (), gamma)


def speculative_paths(p, q, prompt, gamma, max_new_tokens, eos=None, n_ctx=None, rule=leviathan_rule):
    """drafter_paths with a draft model of table q (table_drafter(q)) and a constant gamma."""
    return drafter_paths(p, table_drafter(q), prompt, gamma, max_new_tokens, eos, n_ctx, rule)


def drafter_distribution(p, drafter, prompt, gamma, max_new_tokens, eos=None, n_ctx=None, rule=leviathan_rule,
                         schedule="constant"):
    """`{emitted ids: probability}` of the speculative loop with a drafter description: drafter_paths summed by output."""
    dist = defaultdict(int)
    for path in drafter_paths(p, drafter, prompt, gamma, max_new_tokens, eos, n_ctx, rule, schedule):
        dist[path.ids] += path.prob
    return dict(dist)


def speculative_distribution(p, q, prompt, gamma, max_new_tokens, eos=None, n_ctx=None, rule=leviathan_rule):
    """`{emitted ids: probability}` of the speculative loop: speculative_paths summed by output."""
    return drafter_distribution(p, table_drafter(q), prompt, gamma, max_new_tokens, eos, n_ctx, rule)


def round_distribution(p, q, prompt, gamma, eos=None, rule=leviathan_rule):
    """`{ids: probability}` of ONE round of gamma drafts, continued by the target alone to gamma + 1 ids
    (shorter at eos): a rule is correct iff this is sequence_distribution(p, prompt, gamma + 1, eos) for every p, q."""
    prompt = _start(prompt, None)
    outcomes = _round(p, table_drafter(q), prompt, gamma, eos, rule, _Budget("the round's enumeration"))
    return _continued(p, prompt, ((emitted, prob) for _, emitted, prob in outcomes), gamma + 1, eos)


def _continued(p, prompt, outcomes, length, eos):
    """`{ids: probability}`: each (emitted ids, probability) of a round after prompt, continued by the target alone
    to `length` ids (shorter at eos)."""
    dist = defaultdict(int)
    for emitted, prob in outcomes:
        if eos is not None and emitted[-1] == eos:
            dist[emitted] += prob
            continue
        for tail, tp in sequence_distribution(p, prompt + emitted, length - len(emitted), eos).items():
            dist[emitted + tail] += prob * tp
    return dict(dist)


def total_variation(a, b):
    """1/2 * sum |a - b| over the union of the keys of two `{outcome: probability}` dicts."""
    return sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b)) / 2


def _nonzero(dist):
    return {k: v for k, v in dist.items() if v}


def constant_table(row):
    """A table whose row does not depend on the sequence."""
    row = list(row)
    return lambda seq: row


def random_table(n_vocab, seed=0, zero_prob=Fraction(1, 4), denominator=12):
    """A reproducible table of random Fraction rows, one per sequence (memoised): entries k / sum for integer
    weights k in 1..denominator, or 0 with probability zero_prob (one entry stays positive)."""
    memo = {}

    def table(seq):
        seq = tuple(seq)
        if seq not in memo:
            rng = random.Random(f"{seed}:{n_vocab}:{seq}")
            w = [0 if rng.random() < zero_prob else rng.randint(1, denominator) for _ in range(n_vocab)]
            if not any(w):
                w[rng.randrange(n_vocab)] = 1
            memo[seq] = [Fraction(k, sum(w)) for k in w]
        return memo[seq]

    return table


def truncate(row, top_k=0, top_p=1):
    """Exact top-k / top-p of a Fraction row, renormalised, as npspec.decode.sampling.warp: top_k keeps entries
    >= the k-th largest (0: off); top_p drops the ascending prefix (ties by id) of mass <= 1 - top_p, never the most
    likely entry (1: off)."""
    row = [Fraction(v) for v in row]
    if top_k and top_k < len(row):
        kth = sorted(row, reverse=True)[top_k - 1]
        row = [v if v >= kth else Fraction(0) for v in row]
        row = [v / sum(row) for v in row]
    if top_p < 1:
        order = sorted(range(len(row)), key=lambda i: row[i])  # stable: ascending, ties by id
        cum = Fraction(0)
        for i in order[:-1]:
            cum += row[i]
            if cum <= 1 - Fraction(top_p):
                row[i] = Fraction(0)
        row = [v / sum(row) for v in row]
    return row


def model_table(model, temperature=1.0, top_k=0, top_p=1.0):
    """A model (or TableModel) as a table: seq -> warp(logits at its last position), float64, memoised (one
    fresh forward per new sequence)."""
    memo = {}

    def table(seq):
        seq = tuple(seq)
        if seq not in memo:
            logits = model.forward(np.array(seq, dtype=np.int64), model.new_cache())[-1]
            memo[seq] = warp(logits, temperature=temperature, top_k=top_k, top_p=top_p)
        return memo[seq]

    return table


def small_cases(max_vocab=3, max_denominator=4):
    """Pairs (p, q) of constant Fraction rows, smallest first (n_vocab 2..max_vocab, then the denominator),
    each once: zeros, one-hot rows, p == q and disjoint supports included."""
    def rows(n, d):
        def comp(n, total):
            if n == 1:
                yield (total,)
                return
            for k in range(total, -1, -1):
                for rest in comp(n - 1, total - k):
                    yield (k,) + rest
        return [tuple(Fraction(k, d) for k in c) for c in comp(n, d)]

    for n in range(2, max_vocab + 1):
        seen = set()
        for d in range(1, max_denominator + 1):
            grid = rows(n, d)
            for p in grid:
                for q in grid:
                    if (p, q) not in seen:
                        seen.add((p, q))
                        yield list(p), list(q)


@dataclass
class RuleReport:
    """The result of check_rule. If not ok: the smallest failing p, q, gamma and both laws (or the error)."""

    ok: bool
    cases: int
    p: object = None
    q: object = None
    gamma: int | None = None
    expected: dict | None = None
    got: dict | None = None
    error: str | None = None
    tol: float = 0  # the tolerance the laws were compared with: 0 for a rule that returned Fractions only
    diagnosis: str = ""  # "; it gives the law of ..." naming the zoo's bug classes whose law it gives, if any

    def __str__(self):
        how = "exactly" if not self.tol else f"to within {self.tol:g} per outcome: the rule returned floats"
        if self.ok:
            return f"the rule gives the target's distribution on all {self.cases} cases ({how})"
        lines = [f"the rule FAILS (case {self.cases}): p = {_fmt(self.p)}, q = {_fmt(self.q)}, gamma = {self.gamma}"
                 + ("" if self.error else f" (compared {how})")]
        if self.error:
            lines.append(f"  it raised {self.error}")
        else:
            if self.diagnosis:
                lines.append(f"  {self.diagnosis.lstrip('; ')}")
            for k in sorted(set(self.expected) | set(self.got)):
                e, g = self.expected.get(k, 0), self.got.get(k, 0)
                lines.append(f"  {k}: target {e}, rule {g}" + ("" if abs(e - g) <= self.tol else "   <-- differs"))
        return "\n".join(lines)


def _fmt(row):
    if callable(row):
        return repr(row)
    return "[" + ", ".join(str(v) for v in row) + "]"


def _differ(expected, got, tol):
    """True if two laws differ: exactly when tol is 0, else by more than tol on some outcome."""
    if not tol:
        return got != expected
    return any(abs(expected.get(k, 0) - got.get(k, 0)) > tol for k in set(expected) | set(got))


def check_rule(rule, cases=None, gammas=(1, 2), prompt=(0,), eos=None, tol=1e-12):
    """Does `rule(p, q, x) -> (a, r)` (given Fraction rows) give exactly the target's law? Exact enumeration.

    For each (p, q) of `cases` (rows or tables; default small_cases()) and gamma, round_distribution against
    sequence_distribution: equal, or within `tol` per outcome for a float rule (npspec_rule). Returns a RuleReport: ok,
    or the first failing case with both laws (a rule that raises fails there). Raises KitUsageError for a non-callable
    rule, empty cases or gammas, a gamma < 1, a p or q not a probability row, tol outside [0, 1e-6] or n_vocab**(gamma
    + 1) over MAX_OUTCOMES. A `rule` that never returns hangs the check (npspec.testing)."""
    where = "check_rule"
    need_callable(rule, "rule", "rule(p, q, x) -> (a, r)", where)
    gammas = need_ints(gammas, "gammas", where, 1, why=" (gamma 0 drafts nothing: no rule would be tested)")
    prompt = _prompt(prompt, where)
    tol = need_real(tol, "tol", where, 0, MAX_TOL, why=" (a wrong rule is off by far more than rounding)")
    n, used = 0, 0
    for p, q in (small_cases() if cases is None else cases):
        n += 1
        pt = p if callable(p) else constant_table(p)
        qt = q if callable(q) else constant_table(q)
        n_vocab = need_row(pt(prompt), f"cases[{n - 1}]'s p", where)
        need_row(qt(prompt), f"cases[{n - 1}]'s q", where, n_vocab)
        if eos is not None:
            need_int(eos, "eos", where, 0, n_vocab - 1)
        for gamma in gammas:
            need_bounded(n_vocab ** (gamma + 1), f"gamma {gamma} over {n_vocab} ids ({n_vocab}**{gamma + 1} sequences)",
                         where, f"use gamma <= {largest(lambda g: n_vocab ** (g + 1) <= MAX_OUTCOMES)} here")
            expected = _nonzero(sequence_distribution(pt, prompt, gamma + 1, eos))
            try:
                got = _nonzero(round_distribution(pt, qt, prompt, gamma, eos, rule))
            except Exception as e:  # a rule's own exception is a finding, not a crash of the kit
                return RuleReport(False, n, p, q, gamma, expected, None, f"{type(e).__name__}: {e}")
            case_tol = 0 if _is_exact(got.values()) else tol
            used = max(used, case_tol)
            if _differ(expected, got, case_tol):
                return RuleReport(False, n, p, q, gamma, expected, got, tol=case_tol)
    if not n:
        raise KitUsageError(f"{where}: cases is empty: nothing would be checked; give at least one (p, q) "
                            "or leave it None (small_cases())")
    return RuleReport(True, n, tol=used)


def _prompt(prompt, where):
    if isinstance(prompt, (str, bytes)) or not hasattr(prompt, "__iter__"):
        raise KitUsageError(f"{where}: prompt must be a non-empty sequence of ids, got {prompt!r}")
    return need_ints(prompt, "prompt", where, 0)
