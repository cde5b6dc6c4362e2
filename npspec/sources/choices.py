"""Which kernel a role decodes with, on how many threads: the fastest of its candidates, measured on this machine,
cached per machine.

Imports npspec.kernels.registry, npspec.sources.atomic (its locks and atomic writes); threadpoolctl (and is handed npspec.model.model.Model
objects). Which invariant NumPy kernel is fastest depends on the BLAS: OpenBLAS' few-row GEMM over GPT-2's block
matrices costs about a GEMV on the Intel machine of bench/results/earlier/ (so "gemm-blocks" verifies cheapest there)
and about 3x a GEMV with its Haswell kernels on AMD Zen 2 and 3 (so "gemv-panels" does; issue 24). So npspec never
hard-codes the choice: `choose` times each candidate of a role (registry.role_candidates) in the model's own decoding
forwards (with the rows the role multiplies: its verify's gamma + 1 for a target beside a drafter, one for a draft or a
target decoding alone; ROLE_ROWS when the caller does not say), at the thread count asked for and at one thread
(`thread_options`), and keeps the fastest pair (the sum of its median times over REPEATS runs, the mean of two passes
over the candidates in opposite orders: measure_all). A target that decodes
beside a draft model is timed in ROUNDS with that draft (`partner`): each timed span is the draft's one-token
forwards, as many as the target verifies rows less one, then the target's forward, as speculative decoding alternates
them on the same cores. Timed alone, a target on BLAS's threads can win and then lose in the loop: on an AMD Zen 4,
"gemm-blocks" verified 4 rows of gpt2-large in 153.9 ms against 172.3 for "compiled-panels" alone, yet beside a
compiled distilgpt2 draft (numba's threads) issue 24's command ran at 0.87x with it (bench/results/issue24/README.md):
each kind of thread spins on the cores the other needs. One thread is a candidate because every candidate shares a
forward's products over threads (npspec's own workers, or numba's for "compiled-panels"), and handing each of a
forward's ~150 products to them can cost more than the second core gives: on an AMD Zen 5 virtual machine
"compiled-panels" ran a one-token gpt2-large forward in 101.8 ms at one thread against 114.2 ms at two
(bench/results/issue24/zen5/threads/), while on a Zen 4 the same kernel verified 4 rows faster at two. A single pair
is not timed.

The result is cached in npspec's cache directory (`choices.json` there: one JSON object, written whole to a temporary
file and renamed over the old one, under a filelock in the cache's `.locks/`, so a crash or a concurrent run never
leaves it half written; the probe itself runs under a second lock, `probe.lock`, so that two processes probing at
once wait for each other instead of timing each other's forwards), keyed by everything the timing depends on
(`machine_key`): the CPU model, numpy's own BLAS (`blas_key`; threadpoolctl: library, version, kernel set), the
numpy version, the role, the candidates (with their code's versions), the shapes, the rows timed, the thread count
asked for, the partner (its kernel, threads and shapes) and how the probe times (PROBE_VERSION). `mode` (the CLI's --kernel-probe) says how the cache is used:
  * "cached" (the default): use the cached choice, else measure and store it;
  * "refresh": measure again and store it (after a BLAS or CPU change threadpoolctl cannot see);
  * "bypass": measure, neither read nor write the cache (a read-only cache directory needs nothing else);
  * "off": no measurement: the role's first candidate at the threads asked for (registry.role_candidates;
    reproducible runs and tests).
The result is a `Choice` (kernel, threads); repr(model) and `npspec generate --json` show both.

Then `choose_prefill` measures how long a prompt the chosen kernel prefills faster than the GEMM does (a Model's
`prefill_rows`), cached the same way under its own key. On an Intel Sapphire Rapids, a gpt2-large decoding's start
(a 4-id prompt's prefill, then 8 one-token forwards) took 1238.9 ms with the prefill by BLAS GEMM at two threads and
983.3 ms by "compiled-panels" itself; a 48-id prompt's, 1495.8 and 1255.9 ms (bench/results/issue24/intel5/run_all/
profile_start.md): the few-row GEMM costs more than the kernel's pass over the weights, and leaves OpenBLAS's threads
spinning on the cores numba's threads need next. On a BLAS with a fast few-row GEMM the GEMM may win, so that length
is measured, not written down.
"""

