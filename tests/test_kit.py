"""The conformance kit (npspec.testing): it passes npspec's sampler and catches each classic bug;
its enumeration cuts outputs as the loop does; its chi-square, strategies and table model."""

import inspect
import re
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings

from npspec import testing as kit
from npspec.model.gpt2 import ContextOverflowError
from npspec.decode.sampling import residual, sample, warp

from conftest import ROOT, run_python
from test_one_step import tables


# ---- level 1: rules stated as probabilities

def no_residual(p, q, x):  # BUG: on rejection, resample the target instead of the residual
    return min(1, p[x] / q[x]), list(p)


def swapped_letters(p, q, x):  # BUG: Chen et al.'s letters read with Leviathan's meaning (min(1, q/p))
    a = min(1, q[x] / p[x]) if p[x] else 0
    r = [max(0, qi - pi) for pi, qi in zip(p, q)]
    return a, ([v / sum(r) for v in r] if sum(r) else list(p))


def unguarded(p, q, x):  # BUG: divides by the residual's mass even when it is 0
    r = [max(0, pi - qi) for pi, qi in zip(p, q)]
    return min(1, p[x] / q[x]), [v / sum(r) for v in r]


def test_leviathan_rule_conforms():
    report = kit.check_rule(kit.leviathan_rule, gammas=(1, 2, 3))
    assert report.ok and report.cases == len(list(kit.small_cases())) > 300
    assert "all" in str(report)


def test_no_residual_is_caught_with_the_smallest_case():
    report = kit.check_rule(no_residual)
    # smallest in small_cases' order: every pair over {0, 1} agrees (the residual of one-hot rows is p),
    # and so does p = [1, 0], q = [1/2, 1/2]; p = [1/2, 1/2], q = [1, 0] is the first where it differs
    assert not report.ok and (report.p, report.q, report.gamma) == ([F(1, 2), F(1, 2)], [1, 0], 1)
    # the target emits each pair of ids with 1/4; the bug emits 0 first with 1/2 + 1/4 = 3/4
    assert report.expected == {(a, b): F(1, 4) for a in (0, 1) for b in (0, 1)}
    assert report.got[(0, 0)] + report.got[(0, 1)] == F(3, 4)
    text = str(report)
    assert "FAILS" in text and "(0, 0): target 1/4, rule 3/8   <-- differs" in text


def test_swapped_letters_are_caught():
    report = kit.check_rule(swapped_letters)
    assert not report.ok and report.expected != report.got


def test_unguarded_residual_is_caught_as_an_error():
    report = kit.check_rule(unguarded)
    assert not report.ok and report.error.startswith("ZeroDivisionError")
    assert (report.p, report.q) == ([1, 0], [1, 0])  # the very first case: p == q one-hot


def test_a_float_rule_is_compared_to_a_stated_tolerance():
    report = kit.check_rule(kit.npspec_rule, gammas=(1, 2, 3))  # npspec's own float64 rule, exported by the kit
    assert report.ok and report.tol == 1e-12, str(report)
    assert str(report) == (f"the rule gives the target's distribution on all {report.cases} cases (to within 1e-12 "
                           "per outcome: the rule returned floats)")
    assert kit.check_rule(kit.leviathan_rule).tol == 0  # a Fraction rule is still compared exactly

    def off_by_1e9(p, q, x):  # a float rule whose acceptance is 1e-9 too high: beyond rounding, caught
        a, r = kit.npspec_rule(p, q, x)
        return min(1.0, a + 1e-9) if a < 1 else a, r

    report = kit.check_rule(off_by_1e9)
    assert not report.ok and report.tol == 1e-12 and "<-- differs" in str(report)
    assert kit.check_rule(off_by_1e9, tol=1e-6).ok


def test_invalid_rule_output_is_reported():
    report = kit.check_rule(lambda p, q, x: (p[x] / q[x], list(p)))  # no min(1, .): a "probability" above 1
    assert not report.ok and "RuleError" in report.error and "outside [0, 1]" in report.error


def test_check_rule_takes_context_dependent_tables():
    cases = [(kit.random_table(4, seed=1), kit.random_table(4, seed=2))]
    assert kit.check_rule(kit.leviathan_rule, cases=cases, gammas=(1, 2, 3)).ok
    assert not kit.check_rule(no_residual, cases=cases).ok


