"""The conversion cache's lock (npspec.sources.cache, filelock): a second builder waits, says so, and gives up
with the lock file's name after its timeout. (Two real processes converting at once: tests/test_sources.py.)"""

import threading
import time

import pytest
from filelock import FileLock

from npspec.sources.errors import CheckpointError
from npspec.sources import cache


def lock_file(root, final):
    return root / ".locks" / ("--".join(final.relative_to(root).parts) + ".lock")


def test_a_held_lock_times_out_naming_the_lock_file(tmp_path, notes):
    final = tmp_path / "random" / "entry"
    built = []
    with FileLock(lock_file(tmp_path, final)):  # another builder of the same entry
        with pytest.raises(CheckpointError) as e:
            cache.cached(tmp_path, final, built.append, "random:tiny", lock_timeout=0.2)
    message = str(e.value)
    assert "\n" not in message and str(lock_file(tmp_path, final)) in message and "0.2 s" in message
    assert built == [] and not final.exists()
    assert len(notes()) == 1 and notes()[0].startswith(
        f"another process is building random:tiny: waiting for it (lock file {lock_file(tmp_path, final)}")


def test_a_waiting_builder_reuses_what_the_holder_built(tmp_path, capsys, notes):
    final = tmp_path / "random" / "entry"
    held = threading.Event()

    def other_builder():  # takes the lock, publishes the entry, then lets go
        with FileLock(lock_file(tmp_path, final)):
            held.set()
            time.sleep(0.3)
            final.mkdir(parents=True)

    t = threading.Thread(target=other_builder)
    t.start()
    held.wait()
    built = []
    assert cache.cached(tmp_path, final, built.append, "random:tiny", lock_timeout=30) == final
    t.join()
    assert built == []  # found the entry once the lock was free: not built twice
    assert len(notes()) == 1 and "another process is building" in notes()[0]
    assert capsys.readouterr().err == ""  # said through the "npspec" logger; the library prints nothing


def test_a_free_lock_builds_once_and_releases(tmp_path, capsys, notes):
    final = tmp_path / "random" / "entry"
    built = []
    assert cache.cached(tmp_path, final, built.append, "random:tiny", lock_timeout=0) == final
    assert len(built) == 1 and final.is_dir()
    assert len(notes()) == 1 and notes()[0].startswith("converting random:tiny into ")
    assert capsys.readouterr().err == ""
    FileLock(lock_file(tmp_path, final)).acquire(timeout=0)  # released: anyone may take it at once
