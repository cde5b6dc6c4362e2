"""The kernel probe: `choose_kernels(target, draft, threads, store, mode)`, each role's kernel, threads and prefill
length in one call. It times a role's buildable candidates (registry.role_candidates; unbuildable ones dropped once,
first) at the threads asked for and at one, in the model's own forwards on its loaded weights (Model.trial): the
draft alone at one row, its fastest per thread pool, then the target at its verify rows, each candidate beside the
draft's fastest on its own pool (time_forwards), so both roles run on one kind of thread. Two passes each, a third
where they disagree (measure_passes). The winners are built once (Model.with_kernel), then their prefill lengths
timed (choose_prefill). `store` keeps the records (a Store: npspec.sources.choices.ChoiceFile); `mode`, one of MODES:
"cached" (stored, else measured and stored), "refresh", "bypass" (nothing stored), "off" (the first candidate, GEMM
prefills, nothing measured). Notes go to this module's logger. Pure of files: imports numpy and npspec.kernels.
"""

import contextlib
import logging
import time
from typing import ContextManager, NamedTuple, Protocol

import numpy as np

from .compiled import KernelUnavailable
from .compiled.quant import QuantPanels
from .layout import block_linears
from .registry import REGISTRY, ROLES, kernel as registry_kernel, role_candidates

log = logging.getLogger(__name__)

MODES = ("cached", "refresh", "bypass", "off")
ROLE_ROWS = {"target": (4,), "draft": (1,)}  # rows timed when not told: gamma + 1 at gamma 3; a draft's one
AGREE = 1.25  # a candidate whose two passes differ more than this many times is timed a third time (measure_passes)
REPEATS = 5  # the median of this many timed forwards per (kernel, rows), after one untimed (the first use compiles)
PROBE_CONTEXT = 8  # cached tokens before a timed forward (time_forwards)
PREFILL_LENGTHS = (32, 8, 2)  # the prompt lengths choose_prefill times, longest first (each a quarter of the last)
PREFILL_AFTER = 3  # the one-token forwards timed after each prefill (time_prefill)
PREFILL_REPEATS = 3  # time_prefill's median of this many
PAUSE = 0.2  # seconds before each timed prefill: the previous one's BLAS threads fall asleep (time_prefill)


class Choice(NamedTuple):
    """A candidate: a kernel (a name of npspec.kernels.registry) and the threads its forwards use (an int >= 1)."""

    kernel: str
    threads: int


class KernelChoice(NamedTuple):
    """A role's choice: kernel, threads, prefill_rows (an int >= 0), and the model decoding so."""

    kernel: str
    threads: int
    prefill_rows: int
    model: object


class KernelChoices(NamedTuple):
    """choose_kernels' answer: each role's KernelChoice, None for a role without a model."""

    target: KernelChoice | None
    draft: KernelChoice | None


class Store(Protocol):
    """Where measured records are kept, keyed by `what` (a dict: role, candidates, shapes, threads, partner, rows)."""

    def choice(self, what: dict) -> tuple[str, int] | None: ...  # a well-formed stored (kernel, threads), else None

    def prefill_rows(self, what: dict) -> int | None: ...  # a well-formed stored prefill length, else None

    def keep(self, what: dict, record: dict) -> bool: ...  # store `record` under `what`; False if it could not

    def probing(self) -> ContextManager: ...  # held while this process times (another's probe waits for it)


class Decoder(Protocol):
    """What the probe asks of a model (npspec.model.model.Model)."""

    config: object  # n_ctx, n_vocab, n_layer, n_embd, n_head
    kernel: str
    threads: int
    prefill_rows: int
    codes: type | None  # the class of int codes it holds, or None (registry.role_candidates)

    def new_cache(self): ...

    def forward(self, ids, cache): ...

    def prefill(self, ids, cache, threads=None): ...

    def trial(self, kernel: str, threads: int) -> "Decoder": ...  # the same weights, kernel built, no new Model

    def with_kernel(self, kernel: str, threads: int) -> "Decoder": ...  # a new Model (a build)

    def with_prefill_rows(self, rows: int) -> "Decoder": ...  # the same built kernel


