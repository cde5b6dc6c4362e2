"""npspec.testing.drafting: check a drafter exactly, by enumeration on table models.

A drafter is lossless when the loop's output, drafting with it, has exactly the target's law
(npspec.decode.drafters states what it must guarantee). `check_drafter` enumerates that law with
npspec.testing.oracle.drafter_paths, for several targets, gammas, budgets, EOS settings and both
gamma schedules, and compares it with the target's own law (sequence_distribution): exactly
for rows of Fractions, to 1e-9 for float rows. It takes a *drafter description* (see
npspec.testing.oracle) built from the target's table, so a drafter that peeks at the target
can be written down and caught. `ngram_drafter` and `confident_drafter` describe npspec's own
strategies; `object_drafter` describes a real drafter object (npspec.decode.types.Drafter) by
steering its uniforms, so yours can be checked as it is. Imports numpy, npspec.decode.drafters,
npspec.sampling, npspec.decode, npspec.testing.oracle and npspec.testing.usage.
"""

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..decode import SCHEDULES, SamplingParams
from ..decode.drafters import ngram_scan
from ..sampling import sample
from .oracle import _nonzero, _prompt, drafter_distribution, random_table, sequence_distribution, table_drafter
from .usage import (MAX_OUTCOMES, MAX_VOCAB, KitUsageError, largest, need_bounded, need_callable, need_int, need_ints,
                    need_row)


def one_hot(x, n_vocab):
    """The exact row `[n_vocab]` with all its mass on x (Fractions)."""
    return [Fraction(int(i == x)) for i in range(n_vocab)]


def ngram_drafter(n_vocab, ngram_min=1, ngram_max=4, eos=None):
    """The description of npspec.decode.drafters.NgramDrafter: one-hot rows along ngram_scan's continuation, then stop."""
    def drafter(seq, drafted):
        cont = ngram_scan(list(seq), len(drafted) + 1, ngram_min, ngram_max, eos)
        if len(cont) <= len(drafted):
            return None
        row = one_hot(cont[len(drafted)], n_vocab)
        return row, row
    return drafter


def confident_drafter(q, p_min):
    """The description of ModelDrafter(p_min): draft from table q; after a draft whose row's largest entry is < p_min, stop."""
    def drafter(seq, drafted):
        if drafted and max(q(seq + drafted[:-1])) < p_min:
            return None
        row = q(seq + drafted)
        return row, row
    return drafter


@dataclass
class DrafterReport:
    """The result of check_drafter. If not ok: the first failing case, as a line, and both laws (or the error)."""

    ok: bool
    cases: int
    case: str = ""
    expected: dict | None = None
    got: dict | None = None
    error: str | None = None

    def __str__(self):
        if self.ok:
            return f"the drafter gives the target's distribution on all {self.cases} cases"
        lines = [f"the drafter FAILS (case {self.cases}: {self.case})"]
        if self.error:
            lines.append(f"  it raised {self.error}")
        else:
            for k in sorted(set(self.expected) | set(self.got)):
                e, g = self.expected.get(k, 0), self.got.get(k, 0)
                lines.append(f"  {k}: target {e}, drafter {g}" + ("" if _close(e, g) else "   <-- differs"))
        return "\n".join(lines)


def _close(a, b):
    if isinstance(a, (Fraction, int)) and isinstance(b, (Fraction, int)):
        return a == b
    return abs(float(a) - float(b)) <= 1e-9


def _same_law(expected, got):
    return all(_close(expected.get(k, 0), got.get(k, 0)) for k in set(expected) | set(got))


def default_targets(n_vocab=3, count=3):
    """`count` random Fraction tables (npspec.testing.oracle.random_table, seeds 0..count-1) over n_vocab ids."""
    return [random_table(n_vocab, seed=s) for s in range(count)]


