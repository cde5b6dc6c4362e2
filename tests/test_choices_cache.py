"""The kernel probe's store (npspec.sources.choices): records kept per machine in choices.json, as the probe's mode
says, with FAKED timings (tests/test_probe.py's machines); its keys, locks, and what it does with a cache file that
is damaged, malformed, unwritable or not a regular file.
"""

import dataclasses
import json
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from npspec.kernels import probe
from npspec.kernels.registry import REGISTRY
from npspec.sources import choices as choice
from npspec.sources.atomic import locked
from npspec.sources.choices import ChoiceFile

from test_probe import NUMPY_TARGET, fake_machine, fake_prefills


def choose(model, threads, path, mode, measure, **kwargs):
    """probe.choose for the target over NUMPY_TARGET, kept in the cache file `path`."""
    return probe.choose("target", model, threads, ChoiceFile(path), mode, measure, NUMPY_TARGET, **kwargs)


def test_the_probe_times_the_rows_it_is_told_and_caches_each_row_count_apart(tiny, tmp_path):
    # gemm-blocks pays one few-row GEMM (1.5 s) whatever the rows, gemv-panels 1 s plus 0.25 s a row: the cheaper
    # kernel changes between a 2-row verify (gamma 1) and a 5-row one (gamma 4)
    path, calls = tmp_path / choice.CACHE_FILE, []
    machine = fake_machine(1.5, calls)
    assert choose(tiny, 1, path, "cached", machine, rows=(2,)) == ("gemv-panels", 1)
    assert {c[4] for c in calls} == {2}
    calls.clear()
    assert choose(tiny, 1, path, "cached", machine, rows=(5,)) == ("gemm-blocks", 1)
    assert {c[4] for c in calls} == {5}  # not the 2-row record: measured at its own rows
    records = json.loads(path.read_text())
    assert sorted(r["rows"] for r in records.values()) == [[2], [5]]
    calls.clear()
    assert choose(tiny, 1, path, "cached", machine, rows=(2,)) == ("gemv-panels", 1)
    assert calls == []  # each row count's record is found again


def test_the_choice_is_cached_per_machine_and_refreshed_or_bypassed_on_demand(tiny, tmp_path):
    path, calls = tmp_path / "c" / choice.CACHE_FILE, []
    slow_gemm, fast_gemm = fake_machine(3.0, calls), fake_machine(1.05, calls)
    assert choose(tiny, 2, path, "cached", slow_gemm) == ("gemv-panels", 2)
    n = len(calls)
    assert n and path.is_file()
    # cached: the stored choice, nothing measured (even if the machine would now answer otherwise)
    assert choose(tiny, 2, path, "cached", fast_gemm) == ("gemv-panels", 2)
    assert len(calls) == n
    # bypass: measured, the cache neither read nor written
    assert choose(tiny, 2, path, "bypass", fast_gemm) == ("gemm-blocks", 2)
    assert len(calls) == 2 * n and choose(tiny, 2, path, "cached", fast_gemm) == ("gemv-panels", 2)
    # refresh: measured again and stored, a one-thread choice with its thread count
    one = fake_machine(1.05, calls, one_thread=0.5)
    assert choose(tiny, 2, path, "refresh", one) == ("gemm-blocks", 1)
    assert choose(tiny, 2, path, "cached", slow_gemm) == ("gemm-blocks", 1)
    # another thread count, shape or role is another key
    assert choose(tiny, 1, path, "cached", slow_gemm) == ("gemv-panels", 1)
    records = json.loads(path.read_text())
    assert len(records) == 2 and all(r["kernel"] in NUMPY_TARGET and r["rows"] == list(probe.ROLE_ROWS["target"])
                                     for r in records.values())
    timed = [r for r in records.values() if r["threads"] == 1 and len(r["seconds"]) == 4][0]["seconds"]
    assert {(t["kernel"], t["threads"]) for t in timed} == {(k, n) for k in NUMPY_TARGET for n in (2, 1)}