def choose_kernels(target, draft, threads, store=None, mode="cached", rows=None, roles=ROLES, measure=None,
                   measure_prefill=None, candidates=None):  # -> KernelChoices
    """KernelChoices for `target` and `draft` (Decoders or None) at `threads` asked for (module docstring); a role
    not in `roles` keeps its model, a fixed target keeps the draft to its pool. store: a Store or None. rows: the
    target's verify rows (default ROLE_ROWS["target"]); measure, measure_prefill: time_forwards' and time_prefill's
    signatures; candidates: {role: names}. Raises ValueError for a bad mode, role or rows, KernelUnavailable when no
    candidate of a role builds."""
    check_mode(mode)
    if unknown := set(roles) - set(ROLES):
        raise ValueError(f"roles must be among 'target' and 'draft', got {sorted(unknown)!r}")
    candidates = candidates or {}
    measure, measure_prefill = measure or time_forwards, measure_prefill or time_prefill

    def kept(model):
        return None if model is None else KernelChoice(model.kernel, model.threads, model.prefill_rows, model)
    choosing = {role: model is not None and role in roles for role, model in (("target", target), ("draft", draft))}
    models = {"target": target, "draft": draft}
    names = {role: buildable(role, candidates.get(role) or role_candidates(role, getattr(models[role], "codes", None)),
                             mode) for role in ROLES if choosing[role]}
    wanted = None  # the thread pools the draft is timed on: its target's (Kernel.pool)
    if choosing["target"]:
        wanted = {REGISTRY[k].pool for k in names["target"]}
    elif target is not None:
        wanted = {REGISTRY[target.kernel].pool}
    drafts, timed = None, []  # {pool: the draft's Choice on it}, when the draft is chosen; timed: one per timing

    def timing(*args, **kwargs):
        timed.append(True)
        return measure(*args, **kwargs)
    if choosing["draft"]:
        drafts = {pool: choose("draft", draft, threads, store, mode, timing, group)
                  for pool, group in pools(names["draft"], wanted).items()}
    chosen_target = kept(target)
    if choosing["target"]:
        partner = draft
        if drafts is not None:
            beside = {pool: Beside(draft, choice) for pool, choice in drafts.items()}
            partner = {k: beside.get(REGISTRY[k].pool, next(iter(beside.values()))) for k in names["target"]}
        chosen = choose("target", target, threads, store, mode, measure, names["target"], partner, rows)
        chosen_target = built(target, chosen, store, mode, measure_prefill)
    if drafts is None:
        return KernelChoices(chosen_target, kept(draft))
    paired = pairs_with(drafts, None if target is None else chosen_target.kernel)
    if len(drafts) > 1 and timed:  # said when the draft was timed (as the timings' own notes are), not every run
        log.info(f"the draft decodes with {paired.kernel} at {paired.threads} thread(s): its fastest on the threads "
                 f"its target's {chosen_target.kernel} runs on ({REGISTRY[chosen_target.kernel].pool}; its fastest "
                 "per pool: " + ", ".join(f"{p} {c.kernel}@{c.threads}" for p, c in drafts.items()) + ")")
    return KernelChoices(chosen_target, built(draft, paired, store, mode, measure_prefill))


def pools(names, wanted=None):  # -> {pool: (name, ...)}, in the order names first meet each pool
    """`names` grouped by registry.Kernel.pool, only the groups on `wanted` pools (a set); all names as one group
    (keyed by the first's pool) when `wanted` is None or none is on them."""
    groups = {}
    for name in names:
        if wanted is not None and REGISTRY[name].pool in wanted:
            groups.setdefault(REGISTRY[name].pool, []).append(name)
    return {pool: tuple(group) for pool, group in groups.items()} or {REGISTRY[names[0]].pool: tuple(names)}


def pairs_with(drafts, kernel):  # {pool: Choice}, a kernel name or None -> Choice
    """The draft's Choice beside a target decoding with `kernel`: its fastest on that kernel's pool, else on the
    first pool timed."""
    pool = None if kernel is None else REGISTRY[kernel].pool
    return drafts.get(pool, next(iter(drafts.values())))


class Beside:
    """A partner Decoder: `model` decoding with `choice`, built (Model.trial) only when a timing first runs it;
    kernel, threads and config are known before (the store's key needs no build)."""

    def __init__(self, model, choice):
        self.kernel, self.threads, self.config = choice.kernel, choice.threads, model.config
        self.model, self.trial_ = model, None

    def __getattr__(self, name):  # new_cache, prefill, forward, ...: the built trial's
        if name.startswith("__") or name == "trial_":
            raise AttributeError(name)
        if self.trial_ is None:
            same = (self.model.kernel, self.model.threads) == (self.kernel, self.threads)
            self.trial_ = self.model if same else self.model.trial(self.kernel, self.threads)
        return getattr(self.trial_, name)


