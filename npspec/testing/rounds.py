"""npspec.testing.rounds: check a whole speculative round, black box: gamma drafts, their tests, the correction or bonus.

The round is `round_fn(draft_logits, target_logits, u, warping) -> (drafts, accepted, token)`: logits `[gamma + 1,
n_vocab]` float64, row i after i drafts (whatever they were); u `[2 gamma + 1]` uniforms (u[i] draws draft i,
u[gamma + i] tests it, u[2 gamma] draws the correction or bonus: Leviathan et al. 2023, Algorithm 1); warping
`{temperature, top_k, top_p}` for both rows. It returns all gamma drafts, the number kept and the correction or
bonus id, each an integer (2.0 or 2.5 is a finding, never truncated). npspec/testing/VECTORS.md, "Conventions", spells out the rules and the layout.
Imports numpy, npspec.decode, npspec.testing.probes and npspec.testing.usage.
"""

from dataclasses import dataclass, field

import numpy as np

from ..decode.sampling import residual, sample, warp
from ..decode import accept
from .probes import GPT2_VOCAB, Finding, chi_square, id_problem, integer, mutated, realistic_logits
from .zoo import named
from .usage import KitUsageError, need_alpha, need_callable, need_int, need_real, need_samples

# (name, n_vocab, gamma, warping)
ROUND_CASES = [
    ("gpt2-vocab-top-k-50", GPT2_VOCAB, 3, dict(temperature=1.0, top_k=50, top_p=1.0)),
    ("gpt2-vocab-top-k-100-t0.8", GPT2_VOCAB, 2, dict(temperature=0.8, top_k=100, top_p=1.0)),
    ("gpt2-vocab-top-p-0.9", GPT2_VOCAB, 3, dict(temperature=1.0, top_k=0, top_p=0.9)),
    ("gpt2-vocab-plain", GPT2_VOCAB, 4, dict(temperature=1.0, top_k=0, top_p=1.0)),
    ("gpt2-vocab-greedy", GPT2_VOCAB, 3, dict(temperature=0.0, top_k=0, top_p=1.0)),
    ("small-vocab-top-k-2", 8, 4, dict(temperature=1.0, top_k=2, top_p=1.0)),
]

NEAR_ONE = 1 - 2 ** -10  # rejects every draft with p/q below it, and is no tie with p/q = 1 (p == q)
EDGE = 2.0 ** -13  # odd trials draw at this distance inside a CDF cell's edge: float32 stays inside, bfloat16 not
TIE_TOL = 1e-9  # a uniform this close to p/q or a CDF cell edge is a float64 rounding tie (float32 rounds: 1e-6)


def round_rows(n_vocab, gamma, seed):
    """(draft_logits, target_logits), each `[gamma + 1, n_vocab]`: a target row per position (realistic_logits)
    and a draft close to it (the target's logits plus normal noise of scale 0.7, on the same grid, its own -inf
    entries); the target bans the draft's second choice at each position (p = 0 where q is large)."""
    target = realistic_logits(n_vocab, gamma + 1, seed)
    rng = np.random.default_rng(seed + 1)
    draft = np.round((target + rng.normal(0, 0.7, target.shape)) / 0.125) * 0.125
    draft = np.where(np.isfinite(draft), draft, realistic_logits(n_vocab, gamma + 1, seed + 2))  # q > 0 where p = 0
    for i in range(gamma + 1):
        second = np.argsort(draft[i])[-2]
        if n_vocab > 2 and second != np.argmax(target[i]):
            target[i, second] = -np.inf
    return draft, target


