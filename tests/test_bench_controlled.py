"""Controlled acceptance (npspec.decode.drafters.controlled, which bench/controlled.py names for the bench) and the
command line's measurements around a generation (npspec.cli.harness): --compare and --simulate-acceptance."""

import io
import json
import math
import re

import numpy as np
import pytest

from bench.controlled import ControlledDraft, ControlledLookup
from npspec.cli import generate, harness
from npspec.decode import Generation, GenerationInterrupted, Stats, decode, speculative_generate
from npspec.cli.harness import comparison
from npspec.kernels.registry import plain_baselines

from conftest import run_python
from test_bench import pair


def controlled_run(target, draft, prompt, n_new, a, gamma, seed):
    greedy = speculative_generate(target, None, prompt, n_new, gamma=0, temperature=0).ids
    steered = ControlledDraft(draft, list(prompt) + greedy, a, np.random.default_rng(seed))
    gen = speculative_generate(target, steered, prompt, n_new, gamma=gamma, temperature=0)
    assert gen.ids == greedy  # the loop is unchanged: greedy output stays token-identical
    return gen.stats, steered


@pytest.mark.parametrize("gamma", [1, 4])
def test_controlled_acceptance_one_accepts_every_draft(gamma):
    target, draft = pair()
    s, steered = controlled_run(target, draft, [1, 2, 3], 30, a=1.0, gamma=gamma, seed=0)
    assert s.rejected == 0 and s.accepted == s.drafted > 0 and s.alpha == 1.0
    assert steered.correct == steered.proposals  # every steered row got the greedy token


@pytest.mark.parametrize("gamma", [1, 4])
def test_controlled_acceptance_zero_accepts_none(gamma):
    target, draft = pair()
    s, steered = controlled_run(target, draft, [1, 2, 3], 30, a=0.0, gamma=gamma, seed=0)
    # one draft tested and rejected per round, but the last: its gamma is clamped to remaining - 1 = 0
    assert s.accepted == 0 and s.rounds == 30 and s.rejected == 29 and s.drafted >= 29
    assert steered.correct == 0


def test_controlled_acceptance_steers_the_real_draft_forward():
    target, draft = pair()
    steered = ControlledDraft(draft, [1, 2, 3, 4, 5, 6], 1.0, np.random.default_rng(0))
    cache = steered.new_cache()
    logits = steered.forward(np.array([1, 2, 3]), cache)
    assert cache.length == 3  # the draft's own cache advanced: its forward really ran
    assert logits.shape == (3, draft.config.n_vocab) and logits.dtype == np.float32
    assert list(np.argmax(logits, axis=-1)) == [2, 3, 4]  # row j predicts position j + 1
    assert steered.proposals == 3
    # the prefill only fills the cache: the draft's own logits, no proposal counted
    cache = steered.new_cache()
    np.testing.assert_array_equal(steered.prefill(np.array([1, 2]), cache), draft.prefill(np.array([1, 2]),
                                                                                         draft.new_cache()))
    assert cache.length == 2 and steered.proposals == 3
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        ControlledDraft(draft, [1], 1.5, np.random.default_rng(0))


@pytest.mark.slow
@pytest.mark.parametrize("a", [0.3, 0.6, 0.9])
def test_controlled_acceptance_matches_a_within_sampling_error(a):
    """Each tested draft is accepted with probability a, independently.

    Test: the number accepted among the n tested drafts, pooled over 4 runs, against
    Binomial(n, a) with the normal approximation: |accepted - n a| <= 3.29 sqrt(n a (1 - a)),
    a two-sided false-alarm rate of 0.1% per a (0.3% for the three). Which drafts get tested
    depends only on earlier outcomes (a stopping rule), so the count is still a sum of
    independent Bernoulli(a) outcomes. Fixed seeds: the result is reproducible.
    """
    target, draft = pair(n_ctx=400)
    accepted = tested = 0
    for seed in range(4):
        s, _ = controlled_run(target, draft, [seed + 1, 7], 380, a=a, gamma=4, seed=seed)
        accepted, tested = accepted + s.accepted, tested + s.accepted + s.rejected
    assert tested > 500
    assert abs(accepted - tested * a) <= 3.29 * math.sqrt(tested * a * (1 - a)), (accepted, tested)


