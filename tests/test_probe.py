"""How the kernel probe times and chooses (npspec.kernels.probe), with FAKED timings.

The faked `measure` never calls BLAS nor reads a clock: it returns the seconds a machine of each kind would show, so
the tests do not depend on the CPU that runs them. The store is tests/test_choices_cache.py's subject; the command's
use of the probe, tests/test_probe_command.py's.
"""

import copy
import dataclasses
import json
from types import SimpleNamespace

import pytest

from npspec.kernels import probe
from npspec.kernels.compiled import KernelUnavailable
from npspec.kernels.registry import REGISTRY
from npspec.sources.choices import machine_key

from conftest import tiny_model

NUMPY_TARGET = ("gemm-blocks", "gemv-panels")


def fake_machine(gemm_rows_cost, calls=None, one_thread=1.5):
    """A measure(name, threads, model, rows, partner=None) for a machine where a forward's GEMVs take 1 s and a
    few-row GEMM `gemm_rows_cost` s whatever its rows (gemm-blocks pays it even for one row: it pads to 2 rows);
    gemv-panels pays one GEMV per row, a little under (the panels stay in cache for the next rows). At one thread
    every forward takes `one_thread` times as long (under 1: handing products to workers costs more than they gain)."""
    def measure(name, threads, model, rows, partner=None):
        if calls is not None:
            calls.append((name, threads, model.kernel, model.threads, rows))
        seconds = gemm_rows_cost if name == "gemm-blocks" else 1.0 + 0.25 * (rows - 1)
        return seconds * (one_thread if threads == 1 else 1.0)
    return measure


def test_the_probe_picks_the_gemv_kernel_where_few_row_gemms_are_slow(tiny):
    # AMD Zen 2/3 with OpenBLAS' Haswell kernels: a 2-row GEMM costs ~3 GEMVs (issue 24)
    assert probe.choose("target", tiny, 2, mode="bypass", measure=fake_machine(3.0),
                        candidates=NUMPY_TARGET) == ("gemv-panels", 2)


def test_the_probe_picks_the_gemm_kernel_where_few_row_gemms_are_fast(tiny):
    # the Intel machine of bench/results/earlier/: a few-row GEMM costs about a GEMV
    assert probe.choose("target", tiny, 2, mode="bypass", measure=fake_machine(1.05),
                        candidates=NUMPY_TARGET) == ("gemm-blocks", 2)


def test_the_probe_picks_one_thread_where_handing_products_to_workers_costs_more_than_they_gain(tiny):
    # the Zen 5 virtual machine of bench/results/issue24/zen5/threads: one-thread forwards were the faster
    chosen = probe.choose("target", tiny, 2, mode="bypass", measure=fake_machine(3.0, one_thread=0.9),
                          candidates=NUMPY_TARGET)
    assert chosen == ("gemv-panels", 1) and (chosen.kernel, chosen.threads) == chosen
    # a tie keeps the threads asked for; one thread asked for is the only count timed
    assert probe.choose("target", tiny, 2, mode="bypass", measure=fake_machine(3.0, one_thread=1.0),
                        candidates=NUMPY_TARGET) == ("gemv-panels", 2)
    calls = []
    probe.choose("target", tiny, 1, mode="bypass", measure=fake_machine(3.0, calls), candidates=NUMPY_TARGET)
    assert {c[1] for c in calls} == {1}
    assert probe.thread_options(4) == (4, 1) and probe.thread_options(1) == (1,)


def test_the_probe_times_every_candidate_in_the_models_own_forwards_with_the_roles_rows(tiny):
    calls = []
    probe.choose("target", tiny, 3, mode="bypass", measure=fake_machine(1.0, calls), candidates=NUMPY_TARGET)
    # each candidate's forwards: the model's weights with that kernel and thread count (Model.trial), one candidate
    # at a time, in two passes, the second in the reverse order (probe.measure_all)
    one_pass = [(k, t, k, t, m) for k in NUMPY_TARGET for t in (3, 1) for m in probe.ROLE_ROWS["target"]]
    assert calls == one_pass + one_pass[::-1]
    calls.clear()
    probe.choose("draft", tiny, 1, mode="bypass", measure=fake_machine(1.0, calls), candidates=NUMPY_TARGET)
    assert [c[4] for c in calls] == [1, 1, 1, 1]  # a draft multiplies one row


def test_a_trial_shares_the_weights_and_builds_only_its_kernel(tiny):
    trial = tiny.trial("gemv-rows", 2)
    assert (trial.kernel, trial.threads, trial.prefill_rows) == ("gemv-rows", 2, 0) and trial.params is tiny.params
    assert (tiny.kernel, tiny.threads) == ("gemm-blocks", 1)  # the loaded model is left as it was
    with pytest.raises(ValueError, match="unknown kernel"):
        tiny.trial("no-such-kernel", 1)