def _play(P, Q, u, gamma, strict=True, ratio_p=None, ratio_q=None, res_p=None, res_q=None, bonus=None,
          no_residual=False, argmax=False, argmax_last=False, reuse=False, u_test=None, draw_q=None, margins=None):
    """One round by the rules, with knobs for the classic bugs (all off: the correct round): `argmax` takes each
    draft's argmax, `argmax_last` the correction's or bonus's; `reuse` draws draft i and its recovery with the
    test's u[gamma + i]; `u_test` a constant test uniform; `draw_q` the rows the drafts are drawn from. Returns
    (drafts, accepted, token); `margins` (a list) collects each decision's distance to its boundary."""
    ratio_p, ratio_q = P if ratio_p is None else ratio_p, Q if ratio_q is None else ratio_q
    tests = u[gamma:2 * gamma] if u_test is None else np.full(gamma, u_test)
    res_p, res_q = P if res_p is None else res_p, Q if res_q is None else res_q

    def draw(row, v, top):
        x = int(np.argmax(row)) if top else sample(row, v)
        if margins is not None:
            cdf = np.cumsum(row) / row.sum()
            margins.append(min(v - (cdf[x - 1] if x else 0.0), cdf[x] - v))
        return x

    drafts = [draw(Q[i] if draw_q is None else draw_q[i], u[gamma + i] if reuse else u[i], argmax)
              for i in range(gamma)]
    n = gamma
    for i, d in enumerate(drafts):
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            r = ratio_p[i][d] / ratio_q[i][d]
        if margins is not None and not (r == 0 and tests[i] == 0):  # u = 0 with p = 0 is exact: never a tie
            margins.append(abs(tests[i] - r) / max(1.0, r))
        if not (tests[i] < r if strict else tests[i] <= r):
            n = i
            break
    if n == gamma:
        last = P[gamma] if bonus is None else bonus
    else:
        last = res_p[n] if no_residual else residual(res_p[n], res_q[n])
    return drafts, n, draw(last, u[gamma + n] if reuse and n < gamma else u[2 * gamma], argmax_last)


def _middle(row, v, edge=None):  # the middle of the inverse-CDF cell of row that v falls in, or `edge` inside its
    cdf = np.cumsum(row) / row.sum()  # lower (edge > 0) or upper (edge < 0) end, for cells wider than 4 |edge|
    x = sample(row, v)
    lo, hi = (cdf[x - 1] if x else 0.0), cdf[x]
    if edge is None or hi - lo <= 4 * abs(edge):
        return float((lo + hi) / 2)
    return float(lo + edge if edge > 0 else hi + edge)


def bf16(rows):  # [..., n] float64 -> [..., n] float64: each entry rounded to bfloat16 (8 significant bits)
    bits = np.asarray(rows, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32).astype(np.float64)


def _shift(rows):  # rows i -> i + 1 (the last kept): "draft i tested against p_{i+1}"
    return np.concatenate([rows[1:], rows[-1:]])


# the classic bugs, each as the knobs of _play that reproduce it: (name, what it does, knobs(P, Q, P_raw, Q_raw, g))
DIAGNOSES = [
    ("non-strict-test", "a non-strict test u <= p/q (it keeps a draft the target gives probability 0 when u = 0)",
     lambda P, Q, Pr, Qr, g: dict(strict=False)),
    ("bonus-from-draft", "the bonus token drawn from the draft's row q_gamma instead of the target's p_gamma",
     lambda P, Q, Pr, Qr, g: dict(bonus=Q[g])),
    ("bonus-from-last-draft-row", "the bonus token drawn from the last draft's row q_(gamma-1) instead of p_gamma",
     lambda P, Q, Pr, Qr, g: dict(bonus=Q[g - 1])),
    ("rows-off-by-one", "draft i tested against the target's row p_(i+1) instead of p_i (position misalignment)",
     lambda P, Q, Pr, Qr, g: dict(ratio_p=_shift(P))),
    ("rows-off-by-one-everywhere", "the target's rows shifted by one position in the test and the residual",
     lambda P, Q, Pr, Qr, g: dict(ratio_p=_shift(P), res_p=_shift(P))),
    ("q-unwarped", "the drafts drawn from the warped q, but the test and the residual given the unwarped softmax q",
     lambda P, Q, Pr, Qr, g: dict(ratio_q=Qr, res_q=Qr)),
    ("p-unwarped", "the target's rows not warped like the draft's (plain softmax p in the test, residual and bonus)",
     lambda P, Q, Pr, Qr, g: dict(ratio_p=Pr, res_p=Pr, bonus=Pr[g])),
    ("no-residual", "after a rejection the correction drawn from p instead of norm(max(0, p - q))",
     lambda P, Q, Pr, Qr, g: dict(no_residual=True)),
    ("argmax-draft", "the drafts are the draft row's argmax, not drawn from q with u[i] (the correction and the "
     "bonus drawn as they should be)", lambda P, Q, Pr, Qr, g: dict(argmax=True)),
    ("argmax-everywhere", "every id is its row's argmax, the drafts, the correction and the bonus (greedy whatever "
     "the temperature)", lambda P, Q, Pr, Qr, g: dict(argmax=True, argmax_last=True)),
    ("uniform-reused", "draft i drawn with its test's uniform u[gamma + i], the recovery too (one draw used twice)",
     lambda P, Q, Pr, Qr, g: dict(reuse=True)),
    ("constant-uniform", "every test run with u = 0 (a hard-coded uniform: every draft the target can emit is kept)",
     lambda P, Q, Pr, Qr, g: dict(u_test=0.0)),
    ("precision-mismatch", "the drafts drawn from q rounded to bfloat16, tested and corrected with q itself",
     lambda P, Q, Pr, Qr, g: dict(draw_q=bf16(Q))),
]