def test_generate_compare_prints_both_speeds_and_the_ratio():
    r = run_python("-m", "npspec.generate", "--compare", "--temperature", "0", "--max-new-tokens", "12")
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("compare: speculative") and "plain" in line and "speedup" in line
    assert line.endswith("same output")  # greedy: speculative output == plain output
    # the kernel's label may hold digits of its own ("gemm-blocks at 1 thread"): read the three numbers by place
    found = re.fullmatch(r"compare: speculative ([\d.]+) tokens/s, plain ([\d.]+) tokens/s \(fastest plain decoding: "
                         r"[^()]+\), speedup ([\d.]+)x, same output", line)
    assert found, line
    spec, plain, ratio = (float(g) for g in found.groups())
    assert abs(ratio - spec / plain) < 0.01 * ratio + 0.006  # the printed ratio is the printed speeds' ratio
    r = run_python("-m", "npspec.generate", "--compare", "--json", "--max-new-tokens", "6")
    c, stats = json.loads(r.stdout)["compare"], json.loads(r.stdout)["stats"]
    assert c["same_ids"] is None and c["speedup"] == c["speculative_tokens_per_s"] / c["plain_tokens_per_s"]
    by_kernel = c["plain_by_kernel_tokens_per_s"]
    own = next(iter(by_kernel))  # the target's own kernel first, with its thread count if the probe chose another
    assert own == stats["target_kernel"] or own == f"{stats['target_kernel']} at {stats['target_threads']} thread"
    assert set(by_kernel) == {own, *plain_baselines(stats["target_kernel"])}  # and compiled-panels, BLAS's GEMV, GEMM
    assert c["plain_tokens_per_s"] == max(by_kernel.values()) == by_kernel[c["plain_kernel"]]  # the fastest