def check_drafter(make_drafter, n_vocab=3, targets=None, gammas=(1, 2, 3), max_new_tokens=4, eos_values=(None, 2),
                  n_ctx_values=(None,), schedules=SCHEDULES, prompt=(0, 1)):
    """Does drafting with `make_drafter` keep the loop's output exactly target-distributed? Exact enumeration.

    make_drafter(p) -> a drafter description (npspec.testing.oracle) for target table p; it may
    close over p (that is how a drafter that peeks at the target is written down).
    targets: tables over n_vocab ids (default default_targets(n_vocab)); every combination of
    target, gamma, eos, n_ctx and schedule is a case. Compares drafter_distribution with
    sequence_distribution (max_new_tokens ids): equal for Fraction rows, within 1e-9 for floats.
    Returns a DrafterReport for the first failing case; a drafter that raises fails on that case.
    Raises KitUsageError (npspec.testing.usage), one line naming the argument, before any case runs: a
    make_drafter that is not callable, empty gammas, eos_values, n_ctx_values, schedules or targets, a gamma
    below 1 or max_new_tokens below 2 (no round would draft: a vacuous pass), an n_ctx that leaves no room
    for a draft after the prompt, a target whose row is not a probability row over n_vocab ids, or a budget
    whose n_vocab**max_new_tokens outputs exceed usage.MAX_OUTCOMES.
    Calls of `make_drafter` and its drafters have no time limit: one that never returns hangs the check
    (npspec.testing says how to bound it).
    """
    where = "check_drafter"
    need_callable(make_drafter, "make_drafter", "make_drafter(p) -> drafter(seq, drafted)", where)
    n_vocab = need_int(n_vocab, "n_vocab", where, 2, MAX_VOCAB)
    gammas = need_ints(gammas, "gammas", where, 1, why=" (gamma 0 drafts nothing: a vacuous pass)")
    max_new_tokens = need_int(max_new_tokens, "max_new_tokens", where, 2,
                              why=" (with 0 or 1 the loop never drafts: a vacuous pass)")
    prompt = _prompt(prompt, where)
    need_bounded(n_vocab ** max_new_tokens, f"max_new_tokens {max_new_tokens} over {n_vocab} ids "
                 f"({n_vocab}**{max_new_tokens} outputs)", where,
                 f"use max_new_tokens <= {largest(lambda m: n_vocab ** m <= MAX_OUTCOMES, 2)} here")
    eos_values = _values(eos_values, "eos_values", lambda i, e: e if e is None else need_int(
        e, f"eos_values[{i}]", where, 0, n_vocab - 1))
    n_ctx_values = _values(n_ctx_values, "n_ctx_values", lambda i, c: c if c is None else need_int(
        c, f"n_ctx_values[{i}]", where, len(prompt) + 2, why=" (room for the prompt, a draft and its bonus)"))
    schedules = _values(schedules, "schedules", lambda i, s: s if s in SCHEDULES else _bad_schedule(i, s))
    targets = default_targets(n_vocab) if targets is None else _values(targets, "targets", lambda i, t: t)
    for t, p in enumerate(targets):
        if not callable(p):
            raise KitUsageError(f"{where}: targets[{t}] must be a table seq -> row, got {p!r}")
        need_row(p(prompt), f"targets[{t}]'s row after the prompt", where, n_vocab)
    n = 0
    for t, p in enumerate(targets):
        for gamma in gammas:
            for eos in eos_values:
                for n_ctx in n_ctx_values:
                    for schedule in schedules:
                        n += 1
                        case = f"target {t}, gamma {gamma}, eos {eos}, n_ctx {n_ctx}, schedule {schedule}"
                        expected = _nonzero(sequence_distribution(p, prompt, max_new_tokens, eos, n_ctx))
                        try:
                            got = _nonzero(drafter_distribution(p, make_drafter(p), prompt, gamma, max_new_tokens,
                                                                eos, n_ctx, schedule=schedule))
                        except Exception as e:  # the drafter's own exception is a finding, not a crash of the kit
                            return DrafterReport(False, n, case, expected, None, f"{type(e).__name__}: {e}")
                        if not _same_law(expected, got):
                            return DrafterReport(False, n, case, expected, got)
    return DrafterReport(True, n)