import contextlib
import json
import os
import platform
import stat
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from filelock import Timeout
from threadpoolctl import threadpool_info

from .atomic import NotRegularFile, atomic_write, locked, remove_leftovers
from ..kernels.compiled import KernelUnavailable
from ..kernels.registry import REGISTRY, role_candidates

MODES = ("cached", "refresh", "bypass", "off")
ROLE_ROWS = {"target": (4,), "draft": (1,)}  # rows timed when choose is not told: a target verifies gamma + 1 (4 at
# gamma 3), a draft decodes 1 (npspec generate tells it: the job's own verify rows, npspec.cli.generate.verify_rows)
PROBE_VERSION = 7  # in every cache key: raised when how a candidate is timed changes (2: one prefill per timing;
# 3: a target timed in rounds with its draft; 4: the median of REPEATS, not the best; 5: the rows timed are the key's;
# 6: two passes in opposite orders, measure_all; 7: the prefill on one BLAS thread, time_forwards)
REPEATS = 5  # the median of this many timed runs per (kernel, rows), after one untimed run (the first use compiles).
# The median, not the best: decoding pays every forward, and on a noisy virtual machine the best run is far from the
# typical one, by a different amount for each kernel (an AMD Zen 4 ran the same 4-row gpt2-large forward in 128.6 ms
# at best and 199.1 ms as a median of 8; its probe's best rounds put gemm-blocks 7% ahead of gemv-panels, whose
# verifies then ran 9% faster in the loop: bench/results/issue24/README.md)
CACHE_FILE = "choices.json"
MAX_CACHE_BYTES = 4 << 20  # a larger choices.json is not read (a record is under 1 KB): measured again, then rewritten
LOCK_SECONDS = 60  # how long a store waits for another process's lock on choices.json before skipping the cache
PROBE_LOCK_SECONDS = 900  # how long a probe waits for another process's probe (probe_lock) before timing anyway
PROBE_CONTEXT = 8  # cached tokens before a timed forward (time_forwards)
PREFILL_LENGTHS = (32, 8, 2)  # the prompt lengths choose_prefill times, longest first: the probe's budget, not a
# property of any BLAS (a longer prompt keeps the GEMM prefill; each step down is a quarter of the last). Timing 64 ids
# too took gpt2-large's probe 13.5 s on an Intel Sapphire Rapids, where the two ways were within 2% at 64
PREFILL_AFTER = 3  # the one-token forwards timed after each prefill (time_prefill)
PREFILL_REPEATS = 3  # time_prefill's median of this many
PAUSE = 0.2  # seconds before each timed prefill: the previous one's BLAS threads fall asleep (time_prefill)


def cpu_model(cpuinfo=Path("/proc/cpuinfo")):
    """The CPU's model name with its family and model numbers (Linux's /proc/cpuinfo; else platform's), e.g. "AMD EPYC
    (family 26, model 2)": a virtual machine's model name alone ("AMD EPYC") is the same for AMD's Zen 2, 3 and 5,
    whose BLAS kernels and kernel choices differ. cpuinfo: the file read (a parameter for tests)."""
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
    """numpy's BLAS, as threadpoolctl sees it: [[library, version, kernel set]]. info: threadpool_info()'s list (a
    parameter for tests); numpy_dir: numpy's package directory (default: numpy's own).

    Only the BLAS loaded from numpy's own files (its package or the `numpy.libs` beside it, as its wheels ship
    OpenBLAS) counts: other libraries load theirs into the process too (numba imports scipy, whose wheel brings
    another OpenBLAS), in an order that differs between runs, and a key that changed with them would measure the
    same machine again. A numpy linked to a BLAS outside its own files (a distribution's or conda's) has none of
    them: then every BLAS loaded counts, sorted."""
    info = threadpool_info() if info is None else info
    root = Path(numpy_dir or os.path.dirname(np.__file__)).resolve()
    own = (root, root.with_name(root.name + ".libs"))
    blas = [i for i in info if i.get("user_api") == "blas"]
    mine = [i for i in blas if any(Path(i.get("filepath") or "/").resolve().is_relative_to(d) for d in own)]
    return sorted(([i.get("internal_api"), i.get("version"), i.get("architecture")] for i in (mine or blas)), key=str)


