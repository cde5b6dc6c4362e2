"""The bug zoo (npspec.testing.zoo.BUGS): every class of lossy sampler the engines shipped, planted in a sampler, a
round or a block rule written without npspec, fails the kit with a finding that names the class and the engine
issue; a correct sampler passes every check. Exact checks only (no histograms)."""

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode import SamplingParams
from npspec.decode.drafters import ModelDrafter
from npspec.decode.sampling import sample
from npspec.testing import blocks, rounds

from test_kit_rounds import draw, make_round, my_warp

SMALL = [c for c in kit.ROUND_CASES if c[0] in ("gpt2-vocab-top-k-50", "small-vocab-top-k-2")]


def tag(name):
    bug = next(b for b in kit.BUGS if b.name == name)
    return f"[bug class {name}" + (f", shipped in {bug.shipped}]" if bug.shipped else "]")


# ---- per-draft samplers (check_sampler): the one correct, the buggy ones

def propose(logits, uniform):
    q = my_warp(np.asarray(logits)[None], 1.0, 0, 1.0)[0]
    return draw(q, uniform()), q


def accept(x, p, q, uniform, u_test=None, reuse=False, placeholder=False, write=False):
    u, ur = uniform(), uniform()
    u = u if u_test is None else u_test  # BUG (constant-uniform): a hard-coded test uniform
    if u < p[x] / q[x]:
        return True, x
    r = np.maximum(p - q, 0)
    r = r / r.sum() if r.sum() > 0 else p
    if write:
        p[:] = r  # BUG (inputs-mutated): the residual written over the caller's p
    if placeholder:
        return False, -1  # BUG (placeholder-id): the -1 placeholder returned as the token
    return False, draw(r, u if reuse else ur)  # BUG (uniform-reused): the test's uniform drawn again


def argmax_propose(logits, uniform):  # BUG (argmax-draft): greedy proposal, softmax q
    q = my_warp(np.asarray(logits)[None], 1.0, 0, 1.0)[0]
    uniform()
    return int(np.argmax(q)), q


def top50_propose(logits, uniform):  # BUG (q-unwarped): sampled at top-50, reports the unwarped softmax
    top = my_warp(np.asarray(logits)[None], 1.0, min(50, len(logits)), 1.0)[0]
    return draw(top, uniform()), propose(logits, lambda: 0.0)[1]


def non_strict(x, p, q, uniform):  # BUG (non-strict-test): u <= p/q
    u, ur = uniform(), uniform()
    if u <= p[x] / q[x]:
        return True, x
    r = np.maximum(p - q, 0)
    return False, draw(r / r.sum() if r.sum() > 0 else p, ur)


def no_residual(x, p, q, uniform):  # BUG (no-residual): the correction drawn from p
    u, ur = uniform(), uniform()
    return (True, x) if u < p[x] / q[x] else (False, draw(p, ur))


SAMPLER_BUGS = {
    "uniform-reused": (propose, lambda *a: accept(*a, reuse=True)),
    "constant-uniform": (propose, lambda *a: accept(*a, u_test=0.0)),
    "non-strict-test": (propose, non_strict),
    "argmax-draft": (argmax_propose, accept),
    "q-unwarped": (top50_propose, accept),
    "placeholder-id": (propose, lambda *a: accept(*a, placeholder=True)),
    "inputs-mutated": (propose, lambda *a: accept(*a, write=True)),
    "no-residual": (propose, no_residual),
}


def test_a_correct_sampler_passes_every_probe():
    report = kit.check_sampler(propose, accept, statistical=False)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", sorted(SAMPLER_BUGS))
def test_check_sampler_names_each_class(name):
    report = kit.check_sampler(*SAMPLER_BUGS[name], statistical=False)
    assert not report.ok and any(tag(name) in f.problem for f in report.findings), str(report)


def test_a_top_50_draft_reporting_its_unwarped_q_fails_only_on_gpt2s_vocabulary():
    report = kit.check_sampler(top50_propose, accept, statistical=False)
    (found,) = report.findings
    assert "(a row of 50257 ids)" in found.problem and "outside q's" in found.problem, str(report)


# ---- whole rounds (check_round)

def reused(draft_logits, target_logits, u, warping):  # BUG (uniform-reused): draft i drawn with its test's uniform
    g = len(draft_logits) - 1
    u = np.asarray(u).copy()
    u[:g] = u[g:2 * g]
    out = make_round()(draft_logits, target_logits, u, warping)
    kept = out[1]
    if kept < g:  # the recovery drawn with the rejected draft's uniform too
        u[2 * g] = u[g + kept]
        out = make_round()(draft_logits, target_logits, u, warping)
    return out