def test_a_record_of_an_older_npspec_without_its_threads_is_measured_again(tiny, tmp_path):
    path, calls = tmp_path / choice.CACHE_FILE, []
    assert choose(tiny, 2, path, "cached", fake_machine(3.0, calls))
    key, = json.loads(path.read_text())
    choice.store_choice(path, key, {"kernel": "gemm-blocks", "rows": [4], "seconds": {}})  # the format before
    calls.clear()
    assert choose(tiny, 2, path, "cached", fake_machine(3.0, calls)) == ("gemv-panels", 2)
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
    assert choose(tiny, 2, path, "cached", fake_machine(3.0)) == ("gemv-panels", 2)
    assert json.loads(path.read_text())  # rewritten whole
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert choice.store_choice(blocked / choice.CACHE_FILE, "k", {"kernel": "gemm"}) is False  # no directory there


def test_a_choice_that_cannot_be_stored_says_why_and_the_fix(tiny, tmp_path, notes):
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert choose(tiny, 2, blocked / choice.CACHE_FILE, "cached", fake_machine(3.0)) == ("gemv-panels", 2)
    said = notes()
    assert said[0].startswith("timing the target's kernels") and len(said) == 3
    assert said[1].startswith("the target's fastest of gemm-blocks, gemv-panels is gemv-panels at 2 thread(s); ms per")
    assert said[2].startswith(f"the kernel choice was not stored in {blocked / choice.CACHE_FILE} (")
    assert "measured again next run" in said[2] and "--kernel-probe bypass" in said[2]
    taken = tmp_path / "taken" / choice.CACHE_FILE
    taken.mkdir(parents=True)  # a directory where the file goes: named, with a fix that fits a cache
    assert choice.store_choice(taken, "k", {"kernel": "gemm", "threads": 1}) is False
    assert notes()[3:] == [f"the kernel choice was not stored: {taken} is a directory, not a regular file; it is "
                           "measured again next run; move that away, set NPSPEC_CACHE to another directory, or pass "
                           "--kernel-probe bypass"]


def test_a_held_lock_is_announced_before_the_wait_and_skipped_after_it(tmp_path, monkeypatch, notes):
    monkeypatch.setattr(choice, "LOCK_SECONDS", 0.2)
    path = tmp_path / choice.CACHE_FILE
    lock = tmp_path / ".locks" / f"{choice.CACHE_FILE}.lock"
    lock.parent.mkdir()
    with locked(lock) as held:
        assert held
        assert choice.store_choice(path, "k", {"kernel": "gemm", "threads": 1}) is False
    said = notes()
    assert len(said) == 2 and said[0].startswith("another process is writing the kernel choices: waiting for it")
    assert str(lock) in said[0]
    assert said[1].startswith("the kernel choice was not stored: another process still holds")
    assert not path.exists()
    assert choice.store_choice(path, "k", {"kernel": "gemm", "threads": 1})
    assert len(notes()) == 2  # the lock free: silent


@pytest.mark.parametrize("record", [5, "gemv-panels", [1], None, {"kernel": "gemv-panels"},
                                    {"kernel": "gemv-panels", "threads": True}, {"kernel": "gemv-panels", "threads": 1.0},
                                    {"kernel": ["gemv-panels"], "threads": 1}, {"kernel": "no-such-kernel", "threads": 1}])
def test_a_malformed_cached_record_is_measured_again(tiny, tmp_path, record):
    """A hand-edited record (not an object, threads a bool or a float, an unknown kernel) is a miss, not a crash or a
    `threads=True` handed to the kernel: measured and replaced."""
    path = tmp_path / choice.CACHE_FILE
    key = choice.machine_key("target", NUMPY_TARGET, [probe.model_shapes(tiny)], 2)
    path.write_text(json.dumps({key: record}))
    assert choose(tiny, 2, path, "cached", fake_machine(3.0)) == ("gemv-panels", 2)
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


