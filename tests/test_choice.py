"""How a role's kernel is chosen (npspec.sources.choices): by measurement, with FAKED timings here, cached per machine.

The faked `measure` never calls BLAS nor reads a clock: it returns the seconds a machine of each kind would show,
so the tests do not depend on the CPU that runs them. The command-line test times the shipped pair for real, and
checks only when and where the choice is stored, never which kernel wins.
"""

import dataclasses
import io
import json
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from npspec.sources import choices as choice
from npspec.sources.atomic import locked
from npspec.decode import Options, SamplingParams, prepare
from npspec.decode.drafters import ModelDrafter, TreeDrafter
from npspec.cli.generate import main
from npspec.cli.kernel_choice import verify_rows
from npspec.cli.harness import plain_label
from npspec.kernels.registry import REGISTRY
from npspec.sources import load

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
    assert choice.choose("target", tiny, 2, mode="bypass", measure=fake_machine(3.0),
                         candidates=NUMPY_TARGET) == ("gemv-panels", 2)


def test_the_probe_picks_the_gemm_kernel_where_few_row_gemms_are_fast(tiny):
    # the Intel machine of bench/results/earlier/: a few-row GEMM costs about a GEMV
    assert choice.choose("target", tiny, 2, mode="bypass", measure=fake_machine(1.05),
                         candidates=NUMPY_TARGET) == ("gemm-blocks", 2)


def test_the_probe_picks_one_thread_where_handing_products_to_workers_costs_more_than_they_gain(tiny):
    # the Zen 5 virtual machine of bench/results/issue24/zen5/threads: one-thread forwards were the faster
    chosen = choice.choose("target", tiny, 2, mode="bypass", measure=fake_machine(3.0, one_thread=0.9),
                           candidates=NUMPY_TARGET)
    assert chosen == ("gemv-panels", 1) and (chosen.kernel, chosen.threads) == chosen
    # a tie keeps the threads asked for; one thread asked for is the only count timed
    assert choice.choose("target", tiny, 2, mode="bypass", measure=fake_machine(3.0, one_thread=1.0),
                         candidates=NUMPY_TARGET) == ("gemv-panels", 2)
    calls = []
    choice.choose("target", tiny, 1, mode="bypass", measure=fake_machine(3.0, calls), candidates=NUMPY_TARGET)
    assert {c[1] for c in calls} == {1}
    assert choice.thread_options(4) == (4, 1) and choice.thread_options(1) == (1,)


def test_the_probe_times_every_candidate_in_the_models_own_forwards_with_the_roles_rows(tiny):
    calls = []
    choice.choose("target", tiny, 3, mode="bypass", measure=fake_machine(1.0, calls), candidates=NUMPY_TARGET)
    # each candidate's forwards: the model itself with that kernel and thread count, one candidate at a time, in two
    # passes, the second in the reverse order (choice.measure_all)
    one_pass = [(k, t, k, t, m) for k in NUMPY_TARGET for t in (3, 1) for m in choice.ROLE_ROWS["target"]]
    assert calls == one_pass + one_pass[::-1]
    calls.clear()
    choice.choose("draft", tiny, 1, mode="bypass", measure=fake_machine(1.0, calls), candidates=NUMPY_TARGET)
    assert [c[4] for c in calls] == [1, 1, 1, 1]  # a draft multiplies one row


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
    class Stub:  # a model whose with_kernel builds nothing
        def with_kernel(self, kernel, threads, note=None):
            return self
    choices = [choice.Choice("a", 1), choice.Choice("b", 1)]
    calls = []
    seconds = choice.measure_all(choices, Stub(), (4,), drifting_machine(1.001, calls))
    one_pass_gap = 1.001 ** 2 - 1.001  # b timed right after a, in one pass
    assert calls == ["a", "b", "b", "a"]
    assert abs(seconds[choices[0]] - seconds[choices[1]]) < one_pass_gap / 100