def machine_key(role, candidates, shapes, threads, partner=None, rows=None):
    """The cache key of a choice (module docstring): a JSON string. Each candidate is named with its code's version
    (registry.Kernel.version), so that a kernel made faster or slower is measured again. partner: None, or the
    [kernel/version, threads, shapes] of the model the candidates were timed in rounds with (model_shapes).
    rows: the row counts timed (default ROLE_ROWS[role]): a choice for 3-row verifies is not one for 5."""
    rows = ROLE_ROWS[role] if rows is None else rows
    return json.dumps({"probe": PROBE_VERSION, "cpu": cpu_model(), "blas": blas_key(), "numpy": np.__version__,
                       "role": role,
                       "candidates": [f"{c}/{REGISTRY[c].version}" for c in candidates],
                       "shapes": [list(s) for s in shapes], "rows": list(rows), "threads": threads,
                       "partner": partner}, sort_keys=True)


def model_shapes(model):  # Model -> [n_layer, n_embd, n_head, n_vocab]
    """The shapes a model's forward time depends on, as machine_key names them."""
    c = model.config
    return [c.n_layer, c.n_embd, c.n_head, c.n_vocab]


def partner_key(partner):  # Model or None -> [kernel/version, threads, [shapes]] or None
    """How machine_key names the partner a role was timed beside (None: timed alone)."""
    if partner is None:
        return None
    return [f"{partner.kernel}/{REGISTRY[partner.kernel].version}", partner.threads, model_shapes(partner)]


def time_forwards(name, threads, model, rows, repeats=REPEATS, clock=time.perf_counter, partner=None):
    """Seconds of one decoding forward of `rows` tokens by `model` (a Model already decoding with kernel `name` and
    `threads`) after a PROBE_CONTEXT-token prefill (both cut to fit the model's n_ctx): the median of `repeats`
    (after one untimed forward).

    partner: None, or a Model (a draft, decoding with its own kernel) timed with it in rounds (module docstring):
    it prefills the same context, and each timed span is `rows - 1` one-token forwards of the partner, then the
    model's forward; both caches are rolled back after it. The partner's context is cut to its own n_ctx too.

    One prefill, on ONE BLAS thread, then the forwards back to back, the cache rolled back to the context after each,
    as a decoding runs them. A threaded BLAS call leaves OpenBLAS's threads spinning for a while after it (about
    0.1 s here), on the cores the next forward's threads need, and the probe times no more than that:
      * a prefill before every timed forward made an AMD Zen 4 time "compiled-panels" at 25.4 ms for a distilgpt2
        forward at two threads against 14.5 at one, where its forwards back to back took 11.4-11.9 ms at two and
        13.6-14.3 at one (bench/results/issue24/README.md);
      * one prefill at two BLAS threads, on an Intel Sapphire Rapids, made the next four distilgpt2 forwards at two
        threads take 26-43 ms, and the rest 15-16 ms; the median of five then kept the draft on one thread (22-25 ms),
        and issue 24's command ran its draft at 27 ms a forward (bench/results/issue24/README.md, section `intel3/`).
    A decoding pays that once, after its prompt's prefill; the probe would pay it in every timing.

    Whole forwards, not the products alone: on a block or two of matrices (tens of MB, near an L3's size) the compiled
    kernel's one-row product timed faster than a GEMV that the same 3 GB model's forwards showed slower
    (bench/results/issue24/README.md), so only what a forward does is timed.
    """
    rows = min(rows, model.config.n_ctx)  # a model with a tiny context: what fits of it
    context = min(PROBE_CONTEXT, model.config.n_ctx - rows)
    ids = np.arange(context + rows) % model.config.n_vocab
    cache, times = model.new_cache(), []
    if context:
        model.prefill(ids[:context], cache, threads=1)  # on one BLAS thread: none left spinning (docstring)
    draft = None if partner is None else partner_round(partner, context, rows - 1)
    for i in range(repeats + 1):
        start = clock()
        if draft is not None:
            draft()
        model.forward(ids[context:], cache)
        if i:
            times.append(clock() - start)
        cache.rollback(context)
    return float(np.median(times))


