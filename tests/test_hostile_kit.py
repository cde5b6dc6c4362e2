"""The kit's arguments, as a hostile user passes them: bounded sizes and one-line usage errors.

Each bad argument raises npspec.testing.usage.KitUsageError naming the argument, before any case
runs (never a finding blamed on the rule, the sampler or the drafter, never a vacuous pass); a
size the enumeration cannot hold is refused at once; a sampler that loops is stopped by the
uniform source; a round or a block verifier that returns floats fails naming them (int() used to
truncate them into a pass); a callback that never returns is the caller's to bound, as each check says, and the
README's alarm stops it. Everything here runs in well under a second per case.
"""

import math
import re
import signal
import time
from fractions import Fraction as F

import pytest

from npspec import testing as kit
from npspec.decode.rules import block_accept
from npspec.testing import __main__ as vectors_command
from npspec.testing.usage import MAX_OUTCOMES, MAX_UNIFORMS_PER_CALL, KitUsageError

from conftest import ROOT

PROPOSE, ACCEPT = kit.npspec_sampler()


def one_line(e):
    text = str(e.value)
    assert "\n" not in text and text
    return text


def always_accept(p, q, x):  # BUG: keeps every draft
    return 1, list(p)


# ---- sizes: refused up front, or stopped, with the bound named

@pytest.mark.parametrize("call, names", [
    (lambda: kit.check_rule(kit.leviathan_rule, gammas=(50,)), "gamma 50 over 2 ids"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), max_new_tokens=30), "max_new_tokens 30 over 3 ids"),
])
def test_an_enumeration_too_large_to_hold_is_refused_at_once(call, names):
    t0 = time.perf_counter()
    with pytest.raises(KitUsageError) as e:
        call()
    assert time.perf_counter() - t0 < 5  # refused before enumerating (the bound is checked first)
    text = one_line(e)
    assert names in text and str(MAX_OUTCOMES) in text and "use " in text  # ... and the largest size that fits


def test_the_largest_size_the_refusal_offers_is_accepted():
    with pytest.raises(KitUsageError, match=r"use gamma <= (\d+)") as e:
        kit.check_rule(kit.leviathan_rule, cases=[([F(1, 2)] * 2, [1, 0])], gammas=(60,))
    g = int(e.value.args[0].rsplit("<= ", 1)[1].split()[0])
    assert 2 ** (g + 1) <= MAX_OUTCOMES < 2 ** (g + 2)
    assert kit.check_rule(kit.leviathan_rule, cases=[([F(1, 2)] * 2, [1, 0])], gammas=(3,)).ok


def test_an_accept_that_never_returns_is_stopped_by_the_uniforms():
    def loops(x, p, q, uniform):  # BUG: draws uniforms forever
        while True:
            uniform()

    report = kit.check_sampler(PROPOSE, loops, statistical=False)
    assert not report.ok and all("UniformsExhausted" in f.problem for f in report.findings)
    src = kit.Uniforms(seed=0)
    with pytest.raises(kit.UniformsExhausted, match="loops"):
        for _ in range(MAX_UNIFORMS_PER_CALL + 1):
            src()
    assert len(src.drawn) == MAX_UNIFORMS_PER_CALL  # it never grows past the bound
    src.new_call()
    assert src() >= 0 and len(src.drawn) == 1


def test_the_statistical_check_bounds_each_call_too():
    calls = []

    def loops_late(x, p, q, uniform):  # correct for a while, then loops
        calls.append(1)
        if len(calls) > 50:
            while True:
                uniform()
        return ACCEPT(x, p, q, uniform)

    findings, _ = kit.statistical_check(PROPOSE, loops_late, n_samples=100)
    assert findings and "UniformsExhausted" in findings[0].problem


# ---- callbacks that never return: the caller bounds the check, as documented

CALLBACK_CHECKS = (kit.check_rule, kit.check_block_rule, kit.block_probes, kit.check_drafter, kit.probe_proposal,
                   kit.probe_acceptance, kit.statistical_check, kit.check_sampler, kit.check_round,
                   kit.round_statistics)


class CheckTimeout(BaseException):  # README's: not an Exception, which the kit would report as a finding
    pass


def hangs(*args):
    time.sleep(60)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs a Unix alarm")
@pytest.mark.parametrize("check", [lambda: kit.check_rule(hangs), lambda: kit.check_sampler(hangs, ACCEPT),
                                   lambda: kit.check_round(hangs), lambda: kit.check_drafter(hangs)],
                         ids=["rule", "sampler", "round", "drafter"])