@dataclass
class RoundReport:
    """The result of check_round: ok, the Findings (one per case and bug), trials compared and skipped, chi-square tests."""

    ok: bool
    findings: list = field(default_factory=list)
    trials: int = 0
    skipped: int = 0
    tests: list = field(default_factory=list)

    def __str__(self):
        if self.ok:
            return (f"the round matches the reference on all {self.trials} trials ({self.skipped} skipped at a "
                    f"boundary) and passes {len(self.tests)} chi-square tests")
        return "the round FAILS:\n" + "\n".join(f"  {f}" for f in self.findings)


def _outcome(out, gamma, n_vocab):
    """(drafts tuple, accepted, token) from what round_fn returned, or a string saying what is wrong with it."""
    try:
        drafts, accepted, token = out
        drafts = tuple(drafts)
    except (TypeError, ValueError):
        return f"returned {out!r}, not (drafts, accepted, token)"
    values = [*((f"drafts[{i}]", d) for i, d in enumerate(drafts)), ("accepted", accepted), ("token", token)]
    if wrong := [f"{name} = {value!r}" for name, value in values if integer(value) is None]:
        return (f"returned {', '.join(wrong[:4])}{' ...' if len(wrong) > 4 else ''}: not integers (the drafts and the "
                "token are ids, accepted a count: ints, never truncated to fit)")
    drafts, accepted, token = tuple(integer(d) for d in drafts), integer(accepted), integer(token)
    if wrong := [p for i, d in enumerate(drafts) if (p := id_problem(d, n_vocab, f"drafts[{i}]"))][:1] or \
            [p for p in [id_problem(token, n_vocab, "token")] if p]:
        return f"returned {wrong[0]}"
    if len(drafts) != gamma:
        return f"returned drafts {list(drafts)[:8]}: expected {gamma} ids in [0, {n_vocab})"
    if not 0 <= accepted <= gamma:
        return f"returned accepted {accepted}, token {token}: expected 0 <= accepted <= {gamma}, 0 <= token < {n_vocab}"
    return drafts, accepted, token


def _key(P, Q, u, gamma, **knobs):
    d, n, t = _play(P, Q, u, gamma, **knobs)
    return tuple(d), n, t