def partner_round(partner, context, steps):  # Model, ints -> a callable, called once per timed span
    """The partner's part of a round (time_forwards): a callable running `steps` one-token forwards of `partner`
    after its prefilled `context` tokens, then rolling its cache back to them; both cut to fit its n_ctx."""
    steps = min(steps, partner.config.n_ctx)
    context = min(context, partner.config.n_ctx - steps)
    ids = np.arange(context + steps) % partner.config.n_vocab
    cache = partner.new_cache()
    if context:
        partner.prefill(ids[:context], cache, threads=1)  # as time_forwards' own

    def run():
        for i in range(context, context + steps):
            partner.forward(ids[i : i + 1], cache)
        cache.rollback(context)
    return run


class Choice(NamedTuple):
    """A role's kernel (a name of npspec.kernels.registry) and the threads its forwards use (a positive int)."""

    kernel: str
    threads: int


def thread_options(threads):
    """The thread counts a candidate is timed at: the count asked for, then one (module docstring), each once."""
    return tuple(dict.fromkeys((threads, 1)))


def measure_all(choices, model, rows, measure=time_forwards, partner=None, note=None):
    """{Choice: seconds} for each of `choices`: the mean of its two passes' timings, each the sum over `rows` of
    measure(name, threads, candidate model, m) -> seconds, also given partner=`partner` (time_forwards: None times
    the candidate alone).

    Two passes, the second in the reverse order (A B C, then C B A), so that every candidate's mean sits at
    the same time of the probe on average: a machine whose speed drifts linearly while the probe runs moves every
    candidate's mean alike, and the first candidate timed no longer pays alone for what the process did before it
    (converting or loading weights). Timed in one pass on an Intel Sapphire Rapids, issue 24's target picked
    "compiled-panels" in one fresh cache and "gemm-blocks" in another (their rounds 0.1% apart), and its command then
    ran at 1.43x and at 1.05x (bench/results/issue24/README.md, section `intel/`).
    Each choice's Model (model.with_kernel: the same weights) is built just before its timings and dropped
    after them, so that at most one compiled kernel's packed copy of the weights (npspec.kernels.compiled) exists at a time:
    for gpt2-xl's 6 GB, a second would be another 6 GB. A candidate that cannot be built here (KernelUnavailable: a
    numba that does not import) is left out, and `note` (None or a callable) is told why, once; `note` also hears a
    compiled kernel's compile time, the first build of it in this process being here."""
    choices = list(choices)
    timings, unavailable = {c: [] for c in choices}, set()
    for order in (choices, choices[::-1]):
        for c in order:
            if c.kernel in unavailable:
                continue
            try:
                built = model.with_kernel(c.kernel, c.threads, note=note)  # a compile says so (npspec.compiled)
            except KernelUnavailable as e:
                unavailable.add(c.kernel)
                say(note, f"{e}; the probe goes on without it")
                continue
            timings[c].append(sum(measure(c.kernel, c.threads, built, m, partner=partner) for m in rows))
            del built
    return {c: sum(t) / len(t) for c, t in timings.items() if t}  # in choices' order: ties keep the earlier one