def built(model, chosen, store, mode, measure_prefill):  # -> KernelChoice
    """`model` built with the Choice `chosen` unless it decodes so, then choose_prefill on it."""
    model = model if chosen == (model.kernel, model.threads) else model.with_kernel(chosen.kernel, chosen.threads)
    prefill_rows = choose_prefill(model, store, mode, measure_prefill)
    model = model if prefill_rows == model.prefill_rows else model.with_prefill_rows(prefill_rows)
    return KernelChoice(chosen.kernel, chosen.threads, prefill_rows, model)


def check_mode(mode):
    """Raise ValueError, one line, unless `mode` is one of MODES."""
    if mode not in MODES:
        raise ValueError(f"the kernel probe mode must be one of {', '.join(MODES)}, got {mode!r}")


def choose(role, model, threads, store=None, mode="cached", measure=None, candidates=None, partner=None, rows=None):
    """The Choice `role` decodes `model` with: the fastest buildable candidate at `threads` or one (measure_all;
    ties keep the earlier), the stored one under "cached", the first under "off" or when alone. partner: None, a
    Decoder timed beside every candidate, or {kernel name: Decoder} one beside each. rows: positive ints (default
    ROLE_ROWS[role]). The record and a note give every candidate's passes and what counted. Raises as choose_kernels."""
    check_mode(mode)
    if role not in ROLE_ROWS:
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    rows = ROLE_ROWS[role] if rows is None else tuple(rows)
    if not rows or not all(type(m) is int and m > 0 for m in rows):
        raise ValueError(f"the rows to time must be positive ints, got {rows!r}")
    names = buildable(role, role_candidates(role, getattr(model, "codes", None)) if candidates is None else candidates,
                      mode)
    choices = [Choice(k, t) for k in names for t in thread_options(threads)]  # ties: the earlier one
    if len(choices) == 1 or mode == "off":
        return choices[0]
    what = {"role": role, "candidates": list(names), "shapes": [model_shapes(model)], "threads": threads,
            "partner": partner_key(partner), "rows": list(rows)}

    def run():  # -> (Choice, its record)
        log.info(f"timing the {role}'s kernels {', '.join(names)} at {' and '.join(map(str, thread_options(threads)))} "
                 f"thread(s), {'/'.join(map(str, rows))}-row forwards{beside_text(partner)}, on this machine (once; "
                 "--kernel-probe refresh times them again)")
        passes = measure_passes(choices, model, rows, measure or time_forwards, partner)
        seconds = {c: counted(p) for c, p in passes.items()}
        best = min(seconds, key=lambda choice: seconds[choice])  # choices' order: ties keep the earlier one
        log.info(why(role, best, seconds, passes))
        timed = [{"kernel": k, "threads": t, "seconds": seconds[(k, t)], "passes": passes[(k, t)]} for k, t in choices]
        return best, {"kernel": best.kernel, "threads": best.threads, "rows": list(rows), "seconds": timed}

    def stored(what):
        hit = store.choice(what)
        return Choice(*hit) if hit is not None and Choice(*hit) in choices else None
    return recalled(store, mode, what, stored, run)


def why(role, best, seconds, passes):  # -> one line: each candidate's ms, its passes when a third was taken
    """The note naming the choice and each candidate's counted ms (with its passes where they disagreed)."""
    def one(c):
        shown = f"{c.kernel}@{c.threads} {seconds[c] * 1e3:.1f}"
        return shown + (f" (passes {'/'.join(f'{s * 1e3:.1f}' for s in passes[c])}: the median)"
                        if len(passes[c]) > 2 else "")
    return (f"the {role}'s fastest of {', '.join(dict.fromkeys(c.kernel for c in seconds))} is {best.kernel} at "
            f"{best.threads} thread(s); ms per timed span (kernel@threads; the mean of two passes, or the median of three "
            f"where two differed over {AGREE}x): " + ", ".join(map(one, seconds)))