def test_the_probe_times_the_rows_it_is_told_and_caches_each_row_count_apart(tiny, tmp_path):
    # gemm-blocks pays one few-row GEMM (1.5 s) whatever the rows, gemv-panels 1 s plus 0.25 s a row: the cheaper
    # kernel changes between a 2-row verify (gamma 1) and a 5-row one (gamma 4)
    path, calls = tmp_path / choice.CACHE_FILE, []
    machine = fake_machine(1.5, calls)
    assert choice.choose("target", tiny, 1, path, "cached", machine, NUMPY_TARGET, rows=(2,)) == ("gemv-panels", 1)
    assert {c[4] for c in calls} == {2}
    calls.clear()
    assert choice.choose("target", tiny, 1, path, "cached", machine, NUMPY_TARGET, rows=(5,)) == ("gemm-blocks", 1)
    assert {c[4] for c in calls} == {5}  # not the 2-row record: measured at its own rows
    records = json.loads(path.read_text())
    assert sorted(r["rows"] for r in records.values()) == [[2], [5]]
    calls.clear()
    assert choice.choose("target", tiny, 1, path, "cached", machine, NUMPY_TARGET, rows=(2,)) == ("gemv-panels", 1)
    assert calls == []  # each row count's record is found again
    for bad in [(), (0,), (2.0,), (True,), (-3,)]:
        with pytest.raises(ValueError, match="rows to time must be positive ints"):
            choice.choose("target", tiny, 1, path, "cached", machine, NUMPY_TARGET, rows=bad)


def test_the_target_is_probed_at_its_own_verify_rows(tiny):
    # npspec generate times the target at the rows its rounds multiply: gamma + 1 for a chain, every node and the root
    # for a tree, one for plain decoding; a gamma clamped by max_new_tokens is the clamped one's
    def job(drafter, gamma, new=20):
        return prepare(tiny, drafter, [1, 2, 3], Options(new, gamma, SamplingParams(0.0)))
    assert [verify_rows(job(ModelDrafter(tiny), g)) for g in (1, 3, 6)] == [2, 4, 7]
    assert verify_rows(job(ModelDrafter(tiny), 6, new=3)) == 3  # gamma clamped to max_new_tokens - 1 = 2
    assert verify_rows(job(None, 4)) == verify_rows(job(ModelDrafter(tiny), 0)) == 1
    assert verify_rows(job(TreeDrafter(tiny, (3, 2), "top-k"), 4)) == 1 + 3 + 3 * 2  # the tree's depth, not gamma's
    assert verify_rows(job(TreeDrafter(tiny, (3, 2), "top-k"), 1)) == 1 + 3  # cut at gamma's depth


def test_one_candidate_or_mode_off_measures_nothing(tiny):
    def measure(*args, **kwargs):
        raise AssertionError("measured")
    assert choice.choose("draft", tiny, 1, mode="cached", measure=measure, candidates=("gemv-panels",)) \
        == ("gemv-panels", 1)
    assert choice.choose("target", tiny, 2, mode="off", measure=measure, candidates=NUMPY_TARGET) \
        == ("gemm-blocks", 2)  # off: the first candidate at the threads asked for


def test_the_choice_is_cached_per_machine_and_refreshed_or_bypassed_on_demand(tiny, tmp_path):
    path, calls = tmp_path / "c" / choice.CACHE_FILE, []
    slow_gemm, fast_gemm = fake_machine(3.0, calls), fake_machine(1.05, calls)
    assert choice.choose("target", tiny, 2, path, "cached", slow_gemm, NUMPY_TARGET) == ("gemv-panels", 2)
    n = len(calls)
    assert n and path.is_file()
    # cached: the stored choice, nothing measured (even if the machine would now answer otherwise)
    assert choice.choose("target", tiny, 2, path, "cached", fast_gemm, NUMPY_TARGET) == ("gemv-panels", 2)
    assert len(calls) == n
    # bypass: measured, the cache neither read nor written
    assert choice.choose("target", tiny, 2, path, "bypass", fast_gemm, NUMPY_TARGET) == ("gemm-blocks", 2)
    assert len(calls) == 2 * n and choice.choose("target", tiny, 2, path, "cached", fast_gemm,
                                                 NUMPY_TARGET) == ("gemv-panels", 2)
    # refresh: measured again and stored, a one-thread choice with its thread count
    one = fake_machine(1.05, calls, one_thread=0.5)
    assert choice.choose("target", tiny, 2, path, "refresh", one, NUMPY_TARGET) == ("gemm-blocks", 1)
    assert choice.choose("target", tiny, 2, path, "cached", slow_gemm, NUMPY_TARGET) == ("gemm-blocks", 1)
    # another thread count, shape or role is another key
    assert choice.choose("target", tiny, 1, path, "cached", slow_gemm, NUMPY_TARGET) == ("gemv-panels", 1)
    records = json.loads(path.read_text())
    assert len(records) == 2 and all(r["kernel"] in NUMPY_TARGET and r["rows"] == list(choice.ROLE_ROWS["target"])
                                     for r in records.values())
    timed = [r for r in records.values() if r["threads"] == 1 and len(r["seconds"]) == 4][0]["seconds"]
    assert {(t["kernel"], t["threads"]) for t in timed} == {(k, n) for k in NUMPY_TARGET for n in (2, 1)}