def drifting_machine(slowdown, calls):
    """A measure where two candidates are as fast as each other, on a machine that runs `slowdown` times slower at
    each timing than at the one before (the probe's calls counted in `calls`)."""
    def measure(name, threads, model, rows, partner=None):
        calls.append(name)
        return slowdown ** len(calls)
    return measure


def test_a_machine_that_slows_while_the_probe_runs_does_not_pick_the_first_candidate():
    """Timed in one pass, a machine that slows steadily makes the first candidate look fastest; the second pass, in the
    reverse order, gives each candidate the same mean time position: a linear drift then moves every candidate's mean
    alike. Two equally fast candidates, on a machine 0.1% slower at each timing: their means over both passes
    differ by the drift's curvature only, a hundredth of the one-pass gap."""
    class Stub:  # a model whose trials build nothing
        def trial(self, kernel, threads):
            return self
    choices = [probe.Choice("a", 1), probe.Choice("b", 1)]
    calls = []
    seconds = probe.measure_all(choices, Stub(), (4,), drifting_machine(1.001, calls))
    one_pass_gap = 1.001 ** 2 - 1.001  # b timed right after a, in one pass
    assert calls == ["a", "b", "b", "a"]
    assert abs(seconds[choices[0]] - seconds[choices[1]]) < one_pass_gap / 100


def test_one_candidate_or_mode_off_measures_nothing(tiny):
    def measure(*args, **kwargs):
        raise AssertionError("measured")
    assert probe.choose("draft", tiny, 1, mode="cached", measure=measure, candidates=("gemv-panels",)) \
        == ("gemv-panels", 1)
    assert probe.choose("target", tiny, 2, mode="off", measure=measure, candidates=NUMPY_TARGET) \
        == ("gemm-blocks", 2)  # off: the first candidate at the threads asked for


def test_bad_modes_roles_and_rows_are_refused_in_one_line(tiny):
    with pytest.raises(ValueError, match="the kernel probe mode must be one of cached, refresh, bypass, off, got 'x'"):
        probe.choose("target", tiny, 1, mode="x", candidates=NUMPY_TARGET)
    with pytest.raises(ValueError, match="role must be"):
        probe.choose("verifier", tiny, 1, candidates=NUMPY_TARGET)
    for bad in [(), (0,), (2.0,), (True,), (-3,)]:
        with pytest.raises(ValueError, match="rows to time must be positive ints"):
            probe.choose("target", tiny, 1, None, "bypass", fake_machine(1.5), NUMPY_TARGET, rows=bad)
    with pytest.raises(ValueError, match="roles must be among"):
        probe.choose_kernels(tiny, None, 1, roles=("verifier",))


def test_the_real_measurement_times_forwards_with_the_clock_it_is_given():
    ticks = iter(range(100))
    model = tiny_model().with_kernel("gemv-rows", 2)
    seen = []
    forward = model.forward
    prefill = model.prefill
    model.forward = lambda ids, cache: seen.append((len(ids), cache.length)) or forward(ids, cache)
    model.prefill = lambda ids, cache, threads=None: seen.append(("prefill", len(ids), threads)) or prefill(ids, cache)
    seconds = probe.time_forwards("gemv-rows", 2, model, 2, repeats=3, clock=lambda: next(ticks))
    assert seconds == 1  # each timed forward reads the clock twice, one tick apart
    # one prefill on ONE BLAS thread (none left spinning into the timings), then one untimed and 3 timed forwards of
    # 2 rows back to back, each from the same context
    assert seen == [("prefill", probe.PROBE_CONTEXT, 1)] + [(2, probe.PROBE_CONTEXT)] * 4


