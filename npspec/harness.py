"""The command line's measurements around a generation, kept out of the command itself: --compare (plain decoding
with the same prompt, options and seed, timed with the target's kernel and threads and every plain baseline of
npspec.registry) and
--simulate-acceptance (a SIMULATION: the draft model's proposals steered by
npspec.decode.drafters.ControlledDraft). Imports numpy, npspec.registry and npspec.decode.
"""

from dataclasses import replace

import numpy as np

from .decode import Options, SamplingParams, decode
from .decode.drafters import ControlledDraft, ModelDrafter
from .progress import bar
from .registry import plain_baselines


def plain_job(job, target, rng):
    """The Job decoding job's prompt with `target` alone (gamma 0, the target's own context), drawing from rng."""
    return replace(job, target=target, drafter=None, options=replace(job.options, gamma=0), n_ctx=target.config.n_ctx,
                   rng=rng)


def compare_plain(job, seed, threads, progress=None):  # -> {label: Generation}
    """Plain decoding of the job's prompt with its options and a fresh generator seeded with `seed`, with the
    target's own kernel and threads first, then each kernel of npspec.registry.plain_baselines (the compiled one when
    installed, BLAS's) at the `threads` asked for, through Model.with_kernel; keyed by plain_label. progress: a bar
    factory (npspec.progress) for each run, or None. Raises GenerationInterrupted on Ctrl-C."""
    target = job.target
    models = {plain_label(target, threads): target}
    for kernel in plain_baselines(target.kernel):
        models.setdefault(kernel, target.with_kernel(kernel, threads))
    plain = {}
    for label, model in models.items():
        with bar(progress, f"--compare: plain decoding, {label}", job.options.max_new_tokens, "tok") as b:
            plain[label] = decode(plain_job(job, model, np.random.default_rng(seed)),
                                  on_emit=lambda new_ids, n: b.update(len(new_ids)))
    return plain


def plain_label(model, threads):
    """The name of a plain decoding by `model` when `threads` were asked for: its kernel's name, with its thread
    count when it differs (the kernel probe may run a role at one thread: npspec.choice)."""
    if model.threads == threads:
        return model.kernel
    return f"{model.kernel} at {model.threads} thread{'' if model.threads == 1 else 's'}"


def comparison(spec, plain, greedy):
    """The speculative Generation `spec` against plain decoding: {label: Generation}, the target's own first
    (compare_plain).

    `plain_tokens_per_s` and `speedup` are those of the FASTEST plain decoding (`plain_kernel`); `same_ids` (greedy
    only) compares with plain decoding on the target's own kernel, whose bits the speculative rounds reproduce.
    With temperature > 0 the two runs use the random stream differently, so their ids differ by design.
    """
    s = spec.stats.tokens_per_s
    best = max(plain, key=lambda k: plain[k].stats.tokens_per_s)
    p = plain[best].stats.tokens_per_s
    own = next(iter(plain))
    return {"speculative_tokens_per_s": s, "plain_tokens_per_s": p, "plain_kernel": best,
            "speedup": s / p if p > 0 else float("nan"), "plain_seconds": plain[best].stats.seconds,
            "plain_by_kernel_tokens_per_s": {k: g.stats.tokens_per_s for k, g in plain.items()},
            "same_ids": spec.ids == plain[own].ids if greedy else None}


def simulated(job, a, seed, note, progress=None):  # -> Job
    """The job with its ModelDrafter's model wrapped in ControlledDraft with acceptance `a` (same p_min).

    First decodes the prompt greedily with the target alone (also a warm-up), for the tokens the proposals
    copy, with a bar from `progress` (a factory, or None); note(message) says that acceptance is simulated.
    """
    greedy = Options(job.options.max_new_tokens, 0, SamplingParams(temperature=0.0))
    with bar(progress, "--simulate-acceptance: the target's greedy reference", greedy.max_new_tokens, "tok") as b:
        reference = decode(replace(plain_job(job, job.target, np.random.default_rng(0)), options=greedy),
                           on_emit=lambda new_ids, n: b.update(len(new_ids)))
    note(f"SIMULATED acceptance: each draft token is the target's greedy token with probability {a:g} (the draft's "
         "forwards still run, for their cost)")
    steered = ControlledDraft(job.drafter.model, list(job.prompt) + reference.ids, a, np.random.default_rng(seed))
    return job.with_drafter(ModelDrafter(steered, p_min=job.drafter.p_min))