def test_a_record_of_an_older_npspec_without_its_threads_is_measured_again(tiny, tmp_path):
    path, calls = tmp_path / choice.CACHE_FILE, []
    assert choice.choose("target", tiny, 2, path, "cached", fake_machine(3.0, calls), NUMPY_TARGET)
    key, = json.loads(path.read_text())
    choice.store_choice(path, key, {"kernel": "gemm-blocks", "rows": [4], "seconds": {}})  # the format before
    calls.clear()
    assert choice.choose("target", tiny, 2, path, "cached", fake_machine(3.0, calls), NUMPY_TARGET) == ("gemv-panels", 2)
    assert calls and json.loads(path.read_text())[key]["threads"] == 2


def test_the_key_names_the_cpu_the_blas_numpy_the_shapes_and_the_threads():
    key = json.loads(choice.machine_key("target", NUMPY_TARGET, [(16, 48)], 2))
    assert key["cpu"] == choice.cpu_model() and key["numpy"] == np.__version__ and key["blas"] == choice.blas_key()
    assert (key["role"], key["shapes"], key["threads"]) == ("target", [[16, 48]], 2)
    assert key["candidates"] == [f"{name}/{REGISTRY[name].version}" for name in NUMPY_TARGET]
    assert key["probe"] == choice.PROBE_VERSION  # timings taken another way are measured again


def test_the_key_names_numpys_own_blas_not_those_other_libraries_load_in_any_order(tmp_path):
    """numba imports scipy, whose wheel loads a second OpenBLAS: the key names numpy's (its package or numpy.libs)
    whichever order threadpoolctl lists them in; a numpy linked to a BLAS outside its files keys every BLAS, sorted."""
    numpy_dir = tmp_path / "site-packages" / "numpy"
    ours = {"user_api": "blas", "internal_api": "openblas", "version": "0.3.31", "architecture": "SkylakeX",
            "filepath": str(numpy_dir.with_name("numpy.libs") / "libscipy_openblas64_.so")}
    scipys = {**ours, "version": "0.3.30", "filepath": str(tmp_path / "site-packages" / "scipy.libs" / "libopenblas.so")}
    gomp = {"user_api": "openmp", "internal_api": "openmp", "version": None, "filepath": "/usr/lib/libgomp.so"}
    for info in ([ours, scipys, gomp], [gomp, scipys, ours]):
        assert choice.blas_key(info, numpy_dir) == [["openblas", "0.3.31", "SkylakeX"]]
    mkl = {"user_api": "blas", "internal_api": "mkl", "version": "2024", "architecture": None, "filepath": "/opt/mkl.so"}
    assert choice.blas_key([scipys, mkl], numpy_dir) == choice.blas_key([mkl, scipys], numpy_dir) \
        == sorted([["openblas", "0.3.30", "SkylakeX"], ["mkl", "2024", None]], key=str)


def test_a_new_way_of_timing_keys_the_choices_apart(monkeypatch):
    before = choice.machine_key("target", NUMPY_TARGET, [(16, 48)], 2)
    monkeypatch.setattr(choice, "PROBE_VERSION", choice.PROBE_VERSION + 1)
    assert choice.machine_key("target", NUMPY_TARGET, [(16, 48)], 2) != before


def test_the_key_names_each_kernels_code_version(monkeypatch):
    """A kernel whose code changed its speed (registry.Kernel.version raised) is keyed apart: its old timings are not used."""
    key = json.loads(choice.machine_key("draft", ("compiled-panels", "gemv-panels"), [(16, 48)], 2))
    assert key["candidates"] == [f"compiled-panels/{REGISTRY['compiled-panels'].version}",
                                 f"gemv-panels/{REGISTRY['gemv-panels'].version}"]
    monkeypatch.setitem(REGISTRY, "gemv-panels", dataclasses.replace(REGISTRY["gemv-panels"], version=3))
    assert json.loads(choice.machine_key("draft", ("gemv-panels",), [(16, 48)], 2))["candidates"] == ["gemv-panels/3"]


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: {family}
model\t\t: {model}
model name\t: AMD EPYC
flags\t\t: fpu avx2