def test_a_target_beside_a_draft_is_timed_in_rounds_and_keyed_by_that_draft(tiny, notes):
    """A machine where the GEMM kernel verifies faster alone, but a round with a draft on other threads costs it
    more (each kind of thread spinning on the other's cores): beside that draft the probe picks the GEMV kernel,
    and the draft it was timed with is in the cache key."""
    draft = tiny_model(seed=1).with_kernel("gemv-panels", 2)
    seen = []

    def measure(name, threads, model, rows, partner=None):
        seen.append(partner)
        alone = 1.0 if name == "gemm-blocks" else 1.2
        return alone + (0.5 if partner is not None and name == "gemm-blocks" else 0.0)
    assert probe.choose("target", tiny, 2, mode="bypass", measure=measure, candidates=NUMPY_TARGET).kernel \
        == "gemm-blocks" and seen == [None] * 8  # 4 choices, timed in two passes
    seen.clear()
    before = len(notes())
    assert probe.choose("target", tiny, 2, mode="bypass", measure=measure, candidates=NUMPY_TARGET,
                        partner=draft).kernel == "gemv-panels" and seen == [draft] * 8
    said = notes()[before:]
    assert len(said) == 2 and "timing the target's kernels gemm-blocks, gemv-panels" in said[0] \
        and "beside its draft (gemv-panels)" in said[0]
    assert said[1].startswith("the target's fastest of gemm-blocks, gemv-panels is gemv-panels at 2 thread(s); ms per") \
        and "gemm-blocks@2 1500.0, gemm-blocks@1 1500.0, gemv-panels@2 1200.0, gemv-panels@1 1200.0" in said[1]
    alone, beside = (json.loads(machine_key("target", NUMPY_TARGET, [[1, 2, 3, 4]], 2, p))["partner"]
                     for p in (None, probe.partner_key(draft)))
    assert alone is None and beside == ["gemv-panels/" + str(REGISTRY["gemv-panels"].version), 2,
                                        probe.model_shapes(draft)]


def test_a_round_runs_the_drafts_one_token_forwards_then_the_verify_all_inside_the_timed_span():
    ticks = iter(range(100))
    target, draft = tiny_model().with_kernel("gemv-rows", 2), tiny_model(seed=1).with_kernel("gemv-rows", 2)
    seen = []
    for name, model in (("target", target), ("draft", draft)):
        forward, prefill = model.forward, model.prefill
        model.forward = lambda ids, cache, f=forward, n=name: seen.append((n, len(ids), cache.length)) or f(ids, cache)
        model.prefill = lambda ids, cache, threads=None, f=prefill, n=name: (
            seen.append((n, "prefill", len(ids), threads)) or f(ids, cache))
    clock = lambda: seen.append("clock") or next(ticks)
    seconds = probe.time_forwards("gemv-rows", 2, target, 3, repeats=1, clock=clock, partner=draft)
    c = probe.PROBE_CONTEXT
    span = ["clock", ("draft", 1, c), ("draft", 1, c + 1), ("target", 3, c)]  # the untimed one: no second reading
    assert seen == [("target", "prefill", c, 1), ("draft", "prefill", c, 1)] + span + span + ["clock"] \
        and seconds == 1  # both prefills on one BLAS thread


def test_the_probe_takes_the_median_of_its_timed_forwards_not_the_best():
    """Decoding pays every forward: timed spans of 5, 1 and 3 s (after the untimed one) count as 3 s."""
    readings = iter([0, 100, 105, 105, 106, 106, 109])  # untimed start, then (start, stop) per timed forward
    model = tiny_model().with_kernel("gemv-rows")
    assert probe.time_forwards("gemv-rows", 1, model, 1, repeats=3, clock=lambda: next(readings)) == 3


def test_a_model_with_a_tiny_context_is_timed_on_what_fits():
    model = tiny_model(n_ctx=4)
    assert probe.time_forwards("gemv-rows", 1, model, 4, repeats=1) > 0  # 4 rows, no prefill
    assert probe.time_forwards("gemv-rows", 1, model, 9, repeats=1) > 0  # cut to the 4 that fit


# ---- both roles in one call, with models whose builds are counted ----

class FakeModel:
    """A Decoder that runs nothing: `builds` lists the (kernel, threads) of every Model built of it (the load, then
    with_kernel), `trials` each kernel built for the probe's timings (Model.trial: not a Model)."""

    def __init__(self, name, kernel="gemm-blocks", threads=1, prefill_rows=0, builds=None, trials=None):
        self.name, self.kernel, self.threads, self.prefill_rows = name, kernel, threads, prefill_rows
        self.config = SimpleNamespace(n_ctx=64, n_vocab=67, n_layer=2, n_embd=16, n_head=2)
        self.builds = [] if builds is None else builds
        self.trials = [] if trials is None else trials
        self.builds.append((kernel, threads))

    def trial(self, kernel, threads):
        self.trials.append((kernel, threads))
        return SimpleNamespace(name=self.name, kernel=kernel, threads=threads, config=self.config)

    def with_kernel(self, kernel, threads):
        return FakeModel(self.name, kernel, threads, 0, self.builds, self.trials)

    def with_prefill_rows(self, rows):  # the same built kernel: not a build
        other = copy.copy(self)
        other.prefill_rows = rows
        return other