def test_a_callback_that_never_returns_is_documented_and_the_documented_alarm_stops_it(check):
    for f in CALLBACK_CHECKS:  # each check used to hang in silence
        assert "never returns hangs the check" in " ".join(f.__doc__.split()), f.__name__
    assert "Callbacks are not time-limited" in kit.__doc__
    assert "class CheckTimeout(BaseException)" in (ROOT / "README.md").read_text(encoding="utf-8")

    def on_alarm(signum, frame):
        raise CheckTimeout()

    previous, t0 = signal.signal(signal.SIGALRM, on_alarm), time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)  # again every 0.2 s: a raise that lands in a finalizer is lost
    try:
        with pytest.raises(CheckTimeout):
            check()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.perf_counter() - t0 < 5


# ---- vacuous passes are refused

@pytest.mark.parametrize("call, names", [
    (lambda: kit.check_rule(kit.leviathan_rule, cases=[]), "cases is empty"),
    (lambda: kit.check_rule(always_accept, gammas=()), "gammas is empty"),
    (lambda: kit.check_rule(always_accept, gammas=(0,)), "gammas[0] must be an integer >= 1"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), gammas=(0,)), "gammas[0] must be an integer >= 1"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), max_new_tokens=0), "max_new_tokens must be"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), max_new_tokens=1), "max_new_tokens must be"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), targets=[]), "targets is empty"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), schedules=()), "schedules is empty"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), n_ctx_values=(3,)), "n_ctx_values[0]"),
], ids=["rule-no-cases", "rule-no-gammas", "rule-gamma-0", "drafter-gamma-0", "drafter-budget-0",
        "drafter-budget-1", "drafter-no-targets", "drafter-no-schedules", "drafter-no-room"])
def test_a_check_that_would_check_nothing_is_refused(call, names):
    with pytest.raises(KitUsageError) as e:
        call()
    assert names in one_line(e)


# ---- bad arguments are named, never blamed on the rule or sampler

@pytest.mark.parametrize("call, names", [
    (lambda: kit.check_rule(kit.leviathan_rule, gammas=(-1,)), "gammas[0] must be an integer >= 1 | got -1"),
    (lambda: kit.check_rule(kit.leviathan_rule, gammas=(1.5,)), "gammas[0] must be an integer"),
    (lambda: kit.check_rule(kit.npspec_rule, tol=-1e-12), "tol must be a number in [0, 1e-06]"),
    (lambda: kit.check_rule(always_accept, tol=10), "tol must be a number in [0, 1e-06]"),
    (lambda: kit.check_rule(kit.npspec_rule, tol=math.nan), "tol must be"),
    (lambda: kit.check_rule(kit.leviathan_rule, cases=[([F(1, 2), F(1, 3)], [F(1, 2), F(1, 2)])]),
     "cases[0]'s p is not a probability row"),
    (lambda: kit.check_rule(kit.leviathan_rule, cases=[([F(1, 2), F(1, 2)], [F(3, 2), F(-1, 2)])]),
     "cases[0]'s q is not a probability row"),
    (lambda: kit.check_rule(kit.leviathan_rule, cases=[([F(1, 2), F(1, 2)], [1, 0, 0])]), "q must have 2 entries"),
    (lambda: kit.check_rule(kit.leviathan_rule, eos=7), "eos must be an integer >= 0 and <= 1"),
    (lambda: kit.check_rule(kit.leviathan_rule, prompt=()), "prompt is empty"),
    (lambda: kit.check_sampler(PROPOSE, ACCEPT, alpha=2), "alpha must be a number in [1e-12, 0.05]"),
    (lambda: kit.check_sampler(PROPOSE, ACCEPT, alpha=0), "turn the statistical tests off"),
    (lambda: kit.check_sampler(PROPOSE, ACCEPT, alpha=math.nan), "turn the statistical tests off"),
    (lambda: kit.check_sampler(PROPOSE, ACCEPT, n_samples=2.5), "n_samples must be an integer >= 100"),
    (lambda: kit.check_sampler(PROPOSE, ACCEPT, n_samples=10 ** 12), "n_samples must be an integer"),
    (lambda: kit.check_sampler(PROPOSE, ACCEPT, seed=-1), "seed must be an integer >= 0"),
    (lambda: kit.check_sampler(PROPOSE, ACCEPT, statistical="no"), "statistical must be True or False"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), n_vocab=1), "n_vocab must be an integer >= 2"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), eos_values=(5,)), "eos_values[0]"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), schedules=("fast",)), "schedules[0] must be one of"),
    (lambda: kit.check_drafter(lambda p: kit.table_drafter(p), targets=[lambda s: [F(1, 2), F(1, 3), 0]]),
     "targets[0]'s row after the prompt is not a probability row"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_bad_argument_is_a_usage_error_naming_it(call, names):
    with pytest.raises(KitUsageError) as e:
        call()
    text = one_line(e)
    assert all(part in text for part in names.split(" | ")), text
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)  # either except clause catches it