def test_enumeration_sees_eos_budget_and_context():
    """The oracle itself: output lengths are cut exactly as the loop cuts them."""
    prompt = (0, 1)
    p, q = tables(4, {})
    eos = next(i for i, v in enumerate(p(prompt)) if 0 < v < 1)  # a token the target may emit first
    lengths = {len(k) for k in kit.sequence_distribution(p, prompt, 4, eos)}
    assert min(lengths) == 1 and max(lengths) == 4  # EOS can end a sequence early
    assert all(k[-1] == eos for k in kit.sequence_distribution(p, prompt, 4, eos) if len(k) < 4)
    assert {len(k) for k in kit.sequence_distribution(p, prompt, 4, None, n_ctx=len(prompt) + 2)} == {2}
    for path in kit.speculative_paths(p, q, prompt, 4, 4, eos):
        assert len(path.ids) <= 4 and (len(path.ids) == 4 or path.ids[-1] == eos)
        for rnd in path.rounds:  # an accepted EOS ends its round with no target-produced token
            assert (rnd.token is None) == (rnd.accepted > 0 and rnd.drafted[rnd.accepted - 1] == eos)


def test_truncate_matches_warp():
    """The exact truncation mirrors npspec.decode.sampling.warp (ties at the k-th value kept, top-p convention)."""
    row = [F(1, 10), F(3, 10), F(3, 10), F(2, 10), F(1, 10)]
    logits = np.log(np.array([float(v) for v in row]))
    for kw in (dict(top_k=2), dict(top_k=3), dict(top_p=F(1, 2)), dict(top_p=F(7, 10)), dict(top_k=4, top_p=F(3, 5))):
        exact = kit.truncate(row, **kw)
        assert sum(exact) == 1
        np.testing.assert_allclose(warp(logits, top_k=kw.get("top_k", 0), top_p=float(kw.get("top_p", 1))),
                                   [float(v) for v in exact], rtol=1e-12, atol=0)
    assert kit.truncate(row, top_k=2) == [0, F(1, 2), F(1, 2), 0, 0]  # the two 3/10 tie for first


# ---- level 2: black-box samplers

def argmax_proposal(logits, uniform):  # BUG: takes the argmax but reports the softmax as q
    q = warp(logits)
    uniform()
    return int(np.argmax(q)), q


def non_strict(x, p, q, uniform):  # BUG: u <= p/q accepts p(x) = 0 when u = 0
    u, u_final = uniform(), uniform()
    return (True, x) if u <= p[x] / q[x] else (False, sample(residual(p, q), u_final))


def p_on_rejection(x, p, q, uniform):  # BUG: no residual, resamples p
    u, u_final = uniform(), uniform()
    return (True, x) if u < p[x] / q[x] else (False, sample(p, u_final))


def unguarded_residual(x, p, q, uniform):  # BUG: r / r.sum() with r.sum() == 0 gives NaN
    u, u_final = uniform(), uniform()
    if u < p[x] / q[x]:
        return True, x
    r = np.maximum(p - q, 0)
    with np.errstate(invalid="ignore"):
        r = r / r.sum()
    return False, int(np.searchsorted(np.cumsum(r), u_final, side="right"))


NPSPEC_PROPOSE, NPSPEC_ACCEPT = kit.npspec_sampler()


@pytest.mark.parametrize("warp_args", [dict(), dict(temperature=0.7, top_k=3), dict(temperature=1.3, top_p=0.8),
                                       dict(temperature=0)])
def test_npspec_sampler_passes(warp_args):
    report = kit.check_sampler(*kit.npspec_sampler(**warp_args), n_samples=2000)
    assert report.ok, str(report)
    assert len(report.tests) >= 6 and all(t["p_value"] >= t["threshold"] for t in report.tests)