def test_both_roles_are_chosen_in_one_call_and_each_model_is_built_at_most_twice():
    """The draft alone at one row, then the target at its verify rows beside the draft as chosen; each model built
    when loaded and once more with its kernel; each prefill length measured on the model as chosen. Pairs by thread
    pool: tests/test_probe_pairs.py."""
    target, draft = FakeModel("target"), FakeModel("draft", "gemv-rows")
    timed = []

    def measure(name, threads, model, rows, partner=None):
        timed.append((model.name, name, threads, rows, None if partner is None else (partner.name, partner.kernel)))
        if model.name == "draft":
            return 1.0 if name == "gemv-panels" else 2.0
        return {"gemm-blocks": 1.0, "gemv-panels": 1.2}[name] + (0.5 * (name == "gemm-blocks") if partner else 0)

    def measure_prefill(model, length, by_kernel):  # the draft's kernel wins from 8 ids, the target's at 32
        return (0.1 * length if model.name == "draft" else 0.01 * length) if by_kernel else 0.9
    chosen = probe.choose_kernels(target, draft, 2, None, "bypass", rows=(5,), measure=measure,
                                  measure_prefill=measure_prefill,
                                  candidates={"target": NUMPY_TARGET, "draft": ("gemv-panels", "gemv-rows")})
    assert chosen.draft[:3] == ("gemv-panels", 2, 8) and chosen.target[:3] == ("gemv-panels", 2, 32)
    assert (chosen.draft.model.kernel, chosen.draft.model.prefill_rows) == ("gemv-panels", 8)
    assert (chosen.target.model.kernel, chosen.target.model.threads, chosen.target.model.prefill_rows) \
        == ("gemv-panels", 2, 32)
    assert target.builds == [("gemm-blocks", 1), ("gemv-panels", 2)]  # loaded, then with its kernel
    assert draft.builds == [("gemv-rows", 1), ("gemv-panels", 2)]
    assert len(target.trials) == 8  # 2 kernels x 2 thread counts x 2 passes, never a Model
    # the draft timed only on its target's threads (npspec's workers: gemv-rows runs on BLAS's), then built once
    # more as the target's partner, only when a timing first runs it (probe.Beside)
    assert draft.trials == [("gemv-panels", 2), ("gemv-panels", 1), ("gemv-panels", 1), ("gemv-panels", 2)] \
        + [("gemv-panels", 2)]
    assert {t[3] for t in timed if t[0] == "draft"} == {1} and {t[3] for t in timed if t[0] == "target"} == {5}
    assert {t[4] for t in timed if t[0] == "target"} == {("draft", "gemv-panels")}  # beside the chosen draft
    assert timed.index(next(t for t in timed if t[0] == "target")) == 4  # the draft chosen first


def test_a_role_already_decoding_with_its_choice_is_not_built_again_and_a_given_one_is_kept():
    target, draft = FakeModel("target", "gemv-panels", 2), FakeModel("draft", "gemv-rows", 3)
    seen = []

    def measure(name, threads, model, rows, partner=None):
        seen.append(partner.kernel if partner is not None else None)
        return 1.0 if (name, threads) == ("gemv-panels", 2) else 2.0
    chosen = probe.choose_kernels(target, draft, 2, None, "bypass", roles=("target",), measure=measure,
                                  measure_prefill=lambda model, n, by_kernel: 1.0,
                                  candidates={"target": NUMPY_TARGET})
    assert target.builds == [("gemv-panels", 2)] and chosen.target.model.kernel == "gemv-panels"
    assert chosen.draft == ("gemv-rows", 3, 0, draft) and draft.builds == [("gemv-rows", 3)] and not draft.trials
    assert set(seen) == {"gemv-rows"}  # the given draft is still the target's partner
    assert probe.choose_kernels(None, None, 2) == (None, None)


def test_a_candidate_that_cannot_be_built_is_dropped_once_before_any_timing(monkeypatch, notes):
    tries = []

    def broken(threads, note=None):
        tries.append(threads)
        raise KernelUnavailable("kernel gemv-rows needs something missing")
    monkeypatch.setitem(REGISTRY, "gemv-rows", dataclasses.replace(REGISTRY["gemv-rows"], make=broken))
    calls = []
    target = FakeModel("target")
    chosen = probe.choose_kernels(target, None, 2, None, "bypass", measure=fake_machine(3.0, calls),
                                  measure_prefill=lambda model, n, by_kernel: 1.0,
                                  candidates={"target": ("gemv-rows", *NUMPY_TARGET)})
    assert tries == [1] and chosen.target.kernel == "gemv-panels" and "gemv-rows" not in {c[0] for c in calls}
    assert notes()[:1] == ["kernel gemv-rows needs something missing; the probe goes on without it"]
    tries.clear()
    off = probe.choose_kernels(None, FakeModel("draft"), 2, None, "off", candidates={"draft": ("gemv-rows", "gemm")})
    assert tries == [1] and off.draft[:3] == ("gemm", 2, 0)
    assert notes()[-1] == "kernel gemv-rows needs something missing; the draft decodes with one of gemm"
    with pytest.raises(KernelUnavailable, match="none of the draft's kernels gemv-rows can be built here"):
        probe.choose_kernels(None, FakeModel("draft"), 2, None, "off", candidates={"draft": ("gemv-rows",)})