processor\t: 1
cpu family\t: 99
model name\t: another
"""


def test_the_cpu_is_named_with_its_family_and_model_so_that_two_zen_generations_differ(tmp_path):
    names = []
    for family, model in ((23, 49), (25, 1), (26, 2)):  # Zen 2, Zen 3, Zen 5: all "AMD EPYC" in a virtual machine
        path = tmp_path / f"cpuinfo-{family}"
        path.write_text(CPUINFO.format(family=family, model=model))
        names.append(choice.cpu_model(path))
    assert names == ["AMD EPYC (family 23, model 49)", "AMD EPYC (family 25, model 1)", "AMD EPYC (family 26, model 2)"]
    bare = tmp_path / "bare"
    bare.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert choice.cpu_model(bare) == "Some CPU"  # no numbers: the name alone
    assert choice.cpu_model(tmp_path / "missing")  # no /proc/cpuinfo: platform's name, never an error


def test_a_damaged_or_unwritable_cache_is_measured_again(tiny, tmp_path):
    path = tmp_path / choice.CACHE_FILE
    path.write_text("{not json")
    assert choice.choose("target", tiny, 2, path, "cached", fake_machine(3.0), NUMPY_TARGET) == ("gemv-panels", 2)
    assert json.loads(path.read_text())  # rewritten whole
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert choice.store_choice(blocked / choice.CACHE_FILE, "k", {"kernel": "gemm"}) is False  # no directory there


def test_a_choice_that_cannot_be_stored_says_why_and_the_fix(tiny, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    notes = []
    assert choice.choose("target", tiny, 2, blocked / choice.CACHE_FILE, "cached", fake_machine(3.0), NUMPY_TARGET,
                         note=notes.append) == ("gemv-panels", 2)
    assert notes[0].startswith("timing the target's kernels") and len(notes) == 2
    assert notes[1].startswith(f"the kernel choice was not stored in {blocked / choice.CACHE_FILE} (")
    assert "measured again next run" in notes[1] and "--kernel-probe bypass" in notes[1]
    taken = tmp_path / "taken" / choice.CACHE_FILE
    taken.mkdir(parents=True)  # a directory where the file goes: named, with a fix that fits a cache
    notes.clear()
    assert choice.store_choice(taken, "k", {"kernel": "gemm", "threads": 1}, notes.append) is False
    assert notes == [f"the kernel choice was not stored: {taken} is a directory, not a regular file; it is measured "
                     "again next run; move that away, set NPSPEC_CACHE to another directory, or pass --kernel-probe "
                     "bypass"]


def test_a_held_lock_is_announced_before_the_wait_and_skipped_after_it(tmp_path, monkeypatch):
    monkeypatch.setattr(choice, "LOCK_SECONDS", 0.2)
    path, notes = tmp_path / choice.CACHE_FILE, []
    lock = tmp_path / ".locks" / f"{choice.CACHE_FILE}.lock"
    lock.parent.mkdir()
    with locked(lock) as held:
        assert held
        assert choice.store_choice(path, "k", {"kernel": "gemm", "threads": 1}, notes.append) is False
    assert len(notes) == 2 and notes[0].startswith("another process is writing the kernel choices: waiting for it")
    assert str(lock) in notes[0]
    assert notes[1].startswith("the kernel choice was not stored: another process still holds")
    assert not path.exists()
    notes.clear()
    assert choice.store_choice(path, "k", {"kernel": "gemm", "threads": 1}, notes.append)
    assert notes == []  # the lock free: silent


@pytest.mark.parametrize("record", [5, "gemv-panels", [1], None, {"kernel": "gemv-panels"},
                                    {"kernel": "gemv-panels", "threads": True}, {"kernel": "gemv-panels", "threads": 1.0},
                                    {"kernel": ["gemv-panels"], "threads": 1}, {"kernel": "no-such-kernel", "threads": 1}])
def test_a_malformed_cached_record_is_measured_again(tiny, tmp_path, record):
    """A hand-edited record (not an object, threads a bool or a float, an unknown kernel) is a miss, not a crash or a
    `threads=True` handed to the kernel: measured and replaced."""
    path = tmp_path / choice.CACHE_FILE
    key = choice.machine_key("target", NUMPY_TARGET, [choice.model_shapes(tiny)], 2)
    path.write_text(json.dumps({key: record}))
    assert choice.choose("target", tiny, 2, path, "cached", fake_machine(3.0), NUMPY_TARGET) == ("gemv-panels", 2)
    stored = json.loads(path.read_text())[key]
    assert (stored["kernel"], type(stored["threads"])) == ("gemv-panels", int)


def test_a_cache_file_that_is_no_regular_small_json_object_reads_as_empty(tmp_path):
    """A FIFO (a read would block), a device (a read might never end), a file over MAX_CACHE_BYTES, JSON nested past
    the parser's recursion limit, a symlink: each reads as no cache, and a store skips what is not a regular file."""
    fifo, deep, big, link = (tmp_path / name for name in ("fifo", "deep", "big", "link"))
    os.mkfifo(fifo)
    deep.write_text("[" * 100_000)
    big.write_text(json.dumps({"k": "x" * choice.MAX_CACHE_BYTES}))
    good = tmp_path / "good"
    good.write_text(json.dumps({"k": {"kernel": "gemm", "threads": 1}}))
    link.symlink_to(good)
    for path in (fifo, Path("/dev/zero"), deep, big, link, tmp_path / "missing"):
        assert choice.read_choices(path) == {}
    assert choice.read_choices(good) == {"k": {"kernel": "gemm", "threads": 1}}
    assert choice.store_choice(fifo, "k", {"kernel": "gemm", "threads": 1}) is False and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert choice.store_choice(link, "k", {}) is False and link.is_symlink() and good.read_text().startswith('{"k"')