def _values(values, name, check):
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise KitUsageError(f"check_drafter: {name} must be a non-empty sequence, got {values!r}")
    values = [check(i, v) for i, v in enumerate(values)]
    if not values:
        raise KitUsageError(f"check_drafter: {name} is empty: nothing would be checked; give at least one value")
    return values


def _bad_schedule(i, s):
    raise KitUsageError(f"check_drafter: schedules[{i}] must be one of {list(SCHEDULES)}, got {s!r}")


class DrafterError(AssertionError):
    """A drafter object's proposal is not what its reported q says it sampled."""


def _cell_middle(row, x):  # a uniform in the middle of x's inverse-CDF cell of row
    cdf = np.cumsum(row)
    lo, hi = (cdf[x - 1] if x else 0.0) / cdf[-1], cdf[x] / cdf[-1]
    return float((lo + hi) / 2)


def object_drafter(make, warp_args=None):
    """A drafter description of a real drafter object, by steering the uniforms it is given.

    make(): a fresh drafter (npspec.decode.types.Drafter: start, propose -> Proposal). For the context seq and
    the drafts so far, the description starts a fresh drafter on seq and calls propose with
    gamma = len(drafted) + 1 and uniforms in the middle of each earlier draft's cell of its
    reported row, so it proposes `drafted` again; then, for each id x of the next reported row
    q, it calls again with the last uniform in the middle of x's cell: proposing x puts q[x] on
    x, proposing nothing more moves q[x] to "stop". Proposing any other id raises DrafterError
    (its q is not what it sampled from). Rows are float64, so check_drafter compares to 1e-9.
    This covers drafters whose proposals depend on the ids and their own uniforms; one that
    learns across rounds (update) is described from a fresh start only.
    """
    warp_args = dict(temperature=1.0) if warp_args is None else warp_args

    sampling = SamplingParams(**warp_args)

    def call(seq, us, gamma):
        drafter = make()
        drafter.start(list(seq))
        proposal = drafter.propose(list(seq), gamma, np.array(us + [0.5] * (gamma - len(us))), sampling)
        return proposal.ids, proposal.q_rows(drafter.n_vocab)

    def drafter(seq, drafted):
        us = []
        for j in range(len(drafted) + 1):  # steer to the drafts so far, one position at a time
            d, q = call(seq, us, len(drafted) + 1)
            if list(d[:j]) != list(drafted[:j]) or (j < len(drafted) and len(d) <= j):
                raise DrafterError(f"after {list(seq)} the drafter did not propose {list(drafted[:j + 1])} again "
                                   "for the same uniforms: its proposals must depend on the ids and its uniforms only")
            if j < len(drafted):
                us.append(_cell_middle(q[j], drafted[j]))
        if len(d) <= len(drafted):
            return None
        row = np.asarray(q[len(drafted)], dtype=np.float64)
        proposal = np.zeros_like(row)
        for x in np.flatnonzero(row > 0):
            d, _ = call(seq, us + [_cell_middle(row, x)], len(drafted) + 1)
            if len(d) > len(drafted):
                if d[len(drafted)] != x or sample(row, _cell_middle(row, x)) != x:
                    raise DrafterError(f"after {list(seq) + list(drafted)} the drafter proposed {d[len(drafted)]} for "
                                       f"a uniform in the cell of {x} of its reported q: q is not what it sampled from")
                proposal[x] = row[x]
        return [Fraction(v) for v in proposal] if proposal.sum() < row.sum() else proposal, row
    return drafter


__all__ = ["DrafterError", "DrafterReport", "check_drafter", "confident_drafter", "default_targets", "ngram_drafter",
           "object_drafter", "one_hot", "table_drafter"]
