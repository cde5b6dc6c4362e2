"""The command line's measurements around a generation, kept out of the command itself: --compare (plain decoding
with the same prompt, options and seed, timed with the target's kernel and threads and every plain baseline of
npspec.kernels.registry, in turn with the speculative decoding --compare-repeats times) and
--simulate-acceptance (a SIMULATION: the draft model's proposals steered by
npspec.decode.drafters.ControlledDraft). Notes go to the "npspec.cli.harness" logger. Imports numpy,
npspec.kernels.registry and npspec.decode.
"""

import logging
from dataclasses import replace
from statistics import median

import numpy as np

from ..decode import GenerationInterrupted, Options, SamplingParams, decode
from ..decode.drafters import ControlledDraft, ModelDrafter
from ..sources.progress import bar
from ..kernels.registry import plain_baselines

log = logging.getLogger(__name__)


def plain_job(job, target, rng):
    """The Job decoding job's prompt with `target` alone (gamma 0, the target's own context), drawing from rng."""
    return replace(job, target=target, drafter=None, options=replace(job.options, gamma=0), n_ctx=target.config.n_ctx,
                   rng=rng)


def plain_models(job, threads):  # -> {label: Model}
    """The models --compare decodes the job's prompt plainly with, keyed by plain_label: the target with its own
    kernel and threads first, then each kernel of npspec.kernels.registry.plain_baselines (the compiled one when installed,
    BLAS's) at the `threads` asked for, through Model.with_kernel."""
    target = job.target
    models = {plain_label(target, threads): target}
    for kernel in plain_baselines(target.kernel):
        models.setdefault(kernel, target.with_kernel(kernel, threads))
    return models


def decode_plain(job, model, seed, label, progress=None):  # -> Generation
    """One plain decoding of the job's prompt with its options by `model`, drawing from a fresh generator seeded with
    `seed`, with a bar (from `progress`, a factory, or None) named after `label`. Raises GenerationInterrupted on
    Ctrl-C."""
    with bar(progress, f"--compare: plain decoding, {label}", job.options.max_new_tokens, "tok") as b:
        return decode(plain_job(job, model, np.random.default_rng(seed)),
                      on_emit=lambda new_ids, n: b.update(len(new_ids)))


def compare_repeated(job, first, again, seed, threads, repeats, progress=None):  # -> ([Gen], {label: [Gen]}, bool)
    """--compare, `repeats` times in turn (--compare-repeats): a speculative decoding, then one plain decoding of the
    prompt with each of plain_models(job, threads), the target's own kernel last, each drawing from a generator
    seeded with `seed`.
    Each speculative run sits next to the plain runs it is divided by, so a memory rate that drifts over a minute (a
    virtual machine's host) moves both sides of a repeat's ratio alike (bench/results/issue24/README.md: one command
    gave 1.04x to 1.61x on one machine, its decodings run once each).

    job: the speculative Job already decoded, giving `first` (the first repeat's Generation); again(): a Job that
    decodes as `job` did (a fresh drafter and random stream: npspec.cli.generate.rerun), called for each later repeat.
    progress: a bar factory (npspec.sources.progress) for each run, or None. Returns the speculative
    Generations and {label: the plain Generations} of the repeats that finished, in order, and whether all `repeats`
    did: Ctrl-C (GenerationInterrupted) during a repeat drops that repeat's runs and keeps the finished ones ({} for
    the plain runs when none finished).
    """
    models = plain_models(job, threads)
    specs, plain = [], {label: [] for label in models}
    own, *others = models  # the target's own kernel runs last, so that each later speculative run follows a decoding
    # with it, as the first follows --simulate-acceptance's greedy reference: a run right after a BLAS-threaded one
    # shares the cores with BLAS's spinning threads (npspec.kernels.blas)
    try:
        for r in range(repeats):
            spec = first
            if r:
                rerun = again()
                with bar(progress, f"--compare: speculative decoding, run {r + 1} of {repeats}",
                         rerun.options.max_new_tokens, "tok") as b:
                    spec = decode(rerun, on_emit=lambda new_ids, n: b.update(len(new_ids)))
            runs = {label: decode_plain(job, models[label], seed, label, progress) for label in [*others, own]}
            specs.append(spec)
            for label, run in runs.items():
                plain[label].append(run)
    except GenerationInterrupted:
        return specs or [first], plain if specs else {}, False
    return specs, plain, True