def constant(draft_logits, target_logits, u, warping):  # BUG (constant-uniform): every test at u = 0
    g = len(draft_logits) - 1
    u = np.asarray(u).copy()
    u[g:2 * g] = 0.0
    return make_round()(draft_logits, target_logits, u, warping)


def one_sided(draft_logits, target_logits, u, warping):  # BUG (p-unwarped): top-k / top-p on the draft only
    g = len(draft_logits) - 1
    q, p = my_warp(draft_logits, **warping), my_warp(target_logits, warping["temperature"], 0, 1.0)
    drafts = [draw(q[i], u[i]) for i in range(g)]
    for i, d in enumerate(drafts):
        if not u[g + i] < p[i, d] / q[i, d]:
            r = np.maximum(p[i] - q[i], 0)
            return drafts, i, draw(r / r.sum() if r.sum() > 0 else p[i], u[2 * g])
    return drafts, g, draw(p[g], u[2 * g])


def bf16_draft(draft_logits, target_logits, u, warping):  # BUG (precision-mismatch): drawn from bf16 q
    g = len(draft_logits) - 1
    q, p = my_warp(draft_logits, **warping), my_warp(target_logits, **warping)
    drafts = [draw(rounds.bf16(q[i]), u[i]) for i in range(g)]
    for i, d in enumerate(drafts):
        if not u[g + i] < p[i, d] / q[i, d]:
            r = np.maximum(p[i] - q[i], 0)
            return drafts, i, draw(r / r.sum() if r.sum() > 0 else p[i], u[2 * g])
    return drafts, g, draw(p[g], u[2 * g])


def padded(draft_logits, target_logits, u, warping):  # BUG (placeholder-id): drafts past a rejection sent as -1
    drafts, n, token = make_round()(draft_logits, target_logits, u, warping)
    return [d if i <= n else -1 for i, d in enumerate(drafts)], n, token


def writes(draft_logits, target_logits, u, warping):  # BUG (inputs-mutated): the target's logits warped in place
    out = make_round()(draft_logits, target_logits, u, warping)
    target_logits[:] = my_warp(target_logits, **warping)
    return out


def resamples_p(draft_logits, target_logits, u, warping):  # BUG (no-residual): the correction drawn from p
    g = len(draft_logits) - 1
    q, p = my_warp(draft_logits, **warping), my_warp(target_logits, **warping)
    drafts = [draw(q[i], u[i]) for i in range(g)]
    for i, d in enumerate(drafts):
        if not u[g + i] < p[i, d] / q[i, d]:
            return drafts, i, draw(p[i], u[2 * g])
    return drafts, g, draw(p[g], u[2 * g])


ROUND_BUGS = {
    "uniform-reused": reused, "constant-uniform": constant, "non-strict-test": make_round("non-strict"),
    "p-unwarped": one_sided, "argmax-draft": make_round("argmax-draft"), "q-unwarped": make_round("q-unwarped"),
    "precision-mismatch": bf16_draft, "bonus-from-draft": make_round("bonus-from-draft"),
    "rows-off-by-one": make_round("rows-off-by-one"), "placeholder-id": padded, "inputs-mutated": writes,
    "no-residual": resamples_p,
}


@pytest.mark.parametrize("name", sorted(ROUND_BUGS))
def test_check_round_names_each_class(name):
    report = kit.check_round(ROUND_BUGS[name], cases=SMALL, trials=8)
    assert not report.ok and any(tag(name) in f.problem for f in report.findings), str(report)


def test_a_bf16_draft_is_caught_only_by_the_trials_at_cell_edges():
    report = kit.check_round(bf16_draft, cases=SMALL, trials=8)
    assert all(f"trial {k}" not in f.problem.split(";")[0] for f in report.findings for k in (0, 2, 4, 6))
    assert kit.check_round(make_round(), cases=SMALL, trials=8).ok


# ---- block rules (check_block_rule) and block verifiers (block_probes)