@pytest.mark.parametrize("propose, accept, probes", [
    (argmax_proposal, NPSPEC_ACCEPT, {"proposal-ignores-uniforms"}),
    (NPSPEC_PROPOSE, non_strict, {"strict-u0-p0", "at-ratio", "one-hot-different", "disjoint-supports-2"}),
    (NPSPEC_PROPOSE, p_on_rejection, {"residual-not-p", "at-ratio"}),
    (NPSPEC_PROPOSE, unguarded_residual, {"residual-zero-mass"}),
], ids=["argmax-proposal", "non-strict", "no-residual", "unguarded-residual"])
def test_probes_catch_each_bug(propose, accept, probes):
    report = kit.check_sampler(propose, accept, statistical=False)
    assert not report.ok
    assert probes <= {f.probe for f in report.findings}, str(report)


def topk_reporting_softmax(logits, uniform):  # BUG: samples from the top 2 but reports the full softmax as q
    return sample(warp(logits, top_k=2), uniform()), warp(logits)


def transformers_like(x, p, q, uniform):  # BUG x2: u <= p/q, and the residual divided by its mass even when 0
    u, u_final = uniform(), uniform()
    if u <= p[x] / q[x]:
        return True, x
    r = np.maximum(p - q, 0)
    with np.errstate(invalid="ignore"):
        r = r / r.sum()
    return False, sample(r, u_final)  # raises on a NaN row, as torch.multinomial does


def findings_of(report, probe):
    return [str(f) for f in report.findings if f.probe == probe]


def test_a_zero_mass_residual_is_reached_even_by_a_non_strict_test():
    report = kit.check_sampler(NPSPEC_PROPOSE, transformers_like, statistical=False)
    (found,) = findings_of(report, "residual-zero-mass-above-ratio")
    assert found.startswith("[residual-zero-mass-above-ratio] raised ValueError: cannot sample")
    assert findings_of(report, "residual-zero-mass") == []  # at u == p/q, `u <= p/q` accepts: the residual hides


def test_each_probe_message_names_what_was_wrong():
    # u == p/q: the strict test was right, the replacement was wrong; the message blames the replacement
    (at,) = findings_of(kit.check_sampler(NPSPEC_PROPOSE, p_on_rejection, statistical=False), "at-ratio")
    assert at.startswith("[at-ratio] rejected x as it should, but the replacement 0 is not one of [1]: it must be "
                         "drawn from norm(max(0, p - q)), whose support is [1] [bug class no-residual] (p = [0.25, 0.75]")
    assert "strict" not in at
    (at,) = findings_of(kit.check_sampler(NPSPEC_PROPOSE, non_strict, statistical=False), "at-ratio")
    assert at.startswith("[at-ratio] accepted x at u = 0.5, p[x]/q[x] = 0.5: u == p/q must reject (the test is "
                         "strict u < p/q)")

    def replaces_with_0(x, p, q, uniform):  # rejects correctly, then always emits id 0
        u, _ = uniform(), uniform()
        return (True, x) if u < p[x] / q[x] else (False, 0)

    report = kit.check_sampler(NPSPEC_PROPOSE, replaces_with_0, statistical=False)
    (above,) = findings_of(report, "above-ratio")
    assert above.startswith("[above-ratio] rejected x as it should, but the replacement 0 is not one of [1]")
    (zero,) = findings_of(report, "residual-zero-mass-above-ratio")
    assert "it must be drawn from p, since max(0, p - q) has no mass here" in zero


def test_a_draft_that_reports_another_q_than_it_sampled_is_probed():
    report = kit.check_sampler(topk_reporting_softmax, NPSPEC_ACCEPT, statistical=False)
    assert {f.probe for f in report.findings} == {"proposal-q-not-sampled"}
    assert str(report.findings[0]).startswith("[proposal-q-not-sampled] logits [2.0, 1.0, 0.0, -1.0]: ids [2, 3] hold "
                                              "q mass 0.1192")
    assert str(report.findings[0]).endswith("[bug class q-unwarped, shipped in transformers 47932]")
    assert kit.check_sampler(*kit.npspec_sampler(top_k=2), statistical=False).ok  # reporting its own q: passes


