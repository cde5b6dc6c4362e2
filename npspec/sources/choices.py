"""The kernel probe's store: `ChoiceFile`, npspec.kernels.probe's records kept per machine in choices.json.

One JSON object {key: record}, rewritten whole and atomically under a lock in `.locks/` (store_choice); the probe's
timings hold `.locks/probe.lock` (probe_lock) so two processes do not time each other. A key (machine_key) names
what a timing depends on: PROBE_VERSION, the CPU, numpy's BLAS and version, the role, the candidates with their
code versions, shapes, rows, threads and partner. A missing, malformed or unreadable record is measured again; a
cache that cannot be written is skipped with a note naming the fix. Notes go to the "npspec.sources.choices"
logger. Imports npspec.kernels (registry, probe), npspec.sources.atomic; filelock, threadpoolctl.
"""

import contextlib
import json
import logging
import os
import platform
import stat
from pathlib import Path

import numpy as np
from filelock import Timeout
from threadpoolctl import threadpool_info

from .atomic import NotRegularFile, atomic_write, locked, remove_leftovers
from ..kernels.probe import MODES, ROLE_ROWS
from ..kernels.registry import REGISTRY

__all__ = ["CACHE_FILE", "MODES", "ChoiceFile", "blas_key", "cpu_model", "machine_key", "read_choices", "store_choice"]

log = logging.getLogger(__name__)

PROBE_VERSION = 8  # in every key: raised when how npspec.kernels.probe times a candidate changes (git log: why)
CACHE_FILE = "choices.json"
MAX_CACHE_BYTES = 4 << 20  # a larger choices.json is not read (a record is under 1 KB): measured again, then rewritten
LOCK_SECONDS = 60  # how long a store waits for another process's lock on choices.json before skipping the cache
PROBE_LOCK_SECONDS = 900  # how long a probe waits for another process's probe (probe_lock) before timing anyway


class ChoiceFile:
    """npspec.kernels.probe.Store in the cache file `path`, keyed by machine_key(**what)."""

    def __init__(self, path):
        self.path = Path(path)

    def __repr__(self):
        return f"ChoiceFile({str(self.path)!r})"

    def record(self, what):  # the record under `what`, or None
        return read_choices(self.path).get(machine_key(**what))

    def choice(self, what):  # its (kernel, threads), or None
        return cached_choice(self.record(what))

    def prefill_rows(self, what):  # its prefill length, or None
        return cached_prefill_rows(self.record(what))

    def keep(self, what, record):  # -> whether it was stored
        return store_choice(self.path, machine_key(**what), record)

    def probing(self):  # held while this process times kernels
        return probe_lock(self.path)


def cpu_model(cpuinfo=Path("/proc/cpuinfo")):
    """The CPU's model name with its family and model numbers ("AMD EPYC (family 26, model 2)": a virtual
    machine's name alone hides which Zen) from `cpuinfo` (Linux), else platform's."""
    try:
        fields = {}
        for line in cpuinfo.read_text().splitlines():
            name, colon, value = line.partition(":")
            if not colon:
                break  # the first CPU's block ends at its blank line
            fields.setdefault(name.strip(), value.strip())
        if "model name" in fields:
            numbers = [f"{label} {fields[name]}" for name, label in (("cpu family", "family"), ("model", "model"))
                       if name in fields]
            return fields["model name"] + (f" ({', '.join(numbers)})" if numbers else "")
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_key(info=None, numpy_dir=None):
    """[[library, version, kernel set]] of numpy's BLAS (threadpoolctl's `info`), only those loaded from numpy's
    own files (others load theirs in any order), else every one, sorted."""
    info = threadpool_info() if info is None else info
    root = Path(numpy_dir or os.path.dirname(np.__file__)).resolve()
    own = (root, root.with_name(root.name + ".libs"))
    blas = [i for i in info if i.get("user_api") == "blas"]
    mine = [i for i in blas if any(Path(i.get("filepath") or "/").resolve().is_relative_to(d) for d in own)]
    return sorted(([i.get("internal_api"), i.get("version"), i.get("architecture")] for i in (mine or blas)), key=str)