def test_a_stored_cache_gets_an_ordinary_files_mode(tmp_path):
    """Not mkstemp's 0600: a cache directory shared by a group stays readable by it."""
    path = tmp_path / choice.CACHE_FILE
    assert choice.store_choice(path, "k", {"kernel": "gemm", "threads": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_concurrent_stores_keep_every_record(tmp_path):
    path = tmp_path / choice.CACHE_FILE
    threads = [threading.Thread(target=choice.store_choice, args=(path, f"k{i}", {"kernel": "gemm"})) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(json.loads(path.read_text())) == [f"k{i}" for i in range(8)]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_probe_waits_for_another_ones_and_uses_what_it_stored(tiny, tmp_path, monkeypatch):
    # two processes probing at once would time each other's forwards: the second waits, then finds the first's record
    path, notes, calls, result = tmp_path / choice.CACHE_FILE, [], [], []
    lock = tmp_path / ".locks" / "probe.lock"
    lock.parent.mkdir()
    key = choice.machine_key("target", NUMPY_TARGET, [choice.model_shapes(tiny)], 2, None, (4,))
    with locked(lock):
        waiting = threading.Thread(target=lambda: result.append(choice.choose(
            "target", tiny, 2, path, "cached", fake_machine(3.0, calls), NUMPY_TARGET, note=notes.append)))
        waiting.start()
        for _ in range(500):
            if notes:
                break
            threading.Event().wait(0.01)
        assert len(notes) == 1 and notes[0].startswith("another npspec is timing kernels on this machine: waiting")
        assert choice.store_choice(path, key, {"kernel": "gemm-blocks", "threads": 1})  # the other probe's result
    waiting.join(10)
    assert result == [("gemm-blocks", 1)] and calls == []  # its record, nothing timed
    # a probe still held past PROBE_LOCK_SECONDS: timed anyway, and said so
    monkeypatch.setattr(choice, "PROBE_LOCK_SECONDS", 0.1)
    notes.clear()
    with locked(lock):
        assert choice.choose("target", tiny, 2, path, "refresh", fake_machine(3.0, calls), NUMPY_TARGET,
                             note=notes.append) == ("gemv-panels", 2)
    assert calls and "is still held after 0.1 s: timing anyway" in notes[1]


def test_a_store_deletes_what_a_killed_store_left_and_nothing_else(tmp_path):
    # SIGKILL runs no handler: atomic_write's temporary file stays until the next store, under the same lock, deletes it
    path = tmp_path / choice.CACHE_FILE
    left = tmp_path / f".{choice.CACHE_FILE}.k3x_9a2q.tmp"
    left.write_text('{"half')
    others = [tmp_path / name for name in (".other.json.abcdefgh.tmp", f"{choice.CACHE_FILE}.bak",
                                           f".{choice.CACHE_FILE}.d.tmp2", f".{choice.CACHE_FILE}.backup.tmp")]
    for other in others:
        other.write_text("keep")
    assert choice.store_choice(path, "k", {"kernel": "gemm", "threads": 1})
    assert not left.exists() and all(o.read_text() == "keep" for o in others)
    assert json.loads(path.read_text()) == {"k": {"kernel": "gemm", "threads": 1}}


def test_a_bad_mode_is_refused_in_one_line(tiny):
    with pytest.raises(ValueError, match="the kernel probe mode must be one of cached, refresh, bypass, off, got 'x'"):
        choice.choose("target", tiny, 1, mode="x", candidates=NUMPY_TARGET)


def test_the_real_measurement_times_forwards_with_the_clock_it_is_given():
    ticks = iter(range(100))
    model = tiny_model().with_kernel("gemv-rows", 2)
    seen = []
    forward = model.forward
    prefill = model.prefill
    model.forward = lambda ids, cache: seen.append((len(ids), cache.length)) or forward(ids, cache)
    model.prefill = lambda ids, cache, threads=None: seen.append(("prefill", len(ids), threads)) or prefill(ids, cache)
    seconds = choice.time_forwards("gemv-rows", 2, model, 2, repeats=3, clock=lambda: next(ticks))
    assert seconds == 1  # each timed forward reads the clock twice, one tick apart
    # one prefill on ONE BLAS thread (none left spinning into the timings), then one untimed and 3 timed forwards of
    # 2 rows back to back, each from the same context
    assert seen == [("prefill", choice.PROBE_CONTEXT, 1)] + [(2, choice.PROBE_CONTEXT)] * 4


def test_a_target_beside_a_draft_is_timed_in_rounds_and_keyed_by_that_draft(tiny):
    """A machine where the GEMM kernel verifies faster alone, but a round with a draft on other threads costs it
    more (each kind of thread spinning on the other's cores): beside that draft the probe picks the GEMV kernel,
    and the draft it was timed with is in the cache key."""
    draft = tiny_model(seed=1).with_kernel("gemv-panels", 2)
    seen = []

    def measure(name, threads, model, rows, partner=None):
        seen.append(partner)
        alone = 1.0 if name == "gemm-blocks" else 1.2
        return alone + (0.5 if partner is not None and name == "gemm-blocks" else 0.0)
    assert choice.choose("target", tiny, 2, mode="bypass", measure=measure, candidates=NUMPY_TARGET).kernel \
        == "gemm-blocks" and seen == [None] * 8  # 4 choices, timed in two passes
    seen.clear()
    notes = []
    assert choice.choose("target", tiny, 2, mode="bypass", measure=measure, candidates=NUMPY_TARGET,
                         partner=draft, note=notes.append).kernel == "gemv-panels" and seen == [draft] * 8
    assert len(notes) == 1 and "timing the target's kernels gemm-blocks, gemv-panels" in notes[0] \
        and "beside its draft (gemv-panels)" in notes[0]
    alone, beside = (json.loads(choice.machine_key("target", NUMPY_TARGET, [[1, 2, 3, 4]], 2, p))["partner"]
                     for p in (None, choice.partner_key(draft)))
    assert alone is None and beside == ["gemv-panels/" + str(REGISTRY["gemv-panels"].version), 2,
                                        choice.model_shapes(draft)]


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
    seconds = choice.time_forwards("gemv-rows", 2, target, 3, repeats=1, clock=clock, partner=draft)
    c = choice.PROBE_CONTEXT
    span = ["clock", ("draft", 1, c), ("draft", 1, c + 1), ("target", 3, c)]  # the untimed one: no second reading
    assert seen == [("target", "prefill", c, 1), ("draft", "prefill", c, 1)] + span + span + ["clock"] \
        and seconds == 1  # both prefills on one BLAS thread


def test_the_probe_takes_the_median_of_its_timed_forwards_not_the_best():
    """Decoding pays every forward: timed spans of 5, 1 and 3 s (after the untimed one) count as 3 s."""
    readings = iter([0, 100, 105, 105, 106, 106, 109])  # untimed start, then (start, stop) per timed forward
    model = tiny_model().with_kernel("gemv-rows")
    assert choice.time_forwards("gemv-rows", 1, model, 1, repeats=3, clock=lambda: next(readings)) == 3


def test_load_chooses_each_roles_kernel_unless_one_is_given(tmp_path):
    target = load(None, "target", cache_dir=tmp_path, probe="off")
    assert target.kernel == choice.role_candidates("target")[0]
    assert load(None, "target", cache_dir=tmp_path, kernel="gemv-rows").kernel == "gemv-rows"
    with pytest.raises(ValueError, match="kernel probe mode"):
        load(None, "draft", cache_dir=tmp_path, probe="sometimes")
    assert tiny_model().kernel == "gemm-blocks"  # a Model built directly: registry.STATIC_DEFAULT


def test_the_command_probes_only_once_every_check_has_passed_and_as_kernel_probe_says(tmp_path, monkeypatch):
    # the shipped pair loads in place, so the probe's choices.json is the one file the cache can gain
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path))
    path = tmp_path / choice.CACHE_FILE

    def generate(*args):
        out, err = io.StringIO(), io.StringIO()
        status = main(["--temperature", "0", "--max-new-tokens", "3", "--json", "--quiet", "--threads", "2",
                       *args], out=out, err=err)
        return status, (json.loads(out.getvalue())["stats"] if status == 0 else err.getvalue())

    status, message = generate("x" * 2000)  # refused by the prompt check, after both models loaded
    assert status == 1 and "the prompt has 2000 tokens" in message and not path.exists()
    for mode in ("off", "bypass"):
        status, stats = generate("--kernel-probe", mode)
        assert status == 0 and not path.exists()
    assert all(stats[f"{role}_kernel"] in choice.role_candidates(role) for role in ("target", "draft"))
    off = generate("--kernel-probe", "off")[1]
    assert [off["target_kernel"], off["draft_kernel"]] == [choice.role_candidates(r)[0] for r in ("target", "draft")]
    assert (off["target_prefill_rows"], off["draft_prefill_rows"]) == (0, 0)  # unmeasured: every prefill a GEMM
    status, stats = generate()  # cached: each role with more than one candidate measured once and stored
    stored = [(json.loads(key), r) for key, r in choice.read_choices(path).items()]
    records = {key["role"]: (r["kernel"], r["threads"]) for key, r in stored if key["role"] != "prefill"}
    assert status == 0 and records == {role: (stats[f"{role}_kernel"], stats[f"{role}_threads"])
                                       for role in ("target", "draft")}  # 2 threads and 1: always timed
    prefills = {(*key["candidates"], key["threads"], r["prefill_rows"]) for key, r in stored if key["role"] == "prefill"}
    assert all((f"{stats[f'{role}_kernel']}/{REGISTRY[stats[f'{role}_kernel']].version}", stats[f"{role}_threads"],
                stats[f"{role}_prefill_rows"]) in prefills for role in ("target", "draft"))  # each model's, as chosen
    status, given = generate("--target-kernel", "gemv-rows", "--draft-kernel", "gemm")
    assert (given["target_kernel"], given["draft_kernel"]) == ("gemv-rows", "gemm")


def test_a_draft_model_the_job_does_not_use_is_neither_measured_nor_made_a_drafter(tmp_path, monkeypatch):
    """--max-new-tokens 1 clamps gamma to 0: the job drops its drafter, the draft is not probed, the target is timed
    alone, and decoding runs (a drafter rebuilt from no draft model raised TypeError)."""
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    status = main(["--temperature", "0", "--max-new-tokens", "1", "--json", "--quiet", "x"], out=out, err=err)
    assert status == 0, err.getvalue()
    stats = json.loads(out.getvalue())["stats"]
    records = [json.loads(key) for key in choice.read_choices(tmp_path / choice.CACHE_FILE)]
    assert stats["draft_kernel"] is None and stats["draft_prefill_rows"] is None
    assert sorted((r["role"], r["partner"]) for r in records) == [("prefill", None), ("target", None)]


def test_a_model_with_a_tiny_context_is_timed_on_what_fits():
    model = tiny_model(n_ctx=4)
    assert choice.time_forwards("gemv-rows", 1, model, 4, repeats=1) > 0  # 4 rows, no prefill
    assert choice.time_forwards("gemv-rows", 1, model, 9, repeats=1) > 0  # cut to the 4 that fit


def test_a_plain_decoding_is_named_by_its_kernel_and_by_its_threads_when_they_differ_from_those_asked_for():
    model = tiny_model().with_kernel("gemv-panels", 2)
    assert plain_label(model, 2) == "gemv-panels"
    assert plain_label(model, 4) == "gemv-panels at 2 threads"
    assert plain_label(model.with_kernel("gemv-panels", 1), 2) == "gemv-panels at 1 thread"


# ---- how long a prompt the chosen kernel prefills (choose_prefill), with faked timings ----

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
    found, seconds = choice.prefill_crossover(model, choice.PREFILL_LENGTHS, fake_prefills(kernel_per_id, gemm_start,
                                                                                          calls))
    assert found == rows and calls == [(n, by_kernel) for n in timed for by_kernel in (True, False)]
    assert seconds == {n: [0.1 + kernel_per_id * n, gemm_start + 0.001 * n] for n in timed}


def test_the_prefill_probe_is_cached_per_kernel_threads_and_shapes_refreshed_bypassed_or_off(tiny, tmp_path):
    path, calls, lines = tmp_path / choice.CACHE_FILE, [], []
    measure = fake_prefills(0.01, 0.2, calls)
    model = tiny.with_kernel("gemv-panels", threads=2)
    assert choice.choose_prefill(model, path, "off", measure) == 0 and not calls and not path.exists()
    assert choice.choose_prefill(model, path, "bypass", measure) == 8 and calls and not path.exists()
    calls.clear()
    assert choice.choose_prefill(model, path, "cached", measure, note=lines.append) == 8 and len(calls) == 2
    assert lines == ["timing prompts of 8/2 ids prefilled by gemv-panels and by the GEMM, on this machine (once; "
                     "--kernel-probe refresh times them again)"]  # 32 does not fit under the tiny model's 32 positions
    key, record = next(iter(choice.read_choices(path).items()))
    assert json.loads(key)["role"] == "prefill" and json.loads(key)["candidates"] == ["gemv-panels/1"]
    assert json.loads(key)["threads"] == 2 and record["prefill_rows"] == 8 and set(record["seconds"]) == {"8"}
    calls.clear()
    assert choice.choose_prefill(model, path, "cached", measure) == 8 and not calls  # read, not measured
    assert choice.choose_prefill(model, path, "refresh", fake_prefills(0.01, 0.05, calls)) == 0 and calls
    assert choice.choose_prefill(model, path, "cached", measure) == 0  # what refresh stored
    calls.clear()
    assert choice.choose_prefill(model.with_kernel("gemv-panels", threads=1), path, "cached", measure) == 8 and calls
    assert len(choice.read_choices(path)) == 2  # another thread count, another record
    with pytest.raises(ValueError, match="kernel probe mode"):
        choice.choose_prefill(model, path, "sometimes", measure)


@pytest.mark.parametrize("record", [{"prefill_rows": -1}, {"prefill_rows": True}, {"prefill_rows": 4.0}, [4], {}])
def test_a_malformed_prefill_record_is_measured_again(tiny, tmp_path, record):
    path, calls = tmp_path / choice.CACHE_FILE, []
    key = choice.machine_key("prefill", [tiny.kernel], [choice.model_shapes(tiny)], tiny.threads,
                             rows=choice.PREFILL_LENGTHS)
    choice.store_choice(path, key, record)
    assert choice.choose_prefill(tiny, path, "cached", fake_prefills(0.01, 0.2, calls)) == 8 and calls


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
        assert choice.time_prefill(PrefillRecorder(seen), 4, by_kernel, repeats=3, clock=clock, sleep=sleep) == 3
        one = [("sleep", choice.PAUSE), "cache", "clock", ("prefill", 4, route)] + \
            [("forward", 1)] * choice.PREFILL_AFTER + ["clock"]
        assert seen == one * 3
    seen.clear()
    readings = iter([0, 1])
    choice.time_prefill(PrefillRecorder(seen, n_ctx=5), 4, True, repeats=1, clock=clock, sleep=sleep)
    assert seen.count(("forward", 1)) == 1  # the forwards after it cut to the context


def test_load_gives_a_role_the_cached_prefill_of_its_chosen_kernel_and_none_with_probe_off(tmp_path):
    """The kernel's choice and its prefill's, stored as a probe would have: load reads both and measures nothing."""
    off = load(None, "draft", cache_dir=tmp_path, probe="off")
    assert off.prefill_rows == 0 and not (tmp_path / choice.CACHE_FILE).exists()
    path, lines = tmp_path / choice.CACHE_FILE, []
    candidates = choice.role_candidates("draft")
    kernel = candidates[-1]
    choice.store_choice(path, choice.machine_key("draft", candidates, [choice.model_shapes(off)], 1),
                        {"kernel": kernel, "threads": 1})
    choice.store_choice(path, choice.machine_key("prefill", [kernel], [choice.model_shapes(off)], 1,
                                                 rows=choice.PREFILL_LENGTHS), {"prefill_rows": 16})
    model = load(None, "draft", cache_dir=tmp_path, note=lines.append)
    assert (model.kernel, model.threads, model.prefill_rows) == (kernel, 1, 16) and not lines