def buildable(role, names, mode):  # -> (str, ...)
    """`names` that build here (each once, at one thread), in order; one raising KernelUnavailable is dropped
    with a note. Raises KernelUnavailable if none builds."""
    dropped = []
    for name in names:
        try:
            registry_kernel(name).build(1)
        except KernelUnavailable as e:
            dropped.append(name)
            left = [n for n in names if n not in dropped]
            if not left:
                raise KernelUnavailable(f"none of the {role}'s kernels {', '.join(names)} can be built here ({e})") \
                    from None
            log.info(f"{e}; " + (f"the {role} decodes with one of {', '.join(left)}" if mode == "off" else
                                 "the probe goes on without it"))
    return tuple(n for n in names if n not in dropped)


def thread_options(threads):
    """The thread counts a candidate is timed at: the count asked for, then one, each once."""
    return tuple(dict.fromkeys((threads, 1)))


def measure_all(choices, model, rows, measure=None, partner=None):  # -> {Choice: seconds}: measure_passes, counted
    return {c: counted(p) for c, p in measure_passes(choices, model, rows, measure, partner).items()}


def measure_passes(choices, model, rows, measure=None, partner=None):  # -> {Choice: [seconds per pass]}
    """Two passes over `choices`, the second reversed (a linear drift moves every mean alike), then a third for each
    choice whose two differ more than AGREE times (a one-off slow pass: a first call, another process). A pass sums
    over `rows` measure(kernel, threads, model.trial(...), m, partner=its partner (choose)); a trial is dropped after
    its timing (at most one compiled kernel's packed weights at a time)."""
    measure = measure or time_forwards
    passes = {c: [] for c in choices}

    def once(c):
        trial = model.trial(c.kernel, c.threads)
        beside = partner.get(c.kernel) if isinstance(partner, dict) else partner
        passes[c].append(sum(measure(c.kernel, c.threads, trial, m, partner=beside) for m in rows))
    for order in (choices, choices[::-1]):
        for c in order:
            once(c)
    for c in choices:
        if max(passes[c]) > AGREE * min(passes[c]):
            once(c)
    return passes


def counted(passes):  # [seconds, seconds] or three -> seconds
    """What a candidate's passes count for: the mean of two, the median of three (one slow pass left out)."""
    return sum(passes) / 2 if len(passes) == 2 else float(np.median(passes))


def time_forwards(name, threads, model, rows, repeats=REPEATS, clock=time.perf_counter, partner=None):
    """Seconds of one `rows`-row forward of `model` (decoding with `name` at `threads`) after a PROBE_CONTEXT
    prefill on one BLAS thread (none left spinning), both cut to n_ctx: the median of `repeats` back to back, after one
    untimed, the cache rolled back each time. partner: None, or a Decoder whose `rows - 1` one-token forwards run first
    in each timed span, as a round alternates them (partner_round). Whole forwards: products alone rank otherwise."""
    rows = min(rows, model.config.n_ctx)  # a model with a tiny context: what fits of it
    context = min(PROBE_CONTEXT, model.config.n_ctx - rows)
    ids = np.arange(context + rows) % model.config.n_vocab
    cache, times = model.new_cache(), []
    if context:
        model.prefill(ids[:context], cache, threads=1)
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


def beside_text(partner):  # -> "" or " beside its draft (...)", for the timing's note
    if partner is None:
        return ""
    if isinstance(partner, dict):
        return " beside its draft on each one's threads (" + ", ".join(f"{p.kernel} at {p.threads} for {k}"
                                                                        for k, p in partner.items()) + ")"
    return f" beside its draft ({partner.kernel})"


def partner_round(partner, context, steps):  # Decoder, ints -> a callable, called once per timed span
    """A callable running the partner's `steps` one-token forwards after its prefilled `context`, then
    rolling back; both cut to its n_ctx."""
    steps = min(steps, partner.config.n_ctx)
    context = min(context, partner.config.n_ctx - steps)
    ids = np.arange(context + steps) % partner.config.n_vocab
    cache = partner.new_cache()
    if context:
        partner.prefill(ids[:context], cache, threads=1)

    def run():
        for i in range(context, context + steps):
            partner.forward(ids[i : i + 1], cache)
        cache.rollback(context)
    return run