def test_generate_compare_repeats_prints_the_median_of_runs_in_turn():
    r = run_python("-m", "npspec.generate", "--compare", "--compare-repeats", "3", "--temperature", "0",
                   "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["compare"]
    assert c["repeats"] == 3 and len(c["speedups"]) == 3 and c["same_ids"] is True
    assert c["speedup"] == sorted(c["speedups"])[1]  # the median of the three repeats' ratios
    line = r.stderr.strip().splitlines()[-1]
    assert f"speedup {c['speedup']:.2f}x (median of 3 in turn, {min(c['speedups']):.2f}x to " in line, line
    assert line.endswith("same output")


def timed(ids, tokens_per_s):  # a Generation of `ids` decoded at tokens_per_s (its stats' seconds)
    return Generation(ids, Stats(new_tokens=len(ids), seconds=len(ids) / tokens_per_s))


def test_comparison_divides_each_repeat_by_the_plain_run_beside_it():
    """Three repeats in which the machine slows by half in the second: the median of the paired ratios (2.0) is the
    speedup, not a ratio of medians over different moments; the fastest plain kernel is the one with the fastest
    median, and `same_ids` needs every speculative run to match every plain run of the target's own kernel."""
    ids = [5, 6, 7, 8]
    specs = [timed(ids, 40.0), timed(ids, 20.0), timed(ids, 44.0)]
    plain = {"own": [timed(ids, 10.0), timed(ids, 5.0), timed(ids, 11.0)],
             "other": [timed(ids, 20.0), timed(ids, 10.0), timed(ids, 20.0)]}
    c = comparison(specs, plain, greedy=True)
    assert c["plain_kernel"] == "other" and c["plain_tokens_per_s"] == 20.0
    assert c["speedups"] == [2.0, 2.0, 2.2] and c["speedup"] == 2.0 and c["repeats"] == 3
    assert c["speculative_tokens_per_s"] == 40.0 and c["plain_by_kernel_tokens_per_s"] == {"own": 10.0, "other": 20.0}
    assert c["tokens_per_s_by_repeat"] == {"speculative": [40.0, 20.0, 44.0], "own": [10.0, 5.0, 11.0],
                                           "other": [20.0, 10.0, 20.0]}
    assert c["same_ids"] is True
    other_ids = {**plain, "own": plain["own"][:2] + [timed([5, 6, 7, 9], 11.0)]}  # the last plain run differs
    assert comparison(specs, other_ids, greedy=True)["same_ids"] is False
    assert comparison(specs[:1], {k: v[:1] for k, v in plain.items()}, True)["speedup"] == 40.0 / 20.0
    assert comparison(specs, plain, greedy=False)["same_ids"] is None


@pytest.mark.parametrize("extra", [["--temperature", "0", "--simulate-acceptance", "0.5"], ["--temperature", "0.9"]])
def test_a_rerun_decodes_as_the_first_run_did(extra):
    """--compare-repeats' later speculative runs (generate.rerun) repeat the first one exactly: the same ids, rounds,
    acceptances and per-round drafts, with a steered draft too (its decisions drawn anew from the seed)."""
    args = generate.build_parser().parse_args(["--gamma", "3", "--max-new-tokens", "24", "--quiet", "--seed", "4",
                                               "--kernel-probe", "off", "--compare", *extra, "ROMEO:"])
    prep = generate.prepared(args, io.StringIO(), None)
    job, again = prep.job, prep.again
    runs = [decode(job, trace=True), decode(again(), trace=True), decode(again(), trace=True)]
    assert runs[0].stats.rounds > 1 and runs[0].stats.rejected > 0  # rounds that reject: the draws matter

    def untimed(trace):  # each round's record without its seconds
        return [{k: v for k, v in record.items() if not k.startswith("seconds")} for record in trace]

    for rerun in runs[1:]:
        assert rerun.ids == runs[0].ids and untimed(rerun.trace) == untimed(runs[0].trace)
        assert (rerun.stats.rounds, rerun.stats.accepted, rerun.stats.drafted) == \
            (runs[0].stats.rounds, runs[0].stats.accepted, runs[0].stats.drafted)


def test_compare_repeated_runs_each_speculative_decoding_after_the_targets_own_kernel(monkeypatch):
    """The order of --compare-repeats' decodings: per repeat the speculative one (the first is given), then the plain
    ones with the BLAS-threaded and compiled kernels, then with the target's own kernel, so that every speculative run
    follows a decoding on the target's own kernel."""
    args = generate.build_parser().parse_args(["--gamma", "3", "--max-new-tokens", "4", "--quiet", "--kernel-probe",
                                               "off", "--compare", "--compare-repeats", "3", "ROMEO:"])
    prep = generate.prepared(args, io.StringIO(), None)
    job, again = prep.job, prep.again
    order = []

    def fake_decode(job, on_emit=None, trace=False):
        order.append("speculative" if job.drafter is not None else job.target.kernel)
        return timed([1, 2], 10.0)

    monkeypatch.setattr(harness, "decode", fake_decode)
    specs, plain, finished = harness.compare_repeated(job, timed([1, 2], 20.0), again, 0, 1, 3)
    own, *others = (label.split(" at ")[0] for label in plain)  # the target's own kernel first in the table
    assert order == [*others, own] + ["speculative", *others, own] * 2
    assert finished and len(specs) == 3 and all(len(runs) == 3 for runs in plain.values())


@pytest.mark.parametrize("turn, step", [(0, 1), (1, 0), (2, -1), (None, None)])
def test_ctrl_c_in_compare_repeated_keeps_the_turns_that_finished(monkeypatch, turn, step):
    """Ctrl-C in turn `turn` (0-based; a turn is a speculative decoding, the first one given, then one plain decoding
    per plain model), at its decoding `step` (-1: its last), drops that turn's runs and keeps the finished turns
    whole: none when the first turn's plain runs did not all end (plain {}: nothing to compare), all three when no
    turn is stopped (turn None)."""
    args = generate.build_parser().parse_args(["--gamma", "3", "--max-new-tokens", "4", "--quiet", "--kernel-probe",
                                               "off", "--compare", "--compare-repeats", "3", "ROMEO:"])
    prep = generate.prepared(args, io.StringIO(), None)
    job, again = prep.job, prep.again
    count = len(harness.plain_models(job, 1))  # plain decodings a turn
    size = count if turn == 0 else count + 1
    start = 0 if turn in (0, None) else count + (turn - 1) * (count + 1)
    stop_at = None if turn is None else start + step % size
    calls = []

    def fake_decode(job, on_emit=None, trace=False):
        calls.append(job)
        if len(calls) - 1 == stop_at:
            raise GenerationInterrupted(timed([1], 10.0))
        return timed([1, 2], 20.0 if job.drafter is not None else 10.0)

    monkeypatch.setattr(harness, "decode", fake_decode)
    specs, plain, finished = harness.compare_repeated(job, timed([1, 2], 20.0), again, 0, 1, 3)
    turns = 3 if turn is None else turn
    assert finished == (turn is None) and len(specs) == max(turns, 1)
    assert plain == {} if turns == 0 else all(len(runs) == turns for runs in plain.values())
    assert len(calls) == (stop_at + 1 if turn is not None else count + 2 * (count + 1))


def test_ctrl_c_in_compare_reports_the_finished_turns(monkeypatch):
    """npspec generate --compare --compare-repeats 3, Ctrl-C in the second turn (its first plain decoding, the fifth
    decoding of --compare): the first turn is compared on stderr and in --json (repeats 1 of repeats_asked 3), and
    the command still ends as interrupted (exit 130)."""
    calls = []

    def fake_decode(job, on_emit=None, trace=False):
        calls.append(job)
        if len(calls) == 5:  # the second turn's first plain decoding
            raise GenerationInterrupted(timed([1], 10.0))
        return timed([1, 2], 20.0 if job.drafter is not None else 10.0)

    monkeypatch.setattr(harness, "decode", fake_decode)
    out, err = io.StringIO(), io.StringIO()
    status = generate.main(["--gamma", "3", "--max-new-tokens", "4", "--quiet", "--kernel-probe", "off", "--temperature",
                            "0", "--json", "--compare", "--compare-repeats", "3", "ROMEO:"], out=out, err=err)
    obj = json.loads(out.getvalue())  # the first turn's speculative run is the command's own (decoded for real)
    compared = obj["compare"]
    assert status == 130 and compared["repeats"] == 1 and compared["repeats_asked"] == 3
    assert compared["speedups"] == [pytest.approx(obj["stats"]["tokens_per_s"] / 10.0)], compared
    assert "Ctrl-C stopped turn 2 of 3; the line above compares the 1 finished" in err.getvalue(), err.getvalue()


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_simulated_acceptance_on_the_command_line_keeps_the_output_and_is_labelled():
    args = ["-m", "npspec.generate", "--temperature", "0", "--max-new-tokens", "40", "--json", "ROMEO:"]
    plain = json.loads(run_python(*args, "--gamma", "0").stdout)
    runs = {}
    for a in ("0", "1"):
        r = run_python(*args, "--simulate-acceptance", a, "--gamma", "4")
        assert r.returncode == 0, r.stderr
        assert "SIMULATED acceptance" in r.stderr and f"probability {a}" in r.stderr
        runs[a] = json.loads(r.stdout)
        assert runs[a]["ids"] == plain["ids"]  # a steered draft changes the speed, never the output
    assert runs["1"]["stats"]["alpha"] == 1.0 and runs["0"]["stats"]["alpha"] == 0.0
    assert runs["1"]["stats"]["rounds"] == 8  # 40 tokens, 5 a round


@pytest.mark.parametrize("a", [0.0, 1.0])
def test_controlled_lookup_proposes_gamma_steered_tokens(a):
    """a = 1: every proposal is the target's greedy token (all kept, the output is AR's); a = 0: none is."""
    target, _ = pair()
    plain = speculative_generate(target, None, [1, 2], 20, gamma=0, temperature=0)
    lookup = ControlledLookup(target.config.n_vocab, None, [1, 2] + plain.ids, a, np.random.default_rng(0))
    gen = speculative_generate(target, lookup, [1, 2], 20, gamma=3, temperature=0)
    assert gen.ids == plain.ids and gen.stats.draft_forwards == 0
    assert gen.stats.rounds_without_proposal <= 1  # only where the budget leaves one token: g = 0
    assert gen.stats.alpha == a
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        ControlledLookup(10, None, [1], -0.1, np.random.default_rng(0))