def _explain(P, Q, Pr, Qr, gamma, played):
    """'; it is ...' naming the DIAGNOSES that return what round_fn returned on every trial (or, failing that,
    on each trial where it differs), else that no classic bug explains it."""
    def agrees(knobs, trials):
        try:
            return all(got == _key(P, Q, u, gamma, **knobs) for u, got in trials)
        except ValueError:  # the bug's own rows cannot be sampled here (an unguarded residual, say)
            return False

    differing = [(u, got) for u, got in played if got != _key(P, Q, u, gamma)]
    every = [f"{name}: {what}{named(name)}" for name, what, knobs in DIAGNOSES if agrees(knobs(P, Q, Pr, Qr, gamma), played)]
    if every:
        return "; on every trial it returns what a round with " + " / ".join(every) + " returns"
    some = [f"{name}: {what}{named(name)}" for name, what, knobs in DIAGNOSES
            if agrees(knobs(P, Q, Pr, Qr, gamma), differing)]
    if some:
        return ("; where it differs it returns what a round with " + " / ".join(some) + " returns (more than "
                "one bug, or another bug, elsewhere)")
    return "; no classic bug (DIAGNOSES) explains it"


def check_round(round_fn, cases=None, trials=24, seed=0, tie_tol=TIE_TOL, statistical=False, n_samples=20000,
                alpha=1e-6):
    """Compare `round_fn` (the module docstring) with the reference, trial by trial, exactly; returns a RoundReport.

    cases: (name, n_vocab, gamma, warping) tuples, default ROUND_CASES (up to GPT-2's 50,257 ids). Per case `trials`
    seeded uniform vectors (each draw's uniform moved to the middle of its cell, or EDGE inside it on odd trials):
    random, test uniforms 0 (the bonus) or 1 - 2**-10 (the residual); trials within tie_tol of a boundary skipped. A
    failing case's Finding names the DIAGNOSES (and zoo classes) that return what round_fn did; ids out of range and
    written inputs are findings. If `statistical`, round_statistics too. Raises KitUsageError for a non-callable round_fn, a bad case, trials outside
    [1, 10000], tie_tol outside [0, 1e-3], or bad n_samples or alpha. A `round_fn` that never returns hangs the
    check (npspec.testing)."""
    where = "check_round"
    need_callable(round_fn, "round_fn", "round_fn(draft_logits, target_logits, u, warping) -> (drafts, accepted, token)", where)
    trials = need_int(trials, "trials", where, 1, 10000)
    seed = need_int(seed, "seed", where, 0)
    tie_tol = need_real(tie_tol, "tie_tol", where, 0, 1e-3)
    cases = _cases(ROUND_CASES if cases is None else cases, where)
    report = RoundReport(True)
    for c, (name, n_vocab, gamma, warping) in enumerate(cases):
        draft_logits, target_logits = round_rows(n_vocab, gamma, seed + 1000 * c)
        P, Q = warp(target_logits, **warping), warp(draft_logits, **warping)
        Pr, Qr = warp(target_logits), warp(draft_logits)
        rng = np.random.default_rng(seed + 1000 * c)
        played, first = [], None  # (u, what round_fn returned) of every trial compared; the first that differs
        for k in range(trials):
            u = rng.random(2 * gamma + 1)
            if k % 3 == 1:
                u[gamma:2 * gamma] = 0.0
            elif k % 3 == 2:
                u[gamma:2 * gamma] = NEAR_ONE
            edge = None if k % 2 == 0 else EDGE * (1 if k % 4 == 1 else -1)  # odd trials: at a cell's edge
            for i in range(gamma):  # each draw's uniform in the middle of its cell (or near an edge), same id
                u[i] = _middle(Q[i], u[i], edge)
            _, n, _ = _play(P, Q, u, gamma)
            u[2 * gamma] = _middle(P[gamma] if n == gamma else residual(P[n], Q[n]), u[2 * gamma], edge)
            margins = []
            want = _play(P, Q, u, gamma, margins=margins)
            if min(margins) < tie_tol:
                report.skipped += 1
                continue
            report.trials += 1
            want = (tuple(want[0]), want[1], want[2])
            given = [draft_logits.copy(), target_logits.copy(), u.copy()]
            try:
                got = _outcome(round_fn(*given, dict(warping)), gamma, n_vocab)
            except Exception as e:  # the round's own exception is a finding, not a crash of the kit
                got = f"raised {type(e).__name__}: {e}"
            got = mutated([draft_logits, target_logits, u], given, ["draft_logits", "target_logits", "u"]) or got
            played.append((u, got))
            if got != want and first is None:
                first = (k, u, want, got)
        if first is None:
            continue
        k, u, want, got = first
        differ = sum(got != _key(P, Q, u, gamma) for u, got in played)
        why = _explain(P, Q, Pr, Qr, gamma, played) if isinstance(got, tuple) else ""
        report.findings.append(Finding(f"round-{name}", (
            f"{differ} of {len(played)} trials differ from the reference; the first, trial {k} (gamma {gamma}, "
            f"{n_vocab} ids, warping {warping}, uniforms {u.tolist()}): expected drafts {list(want[0])}, accepted "
            f"{want[1]}, token {want[2]}; got " + (f"drafts {list(got[0])}, accepted {got[1]}, token {got[2]}"
                                                   if isinstance(got, tuple) else got) + why)))
    if statistical:
        more, report.tests = round_statistics(round_fn, n_samples=n_samples, alpha=alpha, seed=seed)
        report.findings += more
    report.ok = not report.findings
    return report