@pytest.mark.parametrize("propose, accept, caught", [
    (argmax_proposal, NPSPEC_ACCEPT, True),
    (NPSPEC_PROPOSE, p_on_rejection, True),
    (NPSPEC_PROPOSE, non_strict, False),  # u == p/q exactly: sampling never hits it
    (NPSPEC_PROPOSE, unguarded_residual, False),  # a zero-mass residual is a rounding accident: never sampled
], ids=["argmax-proposal", "no-residual", "non-strict", "unguarded-residual"])
def test_statistics_alone_catch_only_the_gross_bugs(propose, accept, caught):
    """Why the kit has probes: the chi-square tests see a wrong law, not a wrong boundary."""
    findings, tests = kit.statistical_check(propose, accept, n_samples=2000)
    assert bool(findings) == caught and len(tests) == 9


def test_uniforms_source():
    src = kit.Uniforms([0.0, 0.5], seed=3)
    assert [src(), src()] == [0.0, 0.5]
    rest = [src() for _ in range(3)]
    assert rest == list(np.random.default_rng(3).random(3)) and src.drawn == [0.0, 0.5] + rest


def test_chi2_sf():
    assert kit.chi2_sf(-1.0, 3) == 1.0
    assert kit.chi2_sf(5.991464547107979, 2) == pytest.approx(0.05, rel=1e-12)  # df 2: exp(-x/2)
    assert kit.chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-12)  # df 1: erfc(sqrt(x/2))
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 7, 30, 201):
        for x in (0.1, 1.0, df * 0.5, df, 2.0 * df + 10, 400.0):
            assert kit.chi2_sf(x, df) == pytest.approx(stats.chi2.sf(x, df), rel=1e-9, abs=1e-300)


def test_chi_square_pools_small_cells_and_flags_impossible_ones():
    stat, df, pv, impossible = kit.chi_square([500, 300, 200], [0.5, 0.3, 0.2])
    assert stat == 0 and df == 2 and pv == 1 and impossible == []
    # cells with expected count < 5 are pooled: 0.001 and 0.002 of 1000 join the smallest big cell
    stat, df, _, _ = kit.chi_square([497, 300, 200, 1, 2], [0.497, 0.3, 0.2, 0.001, 0.002])
    assert df == 2 and stat == pytest.approx(0.0)
    assert kit.chi_square([10, 1], [1.0, 0.0])[3] == [1]


# ---- strategies and the table model

@given(kit.probability_vectors())
def test_probability_vectors_are_distributions(p):
    assert p.dtype == np.float64 and np.all(np.isfinite(p)) and np.all(p >= 0) and abs(p.sum() - 1) <= 1e-12


@given(kit.logits_rows())
def test_logits_rows_have_a_finite_entry(row):
    assert row.dtype == np.float32 and np.isfinite(row).any() and not np.isnan(row).any()


def test_strategies_reach_the_hard_cases():
    """Each hard case is generated, not just allowed (100 derandomised examples of each strategy)."""
    seen = set()
    run = settings(max_examples=100, derandomize=True, database=None)

    @run
    @given(kit.probability_pairs())
    def pairs(pq):
        p, q = pq
        seen.add("p == q" if np.array_equal(p, q) else "p != q")
        if not np.any((p > 0) & (q > 0)):
            seen.add("disjoint supports")
        if np.maximum(p - q, 0).sum() == 0 and not np.array_equal(p, q):
            seen.add("zero-mass residual")
        if np.any((p > 0) & (p < 1e-300)):
            seen.add("near-denormal")
        if p.max() == 1.0:
            seen.add("one-hot")
        if np.any(p == 0) and p.max() < 1:
            seen.add("zeros")

    @run
    @given(kit.logits_rows())
    def rows(r):
        if np.isinf(r).any() and (np.abs(r) == 10).any():
            seen.add("-inf and +/-10")

    pairs()
    rows()
    assert seen == {"p == q", "p != q", "disjoint supports", "zero-mass residual", "near-denormal", "one-hot",
                    "zeros", "-inf and +/-10"}


def test_table_model():
    table = kit.random_table(3, seed=5)
    m = kit.TableModel.from_table(table, 3, n_ctx=4)
    cache = m.new_cache()
    logits = m.forward(np.array([0, 1]), cache)
    assert logits.shape == (2, 3) and logits.dtype == np.float32 and cache.length == 2
    np.testing.assert_allclose(warp(logits[1]), [float(v) for v in table((0, 1))], rtol=1e-6)
    cache.rollback(1)
    np.testing.assert_array_equal(m.forward(np.array([1]), cache)[0], logits[1])
    np.testing.assert_array_equal(m.prefill(np.array([0, 1]), m.new_cache()), logits)  # the loop prefills too
    assert m.source == "table" and m.tokenizer is None
    with pytest.raises(ContextOverflowError):
        m.forward(np.array([0, 0, 0]), cache)
    with pytest.raises(ValueError, match="roll the cache back"):
        cache.rollback(5)