def choose(role, model, threads, path=None, mode="cached", measure=time_forwards, candidates=None, note=None,
           partner=None, rows=None):
    """The Choice (kernel, threads) `role` ("target" or "draft") decodes `model` (an npspec.model.model.Model) with, when
    `threads` are asked for: the fastest candidate kernel at `threads` or at one thread (thread_options).

    path: the cache file (None: nothing cached, as "bypass"). mode: one of MODES (module docstring).
    measure: time_forwards' signature (a parameter so that tests can fake the timings: then no forward runs and no
    clock is read). candidates: default registry.role_candidates(role). note: None, or a function given one line
    when a measurement runs, and when its result waits for or cannot be stored (store_choice). partner: None, or the
    Model timed in rounds with each candidate (time_forwards: the draft beside a target), decoding with its own
    kernel, which the cache key names. rows: the row counts of the
    role's forwards to time (a tuple of positive ints; default ROLE_ROWS[role]): a target verifying gamma drafts
    multiplies gamma + 1 rows, and which kernel is fastest can change with them (bench/results/issue24/README.md:
    gemm-blocks pays a few-row GEMM's price from 2 rows). Raises ValueError for a bad role, mode or rows.
    """
    if mode not in MODES:
        raise ValueError(f"the kernel probe mode must be one of {', '.join(MODES)}, got {mode!r}")
    if role not in ROLE_ROWS:
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    rows = ROLE_ROWS[role] if rows is None else tuple(rows)
    if not rows or not all(type(m) is int and m > 0 for m in rows):
        raise ValueError(f"the rows to time must be positive ints, got {rows!r}")
    candidates = tuple(role_candidates(role) if candidates is None else candidates)
    choices = [Choice(k, t) for k in candidates for t in thread_options(threads)]  # ties: the earlier one
    if len(choices) == 1 or mode == "off":
        return choices[0]
    key = machine_key(role, candidates, [model_shapes(model)], threads, partner_key(partner), rows)

    def run():  # -> (Choice, its cache record)
        if note is not None:
            beside = "" if partner is None else f" beside its draft ({partner.kernel})"
            counts = " and ".join(map(str, thread_options(threads)))
            note(f"timing the {role}'s kernels {', '.join(candidates)} at {counts} thread(s), "
                 f"{'/'.join(map(str, rows))}-row forwards{beside}, on this machine (once; --kernel-probe refresh "
                 "times them again)")
        seconds = measure_all(choices, model, rows, measure, partner, note)
        if not seconds:
            raise KernelUnavailable(f"none of the {role}'s kernels {', '.join(candidates)} can be built here")
        best = min(seconds, key=lambda choice: seconds[choice])  # choices order: ties keep the earlier one
        timed = [{"kernel": k, "threads": t, "seconds": v} for (k, t), v in seconds.items()]
        return best, {"kernel": best.kernel, "threads": best.threads, "rows": list(rows), "seconds": timed}
    return probed(path, mode, key, lambda record: hit if (hit := cached_choice(record)) in choices else None, run, note)


def probed(path, mode, key, parse, run, note=None):
    """A measured value, through the cache file `path` as `mode` says (module docstring; "off" is the caller's):
    parse(the record cached under `key`) when that is not None and mode is "cached", else run() -> (value, record),
    its record stored under `key` unless mode is "bypass" or path is None. The measurement holds probe_lock, and
    reads the cache again once it has it: another process may have stored the value while this one waited."""
    use_cache = path is not None and mode != "bypass"
    if use_cache and mode == "cached" and (hit := parse(read_choices(path).get(key))) is not None:
        return hit
    with probe_lock(path, note) if use_cache else contextlib.nullcontext():
        if use_cache and mode == "cached" and (hit := parse(read_choices(path).get(key))) is not None:
            return hit
        value, record = run()
        if use_cache:
            store_choice(path, key, record, note)
    return value