def _full(warping):
    return {"temperature": 1.0, "top_k": 0, "top_p": 1.0, **warping}


def _cases(cases, where):
    out = []
    for i, case in enumerate(cases):
        try:
            name, n_vocab, gamma, warping = case
        except (TypeError, ValueError):
            raise KitUsageError(f"{where}: cases[{i}] must be (name, n_vocab, gamma, warping), got {case!r}") from None
        n_vocab = need_int(n_vocab, f"cases[{i}]'s n_vocab", where, 2, 262_144)
        gamma = need_int(gamma, f"cases[{i}]'s gamma", where, 1, 64)
        if not isinstance(warping, dict) or set(warping) - {"temperature", "top_k", "top_p"}:
            raise KitUsageError(f"{where}: cases[{i}]'s warping must be a dict of temperature, top_k, top_p, "
                                f"got {warping!r}")
        try:
            warp(np.zeros(2), **warping)
        except (TypeError, ValueError) as e:
            raise KitUsageError(f"{where}: cases[{i}]'s warping: {e}") from None
        out.append((str(name), n_vocab, gamma, _full(warping)))
    if not out:
        raise KitUsageError(f"{where}: cases is empty: nothing would be checked; leave it None (ROUND_CASES)")
    return out


# (name, gamma, draft rows, target rows, warping): small rows that differ by position, for the chi-square tests
STATISTICAL_ROUNDS = [
    ("positions", 3,
     [[.4, .3, .1, .1, .1, 0], [.1, .5, .2, .1, .1, 0], [.2, .2, .4, .1, .05, .05], [.05, .05, .1, .2, .2, .4]],
     [[.3, .3, .2, .1, 0, .1], [.2, .4, .2, .1, .1, 0], [.1, .3, .3, .1, .1, .1], [.6, .1, .1, .1, .05, .05]], {}),
    ("positions-top-k-3", 2,
     [[.3, .25, .2, .15, .1, 0], [.1, .2, .3, .25, .15, 0], [.05, .05, .05, .05, .4, .4]],
     [[.25, .3, .2, .15, .05, .05], [.2, .3, .25, .15, .1, 0], [.5, .2, .1, .1, .05, .05]], dict(top_k=3)),
]


def round_laws(Q, P, gamma):
    """The exact laws of one round with position-only rows (Leviathan et al. 2023, Theorem 3.5 and its proof):
    `{"draft i": q_i, "accepted": P(n = k), "round": P(n = k, token = y) flattened [k * n_vocab + y],
    "kept i": min(p_i, q_i) / beta_i}` for rows P `[gamma + 1, n_vocab]`, Q `[gamma + 1, n_vocab]` (warped)."""
    beta = np.minimum(P[:gamma], Q[:gamma]).sum(axis=1)
    reach = np.concatenate([[1.0], np.cumprod(beta)])  # P(n >= k)
    accepted = np.append(reach[:gamma] * (1 - beta), reach[gamma])
    joint = [reach[k] * np.maximum(P[k] - Q[k], 0) for k in range(gamma)] + [reach[gamma] * P[gamma]]
    laws = {f"draft {i}": Q[i] for i in range(gamma)}
    laws.update({"accepted": accepted, "round": np.concatenate(joint)})
    laws.update({f"kept {i}": np.minimum(P[i], Q[i]) / beta[i] for i in range(gamma) if beta[i] > 0})
    return laws