@pytest.mark.parametrize("call, names", [
    (lambda: kit.check_sampler(3, ACCEPT), "propose must be a function propose(logits, uniform)"),
    (lambda: kit.check_sampler(PROPOSE, None), "accept must be a function accept(x, p, q, uniform)"),
    (lambda: kit.check_rule("leviathan"), "rule must be a function rule(p, q, x)"),
    (lambda: kit.check_drafter(42), "make_drafter must be a function"),
])
def test_a_non_callable_is_one_usage_error(call, names):
    with pytest.raises(KitUsageError) as e:  # one error, not a finding per probe
        call()
    assert names in one_line(e)


def test_valid_arguments_still_pass_and_a_wrong_rule_still_fails():
    assert kit.check_rule(kit.npspec_rule, tol=1e-6).ok and kit.check_rule(kit.npspec_rule, tol=0.0).ok is False
    assert not kit.check_rule(always_accept).ok
    assert kit.check_drafter(lambda p: kit.table_drafter(kit.random_table(3, seed=9)), gammas=(1,),
                             max_new_tokens=2, eos_values=(None,), schedules=("constant",)).ok



# ---- what a round or a verifier returns must be integers: never truncated into a pass

ROUND = kit.npspec_round()


@pytest.mark.parametrize("spoil, names", [
    (lambda d, n, t: (d, n + 0.5, t), r"accepted = \d+\.5: not integers"),
    (lambda d, n, t: (d, n, float(t)), r"token = \d+\.0: not integers"),
    (lambda d, n, t: ([x + 0.25 for x in d], n, t), r"drafts\[0\] = \d+\.25, drafts\[1\] = .*: not integers"),
], ids=["accepted-half", "float-token", "float-drafts"])
def test_a_round_that_returns_non_integers_fails_naming_them(spoil, names):
    report = kit.check_round(lambda *args: spoil(*ROUND(*args)), cases=kit.ROUND_CASES[:1], trials=3)
    assert not report.ok and re.search(names, str(report.findings[0])), report  # int() truncated them: a pass


def test_a_block_verifier_that_returns_non_integers_fails_naming_them():
    def half(d, p, q, u, u_final):  # the right decision, n + 0.5
        n, token = block_accept(d, p, q, u, u_final)
        return n + 0.5, token

    findings = kit.block_probes(half)
    assert findings and all("not integers" in problem and "strict" not in problem for _, problem in findings)


@pytest.mark.parametrize("call, says", [
    (lambda: kit.node_acceptance([0.5, 0.5], [0.5, 0.5], 30), "would enumerate about 1.07e+09 paths"),
    (lambda: kit.node_acceptance([math.nan, 1], [0.5, 0.5], 2), "p_row is not a probability row"),
    (lambda: kit.ot_bound([0.5, 0.5], [0.5, 0.5], -1), "k must be an integer >= 1, got -1"),
    (lambda: kit.ot_bound([0.5, 0.5], [0.5, 0.25, 0.25], 2), "q_row must have 2 entries, got 3"),
    (lambda: kit.acceptance_rate([math.nan, 1], [0.5, 0.5]), "p_row is not a probability row"),
    (lambda: kit.acceptance_rate([1, 0, 0], [0.5, 0.5]), "q_row must have 3 entries, got 2"),
    (lambda: kit.check_block_rule(kit.block_verification_rule, cases=[(1, 2)]), "cases[0] must be (p, q)"),
    (lambda: kit.check_block_rule(kit.block_verification_rule, cases=5), "cases must be a sequence of (p, q) pairs"),
    (lambda: kit.check_block_rule(kit.block_verification_rule, cases=[([0.5, 0.5],)]), "cases must be a sequence"),
    (lambda: kit.check_block_rule(kit.block_verification_rule, prompt=(99,)), "prompt id 99 is not among")])
def test_the_node_and_block_helpers_refuse_bad_arguments_in_one_line_before_any_enumeration(call, says):
    started = time.perf_counter()
    with pytest.raises(KitUsageError, match=re.escape(says)) as e:
        call()
    assert "\n" not in str(e.value) and time.perf_counter() - started < 5  # refused, not enumerated


def test_vectors_interrupted_say_so_in_one_line_and_exit_130(monkeypatch, tmp_path, capsys):
    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(vectors_command, "vectors", interrupted)
    assert vectors_command.main(["vectors", str(tmp_path / "v.json")]) == 130
    assert capsys.readouterr().err == "npspec.testing: interrupted (nothing was written)\n"
    assert list(tmp_path.iterdir()) == []