def test_import_npspec_does_not_need_hypothesis():
    code = "import sys, npspec, npspec.testing; assert 'hypothesis' not in sys.modules, 'hypothesis imported'"
    r = run_python("-c", code)
    assert r.returncode == 0, r.stderr


def acceptance_rule(source):  # transformers' _speculative_sampling source -> "strict", "non-strict" or None
    """Which acceptance test transformers' sampler has, read from its source (independent of the kit): 5.24.0 and
    earlier test `r_i <= probability_ratio`, 5.25.0 `r_i < probability_ratio`."""
    if re.search(r"r_i\s*<=\s*probability_ratio", source):
        return "non-strict"
    if re.search(r"r_i\s*<\s*probability_ratio", source):
        return "strict"
    return None


# what the kit must find for each rule (README quotes both)
TRANSFORMERS_FINDINGS = {
    # `r_i <= p_i / q_i` accepts at u == p/q (so also p(x) = 0 at u = 0), and it divides the residual by its mass
    # when that is 0 (reached by the probe with u above p/q); nothing else is flagged
    "non-strict": {"strict-u0-p0", "at-ratio", "one-hot-different", "disjoint-supports-2", "disjoint-supports-3",
                   "residual-zero-mass-above-ratio"},
    # `r_i < p_i / q_i` rejects at u == p/q, and then divides a residual of no mass by its sum (at and above p/q)
    "strict": {"residual-zero-mass", "residual-zero-mass-above-ratio"},
}


@pytest.mark.slow  # long (>10 s): CI's second step
@pytest.mark.oracle
def test_the_kit_on_transformers_speculative_sampling():
    """examples/kit_on_transformers.py, whose output README quotes: what the kit finds in transformers' sampler,
    for the acceptance test the installed transformers has (read from its source, not from the kit)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.generation.utils import _speculative_sampling
    rule = acceptance_rule(inspect.getsource(_speculative_sampling))
    if rule is None:
        pytest.skip("this transformers' _speculative_sampling has neither `r_i <= probability_ratio` nor "
                    "`r_i < probability_ratio`: run examples/kit_on_transformers.py and add what it finds here")
    r = run_python(ROOT / "examples" / "kit_on_transformers.py")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    split = lines.index("the whole round, on GPT-2's vocabulary (kit.check_round):")
    (head, verdict, *findings), (round_verdict, *round_findings) = lines[:split], lines[split + 1:]
    assert head.startswith("transformers ") and verdict == "the sampler FAILS:", r.stdout
    assert {f.split("]")[0].strip(" [") for f in findings} == TRANSFORMERS_FINDINGS[rule], r.stdout
    if rule == "non-strict":
        # the whole round (gamma drafts, GPT-2's vocabulary, rows that differ by position): the same non-strict
        # test, found where an acceptance uniform of 0 meets a draft the target gives probability 0, and nothing
        # else (its bonus comes from p, its rows are aligned, it tests the warped q it is given)
        assert round_verdict == "the round FAILS:" and round_findings, r.stdout
        assert all("on every trial it returns what a round with non-strict-test:" in f
                   and " / " not in f.split("round with", 1)[1] for f in round_findings), r.stdout
    else:  # a round's residual never has zero mass on GPT-2's rows: nothing to find
        assert round_verdict.startswith("the round matches the reference on all") and not round_findings, r.stdout


@pytest.mark.parametrize("source, rule", [
    ("    is_accepted = r_i <= probability_ratio\n", "non-strict"),
    ("    is_accepted = r_i < probability_ratio\n", "strict"),
    ("    is_accepted = probability_ratio > r_i\n", None)])
def test_acceptance_rule_reads_the_comparison_from_the_source(source, rule):
    assert acceptance_rule(source) == rule