def plain_label(model, threads):
    """The name of a plain decoding by `model` when `threads` were asked for: its kernel's name, with its thread
    count when it differs (the kernel probe may run a role at one thread: npspec.kernels.probe)."""
    if model.threads == threads:
        return model.kernel
    return f"{model.kernel} at {model.threads} thread{'' if model.threads == 1 else 's'}"


def comparison(specs, plain, greedy):
    """The speculative Generations `specs` (one per repeat of compare_repeated) against plain decoding: {label:
    [Generation]}, one per repeat, the target's own first (plain_models).

    Each speed is the median over the repeats (`tokens_per_s_by_repeat` keeps every run's). `plain_kernel` is the
    kernel with the fastest median, and `speedup` the median over repeats of the speculative run's tokens/s over that
    kernel's run in the same repeat (`speedups`, one per repeat; with one repeat, the two speeds' ratio). `same_ids`
    (greedy only): every speculative run gave the ids of every plain run on the target's own kernel, whose bits the
    speculative rounds reproduce. With temperature > 0 the two decodings use the random stream differently, so their
    ids differ by design.
    """
    rates = {k: [g.stats.tokens_per_s for g in runs] for k, runs in plain.items()}
    best = max(rates, key=lambda k: median(rates[k]))
    speedups = [s.stats.tokens_per_s / p if p > 0 else float("nan") for s, p in zip(specs, rates[best])]
    own = plain[next(iter(plain))]
    return {"speculative_tokens_per_s": median(g.stats.tokens_per_s for g in specs),
            "plain_tokens_per_s": median(rates[best]), "plain_kernel": best, "speedup": median(speedups),
            "plain_seconds": median(g.stats.seconds for g in plain[best]),
            "plain_by_kernel_tokens_per_s": {k: median(r) for k, r in rates.items()},
            "repeats": len(specs), "speedups": speedups,
            "tokens_per_s_by_repeat": {"speculative": [g.stats.tokens_per_s for g in specs], **rates},
            "same_ids": all(s.ids == g.ids for s in specs for g in own) if greedy else None}


def greedy_reference(job, progress=None):  # -> [int]
    """The job's prompt ids followed by the target's greedy decoding of it (job.options.max_new_tokens tokens, the
    target alone; also a warm-up), with a bar from `progress` (a factory, or None): the ids ControlledDraft copies."""
    greedy = Options(job.options.max_new_tokens, 0, SamplingParams(temperature=0.0))
    with bar(progress, "--simulate-acceptance: the target's greedy reference", greedy.max_new_tokens, "tok") as b:
        reference = decode(replace(plain_job(job, job.target, np.random.default_rng(0)), options=greedy),
                           on_emit=lambda new_ids, n: b.update(len(new_ids)))
    return list(job.prompt) + reference.ids


def steered(job, reference, a, seed):  # -> Job
    """The job with its ModelDrafter's model wrapped in ControlledDraft with acceptance `a` (same p_min), copying
    `reference` (greedy_reference's ids) and drawing its decisions from a generator seeded with `seed`."""
    draft = ControlledDraft(job.drafter.model, reference, a, np.random.default_rng(seed))
    return job.with_drafter(ModelDrafter(draft, p_min=job.drafter.p_min))


def simulated(job, a, seed, progress=None):  # -> (Job, [int])
    """(steered(job, reference, a, seed), reference), reference = greedy_reference(job, progress) (steered again for
    each --compare-repeats run); a note says that acceptance is simulated."""
    reference = greedy_reference(job, progress)
    log.info(f"SIMULATED acceptance: each draft token is the target's greedy token with probability {a:g} (the "
             "draft's forwards still run, for their cost)")
    return steered(job, reference, a, seed), reference