def test_a_probe_waits_for_another_ones_and_uses_what_it_stored(tiny, tmp_path, monkeypatch, notes):
    # two processes probing at once would time each other's forwards: the second waits, then finds the first's record
    path, calls, result = tmp_path / choice.CACHE_FILE, [], []
    lock = tmp_path / ".locks" / "probe.lock"
    lock.parent.mkdir()
    key = choice.machine_key("target", NUMPY_TARGET, [probe.model_shapes(tiny)], 2, None, (4,))
    with locked(lock):
        waiting = threading.Thread(target=lambda: result.append(choose(tiny, 2, path, "cached",
                                                                       fake_machine(3.0, calls))))
        waiting.start()
        for _ in range(500):
            if notes():
                break
            threading.Event().wait(0.01)
        said = notes()
        assert len(said) == 1 and said[0].startswith("another npspec is timing kernels on this machine: waiting")
        assert choice.store_choice(path, key, {"kernel": "gemm-blocks", "threads": 1})  # the other probe's result
    waiting.join(10)
    assert result == [("gemm-blocks", 1)] and calls == []  # its record, nothing timed
    # a probe still held past PROBE_LOCK_SECONDS: timed anyway, and said so
    monkeypatch.setattr(choice, "PROBE_LOCK_SECONDS", 0.1)
    with locked(lock):
        assert choose(tiny, 2, path, "refresh", fake_machine(3.0, calls)) == ("gemv-panels", 2)
    assert calls and "is still held after 0.1 s: timing anyway" in notes()[2]


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


def test_the_prefill_probe_is_cached_per_kernel_threads_and_shapes_refreshed_bypassed_or_off(tiny, tmp_path, notes):
    path, calls = tmp_path / choice.CACHE_FILE, []
    store, measure = ChoiceFile(path), fake_prefills(0.01, 0.2, calls)
    model = tiny.with_kernel("gemv-panels", threads=2)
    assert probe.choose_prefill(model, store, "off", measure) == 0 and not calls and not path.exists()
    assert probe.choose_prefill(model, store, "bypass", measure) == 8 and calls and not path.exists()
    calls.clear()
    before = len(notes())
    assert probe.choose_prefill(model, store, "cached", measure) == 8 and len(calls) == 2
    assert notes()[before:] == [f"timing prompts of 8/2 ids prefilled by gemv-panels and by the GEMM for the "
                                f"{model.config.n_layer}-layer model, on this machine (once; --kernel-probe refresh "
                                "times them again)"]  # 32 does not fit under n_ctx 32
    key, record = next(iter(choice.read_choices(path).items()))
    assert json.loads(key)["role"] == "prefill" and json.loads(key)["candidates"] == ["gemv-panels/1"]
    assert json.loads(key)["threads"] == 2 and record["prefill_rows"] == 8 and set(record["seconds"]) == {"8"}
    calls.clear()
    assert probe.choose_prefill(model, store, "cached", measure) == 8 and not calls  # read, not measured
    assert probe.choose_prefill(model, store, "refresh", fake_prefills(0.01, 0.05, calls)) == 0 and calls
    assert probe.choose_prefill(model, store, "cached", measure) == 0  # what refresh stored
    calls.clear()
    assert probe.choose_prefill(model.with_kernel("gemv-panels", threads=1), store, "cached", measure) == 8 and calls
    assert len(choice.read_choices(path)) == 2  # another thread count, another record
    with pytest.raises(ValueError, match="kernel probe mode"):
        probe.choose_prefill(model, store, "sometimes", measure)


@pytest.mark.parametrize("record", [{"prefill_rows": -1}, {"prefill_rows": True}, {"prefill_rows": 4.0}, [4], {}])
def test_a_malformed_prefill_record_is_measured_again(tiny, tmp_path, record):
    path, calls = tmp_path / choice.CACHE_FILE, []
    key = choice.machine_key("prefill", [tiny.kernel], [probe.model_shapes(tiny)], tiny.threads,
                             rows=probe.PREFILL_LENGTHS)
    choice.store_choice(path, key, record)
    assert probe.choose_prefill(tiny, ChoiceFile(path), "cached", fake_prefills(0.01, 0.2, calls)) == 8 and calls