def time_prefill(model, length, by_kernel, repeats=PREFILL_REPEATS, clock=time.perf_counter, sleep=time.sleep,
                 after=PREFILL_AFTER):
    """Seconds a decoding by `model` (a Model) takes to start: a prefill of `length` ids into a fresh cache, then
    `after` one-token forwards (cut to fit its n_ctx), the median of `repeats`, each after sleep(PAUSE).

    by_kernel: the prefill runs as a decoding forward (model.with_prefill_rows(length)), else as the GEMM at the
    model's threads (prefill_rows 0). The forwards after it count because a threaded BLAS call leaves OpenBLAS's
    threads spinning for a while (about 0.1 s on an Intel Sapphire Rapids: time_forwards) on the cores a compiled
    kernel's threads need next. The pause lets the previous timing's threads fall asleep first."""
    subject = model.with_prefill_rows(length if by_kernel else 0)
    after = max(0, min(after, model.config.n_ctx - length))
    ids = np.arange(length + after) % model.config.n_vocab
    times = []
    for _ in range(repeats):
        sleep(PAUSE)
        cache = subject.new_cache()
        start = clock()
        subject.prefill(ids[:length], cache)
        for i in range(length, length + after):
            subject.forward(ids[i : i + 1], cache)
        times.append(clock() - start)
    return float(np.median(times))


def prefill_crossover(model, lengths=PREFILL_LENGTHS, measure=time_prefill):  # -> (int, {length: [s, s]})
    """(the longest of `lengths` whose prompt `model` starts faster by its kernel than by the GEMM, else 0;
    {length: [seconds by the kernel, seconds by the GEMM]} for each length timed).

    Lengths are tried longest first (cut to those under the model's n_ctx), and the first that the kernel wins ends
    the search: a decoding kernel reads every weight once per 16 rows or so, so its prefill grows with the prompt
    faster than a GEMM's, and where it wins at a length it wins at every shorter one (the assumption this rests on;
    no BLAS property is written down). measure: time_prefill's signature (model, length, by_kernel) -> seconds, a
    parameter so that tests can fake the timings."""
    timed = {}
    for n in fitting(lengths, model.config.n_ctx):
        timed[n] = [measure(model, n, True), measure(model, n, False)]
        if timed[n][0] < timed[n][1]:
            return n, timed
    return 0, timed


def fitting(lengths, n_ctx):  # -> [int], longest first
    """The prompt lengths prefill_crossover tries, in its order: each of `lengths` under `n_ctx` once, longest first."""
    return sorted({n for n in lengths if n < n_ctx}, reverse=True)


