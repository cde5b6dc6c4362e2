"""generate's measurements around a generation: --compare (plain decoding with the same prompt, options and seed,
with the target's kernel and every plain baseline of npspec.kernels.registry, --compare-repeats times in turn)
and --simulate-acceptance (a SIMULATION: the draft's proposals steered by npspec.decode.drafters.ControlledDraft).
Notes go to its logger. Imports numpy, npspec.kernels.registry, npspec.sources.progress and npspec.decode.
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
    """{plain_label: Model} that --compare decodes plainly with: the target as it is first, then each of
    registry.plain_baselines at `threads` (Model.with_kernel)."""
    target = job.target
    models = {plain_label(target, threads): target}
    for kernel in plain_baselines(target.kernel, target.codes):
        models.setdefault(kernel, target.with_kernel(kernel, threads))
    return models


def decode_plain(job, model, seed, label, progress=None):  # -> Generation
    """One plain decoding of the job's prompt by `model`, its rng seeded with `seed`, a bar from `progress` named
    after `label`. Raises GenerationInterrupted on Ctrl-C."""
    with bar(progress, f"--compare: plain decoding, {label}", job.options.max_new_tokens, "tok") as b:
        return decode(plain_job(job, model, np.random.default_rng(seed)),
                      on_emit=lambda new_ids, n: b.update(len(new_ids)))


def compare_repeated(job, first, again, seed, threads, repeats, progress=None):  # -> ([Gen], {label: [Gen]}, bool)
    """--compare `repeats` times in turn: a speculative decoding (`first`, then again()'s Jobs), then each of
    plain_models(job, threads), the target's own kernel last, each rng seeded with `seed`. A speculative run sits
    next to the plain runs it is divided by, so a memory rate that drifts moves both sides of a ratio alike.
    Returns ([speculative Generation], {label: [plain Generation]}, whether every repeat finished): Ctrl-C drops
    the unfinished repeat ({} when none finished)."""
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
    """`model`'s kernel name, with its thread count when not `threads` (the probe may run a role at one)."""
    if model.threads == threads:
        return model.kernel
    return f"{model.kernel} at {model.threads} thread{'' if model.threads == 1 else 's'}"


def comparison(specs, plain, greedy):
    """The speculative runs `specs` against `plain` ({label: [Generation]}, one per repeat): medians over the
    repeats, `plain_kernel` the fastest, `speedup` the median of each repeat's ratio to it (`speedups`), and
    `same_ids` (greedy only; else None): every run gave the ids of the target's own kernel."""
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
    """The prompt ids and the target's greedy decoding of them (also a warm-up): the ids ControlledDraft copies."""
    greedy = Options(job.options.max_new_tokens, 0, SamplingParams(temperature=0.0))
    with bar(progress, "--simulate-acceptance: the target's greedy reference", greedy.max_new_tokens, "tok") as b:
        reference = decode(replace(plain_job(job, job.target, np.random.default_rng(0)), options=greedy),
                           on_emit=lambda new_ids, n: b.update(len(new_ids)))
    return list(job.prompt) + reference.ids


def steered(job, reference, a, seed):  # -> Job
    """The job with its draft model wrapped in ControlledDraft(acceptance `a`, `reference`, rng seeded `seed`)."""
    draft = ControlledDraft(job.drafter.model, reference, a, np.random.default_rng(seed))
    return job.with_drafter(ModelDrafter(draft, p_min=job.drafter.p_min))


def simulated(job, a, seed, progress=None):  # -> (Job, [int])
    """(steered(job, reference, a, seed), reference = greedy_reference(job)); a note says it is simulated."""
    reference = greedy_reference(job, progress)
    log.info(f"SIMULATED acceptance: each draft token is the target's greedy token with probability {a:g} (the "
             "draft's forwards still run, for their cost)")
    return steered(job, reference, a, seed), reference