def machine_key(role, candidates, shapes, threads, partner=None, rows=None):
    """A record's key, a JSON string (module docstring): candidates keyed with registry.Kernel.version,
    partner as npspec.kernels.probe.partner_key, rows default ROLE_ROWS[role]."""
    rows = ROLE_ROWS[role] if rows is None else rows
    return json.dumps({"probe": PROBE_VERSION, "cpu": cpu_model(), "blas": blas_key(), "numpy": np.__version__,
                       "role": role,
                       "candidates": [f"{c}/{REGISTRY[c].version}" for c in candidates],
                       "shapes": [list(s) for s in shapes], "rows": list(rows), "threads": threads,
                       "partner": partner}, sort_keys=True)


def cached_choice(record):  # a record -> (kernel, threads), or None if it is not a well-formed one
    """(kernel, threads) of a record with a kernel name and an int (not bool) threads, else None."""
    if not isinstance(record, dict) or not isinstance(record.get("kernel"), str):
        return None
    threads = record.get("threads")
    return (record["kernel"], threads) if type(threads) is int else None


def cached_prefill_rows(record):  # a record -> int, or None if it is not a well-formed one
    """The int >= 0 (not bool) prefill_rows of a record, else None."""
    rows = record.get("prefill_rows") if isinstance(record, dict) else None
    return rows if type(rows) is int and rows >= 0 else None


@contextlib.contextmanager
def probe_lock(path):
    """Hold `.locks/probe.lock` beside `path` while timing: if another holds it, say so and wait up to
    PROBE_LOCK_SECONDS, then time anyway (saying so); no lock where none can be made."""
    lock = Path(path).parent / ".locks" / "probe.lock"
    with contextlib.ExitStack() as hold:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            if not hold.enter_context(locked(lock, blocking=False)):
                log.info("another npspec is timing kernels on this machine: waiting for it, so that the two probes do "
                         f"not time each other (lock file {lock}, up to {PROBE_LOCK_SECONDS} s)")
                hold.enter_context(locked(lock, timeout=PROBE_LOCK_SECONDS))
        except Timeout:
            log.info(f"{lock} is still held after {PROBE_LOCK_SECONDS} s: timing anyway (the other process's forwards "
                     "may slow these; --kernel-probe refresh times them again later)")
        except OSError:  # no lock file can be made here: time without one
            pass
        yield


def read_choices(path):
    """{key: record} of `path`; {} if missing, not a regular file (a FIFO would block), over
    MAX_CACHE_BYTES or not a JSON object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CACHE_BYTES:
                return {}
            data = json.loads(f.read(MAX_CACHE_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def store_choice(path, key, record):
    """Add `record` under `key` to `path` (atomic_write under its lock; a killed store's leftovers deleted).
    Skipped with a note naming the fix when the cache cannot be written (read-only, not a regular file, the lock held
    past LOCK_SECONDS). Returns whether it was stored."""
    path = Path(path)
    lock = path.parent / ".locks" / f"{path.name}.lock"  # beside the cache's other lock files

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as hold:
            if not hold.enter_context(locked(lock, blocking=False)):
                log.info(f"another process is writing the kernel choices: waiting for it (lock file {lock}, up to "
                         f"{LOCK_SECONDS} s)")
                hold.enter_context(locked(lock, timeout=LOCK_SECONDS))
            remove_leftovers(path)  # a store killed mid-write (SIGKILL) left its temporary file: no write runs now
            data = read_choices(path)
            data[key] = record
            atomic_write(path, write)
    except Timeout:
        log.info(f"the kernel choice was not stored: another process still holds {lock} after {LOCK_SECONDS} s "
                 "(it is measured again next run; if no npspec is running, delete that lock file)")
        return False
    except NotRegularFile as e:  # its message's first clause names what is there; its advice is for output files
        log.info(f"the kernel choice was not stored: {str(e).split(';')[0]}; it is measured again next run; move that "
                 "away, set NPSPEC_CACHE to another directory, or pass --kernel-probe bypass")
        return False
    except OSError as e:
        log.info(f"the kernel choice was not stored in {path} ({e.strerror or e}): it is measured again next run; "
                 "make the cache directory writable, set NPSPEC_CACHE to one that is, or pass --kernel-probe bypass")
        return False
    return True