def choose_prefill(model, path=None, mode="cached", measure=time_prefill, note=None, lengths=PREFILL_LENGTHS):
    """The prefill_rows `model` (a Model, with the kernel and threads it decodes with) starts a decoding fastest
    with: prefill_crossover's length, measured on this machine and cached in `path` as `mode` says (module
    docstring; "off": 0, every prefill a GEMM, as before npspec measured it), keyed by the kernel, its threads and
    the model's shapes. note: None, or a function given one line when it measures. Raises ValueError for a bad
    mode."""
    if mode not in MODES:
        raise ValueError(f"the kernel probe mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return 0
    lengths = tuple(lengths)
    key = machine_key("prefill", [model.kernel], [model_shapes(model)], model.threads, rows=lengths)

    def run():  # -> (rows, its cache record)
        fits = fitting(lengths, model.config.n_ctx)
        say(note, f"timing prompts of {'/'.join(map(str, fits))} ids prefilled by {model.kernel} and by the GEMM, "
                  "on this machine (once; --kernel-probe refresh times them again)")
        rows, timed = prefill_crossover(model, lengths, measure)
        return rows, {"prefill_rows": rows, "seconds": {str(n): {"kernel": k, "gemm": g} for n, (k, g) in timed.items()}}
    return probed(path, mode, key, cached_prefill_rows, run, note)


def cached_prefill_rows(record):  # a cache record -> int, or None if it is not a well-formed one
    """The prefill_rows a cached record names: an int >= 0 (not a bool), else None (measured again)."""
    rows = record.get("prefill_rows") if isinstance(record, dict) else None
    return rows if type(rows) is int and rows >= 0 else None


@contextlib.contextmanager
def probe_lock(path, note=None):
    """Hold the probe's lock (`.locks/probe.lock` beside the cache file `path`) while this process times kernels, so
    that two npspec processes probing at once do not time each other's forwards on the same cores. If another holds
    it, say so through `note` and wait up to PROBE_LOCK_SECONDS, then time anyway (saying so). Where no lock file can
    be made (a read-only cache directory), time without it."""
    lock = Path(path).parent / ".locks" / "probe.lock"
    with contextlib.ExitStack() as hold:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            if not hold.enter_context(locked(lock, blocking=False)):
                say(note, "another npspec is timing kernels on this machine: waiting for it, so that the two probes do "
                          f"not time each other (lock file {lock}, up to {PROBE_LOCK_SECONDS} s)")
                hold.enter_context(locked(lock, timeout=PROBE_LOCK_SECONDS))
        except Timeout:
            say(note, f"{lock} is still held after {PROBE_LOCK_SECONDS} s: timing anyway (the other process's forwards "
                      "may slow these; --kernel-probe refresh times them again later)")
        except OSError:  # no lock file can be made here: time without one
            pass
        yield


def cached_choice(record):  # a cache record -> Choice, or None if it is not a well-formed one
    """The Choice a cached record names: an object with a kernel name and a thread count that is an int (not a
    bool, whose True equals 1, nor a float), else None (measured again: a hand-edited or damaged record)."""
    if not isinstance(record, dict) or not isinstance(record.get("kernel"), str):
        return None
    threads = record.get("threads")
    return Choice(record["kernel"], threads) if type(threads) is int else None


def read_choices(path):
    """The cached choices {key: record} in `path`; {} (then measured again) if it is missing, is not a regular file
    (a FIFO would block the read, a device might never end), holds more than MAX_CACHE_BYTES, or is not a JSON
    object (unreadable, damaged, nested too deep for the parser)."""
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


def store_choice(path, key, record, note=None):
    """Add `record` under `key` to the cache file `path`: under its filelock, the whole file rewritten to a temporary
    file and renamed over it (npspec.sources.atomic.atomic_write: only a regular file is replaced; the temporary files of a
    store killed mid-write are deleted first). A cache that cannot be
    written (read-only, a symlink or directory in its place, a lock held past LOCK_SECONDS) is skipped: the choice
    is measured again next run. note: None, or called with one line when another process holds the lock (before
    waiting for it) and when the cache is skipped (why, and the fix). Returns whether it was stored."""
    path = Path(path)
    lock = path.parent / ".locks" / f"{path.name}.lock"  # beside the cache's other lock files

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as hold:
            if not hold.enter_context(locked(lock, blocking=False)):
                say(note, f"another process is writing the kernel choices: waiting for it (lock file {lock}, up to "
                          f"{LOCK_SECONDS} s)")
                hold.enter_context(locked(lock, timeout=LOCK_SECONDS))
            remove_leftovers(path)  # a store killed mid-write (SIGKILL) left its temporary file: no write runs now
            data = read_choices(path)
            data[key] = record
            atomic_write(path, write)
    except Timeout:
        say(note, f"the kernel choice was not stored: another process still holds {lock} after {LOCK_SECONDS} s "
                  "(it is measured again next run; if no npspec is running, delete that lock file)")
        return False
    except NotRegularFile as e:  # its message's first clause names what is there; its advice is for output files
        say(note, f"the kernel choice was not stored: {str(e).split(';')[0]}; it is measured again next run; move that "
                  "away, set NPSPEC_CACHE to another directory, or pass --kernel-probe bypass")
        return False
    except OSError as e:
        say(note, f"the kernel choice was not stored in {path} ({e.strerror or e}): it is measured again next run; "
                  "make the cache directory writable, set NPSPEC_CACHE to one that is, or pass --kernel-probe bypass")
        return False
    return True


def say(note, line):  # note (None or a callable) gets `line`
    if note is not None:
        note(line)
