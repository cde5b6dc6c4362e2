"""The kernel probe's store: `ChoiceFile`, the records npspec.kernels.probe measured, kept per machine.

One JSON object in the cache directory's `choices.json` (CACHE_FILE), {key: record}, written whole to a temporary
file renamed over the old one under a filelock in `.locks/` (store_choice), so a crash or a concurrent run never leaves
it half written; the probe's timings hold a second lock, `.locks/probe.lock` (probe_lock), so two processes do not
time each other's forwards. A key (machine_key) names everything a timing depends on: PROBE_VERSION, the CPU
(cpu_model), numpy's BLAS (blas_key), numpy's version, the role, the candidates with their code versions, the shapes,
rows and threads timed, and the partner. A record that is missing, malformed or unreadable is measured again; a store
that cannot write says why and the fix. MODES (npspec.kernels.probe's) say how the probe uses the store.
Notes go to the "npspec.sources.choices" logger. Imports npspec.kernels.registry, npspec.kernels.probe,
npspec.sources.atomic; filelock, threadpoolctl.
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

PROBE_VERSION = 7  # in every key: raised when how npspec.kernels.probe times a candidate changes (git log: why)
CACHE_FILE = "choices.json"
MAX_CACHE_BYTES = 4 << 20  # a larger choices.json is not read (a record is under 1 KB): measured again, then rewritten
LOCK_SECONDS = 60  # how long a store waits for another process's lock on choices.json before skipping the cache
PROBE_LOCK_SECONDS = 900  # how long a probe waits for another process's probe (probe_lock) before timing anyway


class ChoiceFile:
    """The probe's Store (npspec.kernels.probe.Store) in the cache file `path` (a Path)."""

    def __init__(self, path):
        self.path = Path(path)

    def __repr__(self):
        return f"ChoiceFile({str(self.path)!r})"

    def record(self, what):
        """The record stored under machine_key(**what), or None."""
        return read_choices(self.path).get(machine_key(**what))

    def choice(self, what):
        """The stored (kernel, threads) under `what` (cached_choice), or None."""
        return cached_choice(self.record(what))

    def prefill_rows(self, what):
        """The stored prefill length under `what` (cached_prefill_rows), or None."""
        return cached_prefill_rows(self.record(what))

    def keep(self, what, record):
        """store_choice under machine_key(**what); returns whether it was stored."""
        return store_choice(self.path, machine_key(**what), record)

    def probing(self):
        """probe_lock beside the file: held while this process times kernels."""
        return probe_lock(self.path)


def cpu_model(cpuinfo=Path("/proc/cpuinfo")):
    """The CPU's model name with its family and model numbers (Linux's /proc/cpuinfo; else platform's), e.g. "AMD EPYC
    (family 26, model 2)": a virtual machine's name alone is the same for CPUs whose kernel choices differ.
    cpuinfo: the file read (a parameter for tests)."""
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
    """numpy's BLAS as threadpoolctl sees it: [[library, version, kernel set]], sorted. Only the BLAS loaded from
    numpy's own files (its package or `numpy.libs`) counts, as other libraries load theirs in any order (numba
    imports scipy's); a numpy linked to a BLAS outside its files keys every BLAS loaded. info: threadpool_info()'s
    list; numpy_dir: numpy's package directory (parameters for tests)."""
    info = threadpool_info() if info is None else info
    root = Path(numpy_dir or os.path.dirname(np.__file__)).resolve()
    own = (root, root.with_name(root.name + ".libs"))
    blas = [i for i in info if i.get("user_api") == "blas"]
    mine = [i for i in blas if any(Path(i.get("filepath") or "/").resolve().is_relative_to(d) for d in own)]
    return sorted(([i.get("internal_api"), i.get("version"), i.get("architecture")] for i in (mine or blas)), key=str)


def machine_key(role, candidates, shapes, threads, partner=None, rows=None):
    """The key of a record (module docstring): a JSON string. candidates: kernel names, keyed with their code's
    version (registry.Kernel.version). partner: None or npspec.kernels.probe.partner_key's list. rows: the row
    counts timed (default npspec.kernels.probe.ROLE_ROWS[role])."""
    rows = ROLE_ROWS[role] if rows is None else rows
    return json.dumps({"probe": PROBE_VERSION, "cpu": cpu_model(), "blas": blas_key(), "numpy": np.__version__,
                       "role": role,
                       "candidates": [f"{c}/{REGISTRY[c].version}" for c in candidates],
                       "shapes": [list(s) for s in shapes], "rows": list(rows), "threads": threads,
                       "partner": partner}, sort_keys=True)


def cached_choice(record):  # a record -> (kernel, threads), or None if it is not a well-formed one
    """The (kernel, threads) a record names: a kernel name and a thread count that is an int (not a bool nor a
    float), else None (measured again: a hand-edited or damaged record)."""
    if not isinstance(record, dict) or not isinstance(record.get("kernel"), str):
        return None
    threads = record.get("threads")
    return (record["kernel"], threads) if type(threads) is int else None


def cached_prefill_rows(record):  # a record -> int, or None if it is not a well-formed one
    """The prefill_rows a record names: an int >= 0 (not a bool), else None (measured again)."""
    rows = record.get("prefill_rows") if isinstance(record, dict) else None
    return rows if type(rows) is int and rows >= 0 else None


@contextlib.contextmanager
def probe_lock(path):
    """Hold `.locks/probe.lock` beside the cache file `path` while this process times kernels. If another holds it,
    say so and wait up to PROBE_LOCK_SECONDS, then time anyway (saying so); where no lock file can be made (a
    read-only cache directory), time without it."""
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
    """The stored records {key: record} in `path`; {} (then measured again) if it is missing, not a regular file (a
    FIFO would block the read), over MAX_CACHE_BYTES, or not a JSON object (damaged, nested too deep)."""
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
    """Add `record` under `key` to the cache file `path`, under its filelock, the whole file rewritten atomically
    (npspec.sources.atomic.atomic_write; a killed store's temporary files deleted first). A cache that cannot be
    written (read-only, not a regular file, its lock held past LOCK_SECONDS) is skipped with a note naming the fix;
    a wait for the lock is noted first. Returns whether it was stored."""
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