# ---- how long a prompt the chosen kernel prefills (prefill_crossover, time_prefill), with faked timings ----

def fake_prefills(kernel_per_id, gemm_start, calls=None):
    """A measure(model, length, by_kernel) for a machine where a decoding starts in 0.1 s + kernel_per_id s per
    prompt id by the kernel, and in gemm_start + 0.001 s per id by the GEMM (its threads' spin included)."""
    def measure(model, length, by_kernel):
        if calls is not None:
            calls.append((length, by_kernel))
        return 0.1 + kernel_per_id * length if by_kernel else gemm_start + 0.001 * length
    return measure


@pytest.mark.parametrize("kernel_per_id, gemm_start, n_ctx, rows, timed", [
    (0.001, 0.3, 128, 32, [32]),         # the kernel wins at the longest length: nothing shorter is timed
    (0.01, 0.2, 128, 8, [32, 8]),        # a GEMM faster at 32 ids (0.42 s against 0.232), slower at 8
    (0.01, 0.05, 128, 0, [32, 8, 2]),    # a BLAS whose GEMM starts a decoding faster at every length
    (0.001, 0.3, 10, 8, [8]),            # a context of 10: only the lengths under it
])
def test_the_prefill_probe_keeps_the_longest_prompt_the_kernel_starts_faster_than_the_gemm(kernel_per_id, gemm_start,
                                                                                        n_ctx, rows, timed):
    calls = []
    model = tiny_model(n_ctx=n_ctx)
    found, seconds = probe.prefill_crossover(model, probe.PREFILL_LENGTHS, fake_prefills(kernel_per_id, gemm_start,
                                                                                         calls))
    assert found == rows and calls == [(n, by_kernel) for n in timed for by_kernel in (True, False)]
    assert seconds == {n: [0.1 + kernel_per_id * n, gemm_start + 0.001 * n] for n in timed}


class PrefillRecorder:
    """A Model's stand-in for time_prefill: records each prefill's length and route, each forward, each cache."""

    def __init__(self, seen, n_ctx=32, prefill_rows=0):
        self.seen, self.prefill_rows = seen, prefill_rows
        self.config = dataclasses.make_dataclass("Config", ["n_ctx", "n_vocab"])(n_ctx, 67)

    def with_prefill_rows(self, n):
        return PrefillRecorder(self.seen, self.config.n_ctx, n)

    def new_cache(self):
        self.seen.append("cache")

    def prefill(self, ids, cache):
        self.seen.append(("prefill", len(ids), "kernel" if len(ids) <= self.prefill_rows else "gemm"))

    def forward(self, ids, cache):
        self.seen.append(("forward", len(ids)))


def test_a_timed_prefill_starts_a_decoding_after_a_pause_and_counts_the_forwards_after_it():
    """Each timing: a pause (the last one's BLAS threads fall asleep), a fresh cache, the clock, the prefill by the
    route asked for, PREFILL_AFTER one-token forwards (where spinning threads cost), the clock; the median counts."""
    seen = []
    readings = iter([0, 5, 10, 11, 20, 23])  # spans of 5, 1 and 3 s: the median is 3
    clock = lambda: seen.append("clock") or next(readings)
    sleep = lambda s: seen.append(("sleep", s))
    for by_kernel, route in ((True, "kernel"), (False, "gemm")):
        seen.clear()
        readings = iter([0, 5, 10, 11, 20, 23])
        assert probe.time_prefill(PrefillRecorder(seen), 4, by_kernel, repeats=3, clock=clock, sleep=sleep) == 3
        one = [("sleep", probe.PAUSE), "cache", "clock", ("prefill", 4, route)] + \
            [("forward", 1)] * probe.PREFILL_AFTER + ["clock"]
        assert seen == one * 3
    seen.clear()
    readings = iter([0, 1])
    probe.time_prefill(PrefillRecorder(seen, n_ctx=5), 4, True, repeats=1, clock=clock, sleep=sleep)
    assert seen.count(("forward", 1)) == 1  # the forwards after it cut to the context