def round_statistics(round_fn, n_samples=20000, alpha=1e-6, seed=0):
    """Chi-square tests of a round's laws (round_laws) on STATISTICAL_ROUNDS, n_samples seeded rounds each; returns
    (Findings, tests), false alarms <= alpha in all. Needs no uniform layout: it also checks a round with its own
    randomness. A `round_fn` that never returns hangs the check (npspec.testing)."""
    where = "round_statistics"
    need_callable(round_fn, "round_fn", "round_fn(draft_logits, target_logits, u, warping) -> (drafts, accepted, token)", where)
    n_samples, alpha, seed = need_samples(n_samples, where), need_alpha(alpha, where), need_int(seed, "seed", where, 0)
    n_tests = sum(2 * g + 2 for _, g, *_ in STATISTICAL_ROUNDS)
    per_test = alpha / n_tests
    findings, tests = [], []
    rng = np.random.default_rng(seed)
    for name, gamma, qrows, prows, warping in STATISTICAL_ROUNDS:
        with np.errstate(divide="ignore"):
            draft_logits, target_logits = np.log(np.array(qrows)), np.log(np.array(prows))
        Q, P = warp(draft_logits, **warping), warp(target_logits, **warping)
        n_vocab = Q.shape[1]
        laws = round_laws(Q, P, gamma)
        counts = {k: np.zeros(len(v)) for k, v in laws.items()}
        try:
            for _ in range(n_samples):
                got = _outcome(round_fn(draft_logits.copy(), target_logits.copy(), rng.random(2 * gamma + 1),
                                        _full(warping)),
                               gamma, n_vocab)
                if isinstance(got, str):
                    raise ValueError(got)
                drafts, n, token = got
                for i, d in enumerate(drafts):
                    counts[f"draft {i}"][d] += 1
                    if i < n and f"kept {i}" in counts:
                        counts[f"kept {i}"][d] += 1
                counts["accepted"][n] += 1
                counts["round"][n * n_vocab + token] += 1
        except Exception as e:
            findings.append(Finding(f"round-statistics-{name}", f"the round {type(e).__name__}: {e}"))
            continue
        for key, law in laws.items():
            stat, df, pv, impossible = chi_square(counts[key], law / law.sum())
            tests.append(dict(name=f"{name} {key}", statistic=stat, df=df, p_value=pv, threshold=per_test))
            if impossible or pv < per_test:
                findings.append(Finding(f"round-statistics-{name}", (
                    f"{key}: counts {counts[key].astype(int).tolist()} against probabilities "
                    f"{np.round(law / law.sum(), 4).tolist()}: chi-square {stat:.1f}, df {df}, p-value {pv:.3g} < "
                    f"{per_test:.3g}" + (f"; impossible cells {impossible}" if impossible else "")
                    + (" (the bonus cells are the last row of 'round': drawn from the draft?)" if key == "round" else ""))))
    return findings, tests


def npspec_round():
    """npspec's own round as a round_fn: warp both rows, sample the drafts with u[:gamma], then
    npspec.decode.rules.accept with u[gamma:2 gamma] and u[2 gamma]."""
    def round_fn(draft_logits, target_logits, u, warping):
        gamma = len(draft_logits) - 1
        Q, P = warp(draft_logits, **warping), warp(target_logits, **warping)
        drafts = [sample(Q[i], u[i]) for i in range(gamma)]
        n, token = accept(np.array(drafts, dtype=np.int64), P, Q[:gamma], u[gamma:2 * gamma], u[2 * gamma])
        return drafts, n, token

    return round_fn