def test_check_block_rule_names_the_ascend_block_classes():
    for rule, name in [(kit.cumprod_rule(), "block-token-test"), (kit.cumprod_rule(q_one=True), "block-q-one")]:
        report = kit.check_block_rule(rule, gammas=(2,))
        assert not report.ok and tag(name) in str(report), str(report)
        # where q is not one-hot the two differ, and each is named alone
        apart = kit.check_block_rule(rule, cases=[([.5, .5], [.25, .75])], gammas=(2,))
        assert apart.diagnosis == f"; it gives the law of {name} {tag(name)}", str(apart)


def test_check_block_rule_fails_a_rule_writing_its_rows_or_returning_a_placeholder():
    def writes(p_rows, q_rows, d):
        p_rows[0][0] = p_rows[0][0]  # a write that changes nothing is no finding
        out = blocks.token_block_rule(p_rows, q_rows, d)
        q_rows[0].reverse()
        return out

    report = kit.check_block_rule(writes, gammas=(1,))
    assert not report.ok and report.error.startswith("InputsMutated: the rule wrote the caller's q_rows in place")
    assert tag("inputs-mutated") in report.error
    report = kit.check_block_rule(lambda p, q, d: [(1, -1, list(p[0]))], gammas=(1,))
    assert not report.ok and tag("placeholder-id") in report.error, str(report)


def test_block_probes_name_a_placeholder_token():
    def minus_one(d, p, q, u_tests, u_final):
        n, token = blocks.accept(d, p, q, u_tests, u_final)
        return n, (token if n == len(d) else -1)

    findings = blocks.block_probes(minus_one)
    assert findings and tag("placeholder-id") in findings[0][1], findings


@pytest.mark.parametrize("call, names", [
    (lambda: kit.check_block_rule(3), ["rule must be a function", "got 3"]),
    (lambda: kit.check_block_rule(kit.token_block_rule, gammas=(0,)), ["gammas", "gamma 0 drafts nothing"]),
    (lambda: kit.check_block_rule(kit.token_block_rule, prompt="ab"), ["prompt"]),
    (lambda: kit.check_block_rule(kit.token_block_rule, tol=0.1), ["tol"]),
    (lambda: kit.check_block_rule(kit.token_block_rule, cases=[]), ["cases is empty"]),
    (lambda: kit.check_block_rule(kit.token_block_rule, cases=[([.5, .6], [.5, .5])]), ["cases[0]'s p"]),
    (lambda: kit.check_block_rule(kit.token_block_rule, cases=[([.5, .5], [.5, .5])], gammas=(40,)), ["gamma 40"]),
])
def test_check_block_rule_refuses_bad_arguments_in_one_line(call, names):
    with pytest.raises(kit.KitUsageError) as e:
        call()
    assert str(e.value).startswith("check_block_rule: ") and "\n" not in str(e.value)
    assert all(n in str(e.value) for n in names), str(e.value)


# ---- the zoo itself

def test_every_class_is_caught_by_a_test_here_and_named_once():
    names = [b.name for b in kit.BUGS]
    assert len(names) == len(set(names))
    caught = set(SAMPLER_BUGS) | set(ROUND_BUGS) | {"block-token-test", "block-q-one"}
    assert caught == set(names), set(names) ^ caught
    for b in kit.BUGS:
        if "check_sampler" in b.checks:
            assert b.name in SAMPLER_BUGS, b.name
        if "check_round" in b.checks:
            assert b.name in ROUND_BUGS, b.name
    assert {name for name, *_ in kit.DIAGNOSES} >= set(ROUND_BUGS) - {"placeholder-id", "inputs-mutated"}


def test_npspecs_model_drafter_draws_from_the_q_it_reports_at_cells_edges():
    """precision-mismatch in npspec's own drafter (bench.mutants' zoo-precision-mismatch): with a uniform one ulp on
    either side of each edge of the CDF of the q it reports, its token is the one sample(q, u) draws."""
    draft = kit.TableModel.from_table(kit.random_table(5, seed=7), 5)

    def first(seq, u):
        drafter = ModelDrafter(draft)
        drafter.start(seq)
        drafter.rollback(len(seq) - 1)
        return drafter.propose(seq, 1, [u], SamplingParams())

    for seq in ([0], [1, 2], [3, 4, 0]):
        q = first(seq, 0.5).q_rows(5)[0]
        for edge in np.cumsum(q)[:-1] / q.sum():
            for u in [v for v in (np.nextafter(edge, 0), edge, np.nextafter(edge, 1)) if v < 1]:
                assert first(seq, float(u)).ids[0] == sample(q, u), (seq, q.tolist(), float(u))