def choose_prefill(model, store=None, mode="cached", measure=None, lengths=PREFILL_LENGTHS):  # -> int
    """The prefill_rows `model` (decoding with its chosen kernel) starts fastest with (prefill_crossover),
    kept in `store` as `mode` says; 0 under "off". Raises ValueError for a bad mode."""
    check_mode(mode)
    if mode == "off":
        return 0
    lengths = tuple(lengths)
    what = {"role": "prefill", "candidates": [model.kernel], "shapes": [model_shapes(model)], "threads": model.threads,
            "partner": None, "rows": list(lengths)}

    def run():  # -> (rows, its record)
        fits = fitting(lengths, model.config.n_ctx)
        log.info(f"timing prompts of {'/'.join(map(str, fits))} ids prefilled by {model.kernel} and by the GEMM for "
                 f"the {model.config.n_layer}-layer model, on this machine (once; --kernel-probe refresh times them "
                 "again)")
        rows, timed = prefill_crossover(model, lengths, measure or time_prefill)
        seconds = {str(n): {"kernel": k, "gemm": g} for n, (k, g) in timed.items()}
        return rows, {"prefill_rows": rows, "seconds": seconds}
    return recalled(store, mode, what, lambda what: store.prefill_rows(what), run)


def time_prefill(model, length, by_kernel, repeats=PREFILL_REPEATS, clock=time.perf_counter, sleep=time.sleep,
                 after=PREFILL_AFTER):
    """Seconds a decoding by `model` takes to start: a `length`-id prefill by its kernel (`by_kernel`) or the
    GEMM, then `after` one-token forwards (cut to n_ctx: a threaded GEMM leaves BLAS threads spinning on the cores the
    kernel needs); the median of `repeats`, each after sleep(PAUSE)."""
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


def prefill_crossover(model, lengths=PREFILL_LENGTHS, measure=None):  # -> (int, {length: [s, s]})
    """(the longest of `lengths` (fitting) `model` starts faster by its kernel than by the GEMM, else 0;
    {length: [kernel s, GEMM s]} timed). The first win ends the search, longest first: a kernel's prefill grows faster
    than a GEMM's, so it wins at every shorter length too (the assumption). measure: time_prefill's signature."""
    measure = measure or time_prefill
    timed = {}
    for n in fitting(lengths, model.config.n_ctx):
        timed[n] = [measure(model, n, True), measure(model, n, False)]
        if timed[n][0] < timed[n][1]:
            return n, timed
    return 0, timed


def fitting(lengths, n_ctx):  # -> [int], longest first
    """The prompt lengths prefill_crossover tries, in its order: each of `lengths` under `n_ctx` once, longest first."""
    return sorted({n for n in lengths if n < n_ctx}, reverse=True)


def recalled(store, mode, what, stored, run):  # -> a value
    """stored(what) under "cached" if not None, else run() -> (value, record), the record kept unless "bypass"
    or no store; the timing holds store.probing() and looks again once it has it."""
    use = store is not None and mode != "bypass"
    if use and mode == "cached" and (hit := stored(what)) is not None:
        return hit
    with store.probing() if use else contextlib.nullcontext():
        if use and mode == "cached" and (hit := stored(what)) is not None:
            return hit
        value, record = run()
        if use:
            store.keep(what, record)
    return value


def model_shapes(model):  # Decoder -> [n_layer, n_embd, n_head, n_vocab(, codes)]: what its forward time depends on
    c = model.config
    return [c.n_layer, c.n_embd, c.n_head, c.n_vocab, *codes_key(model)]


def codes_key(model):  # Decoder -> [] for float32 matrices, ["int4-g64"]-like for int codes (their bits and group)
    """How a model's block matrices hold int codes (QuantPanels' `nibbles` and `group`): int8 and int4 models of
    one shape read different bytes, so they are timed apart. [] for float32 weights or a Decoder without params
    (read from the instance, so a Beside partner is not built to answer)."""
    held = getattr(model, "__dict__", {})
    if "params" not in held and "model" in held:  # a Beside: the draft model it builds from
        return codes_key(held["model"])
    params = held.get("params")
    for w in (lin["w"] for lin in block_linears(params if isinstance(params, dict) and "h" in params else {"h": []})):
        if isinstance(w, QuantPanels):
            return [f"int{4 if w.nibbles else 8}-g{w.group}"]
        return []
    return []


def partner_key(partner):  # Decoder, {kernel: Decoder} or None -> [kernel/version, threads, [shapes]], a dict of them
    if partner is None:  # or None: a key's partner
        return None
    if isinstance(partner, dict):
        return {k: partner_key(p) for k, p in partner.items()}
    return [f"{partner.kernel}/{REGISTRY[partner.kernel].version}", partner.threads, model_shapes(partner)]
