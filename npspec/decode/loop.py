"""The loop: speculative_generate = prepare (every check, once) + decode (prefill, rounds of npspec.decode.round,
statistics, on_emit, Ctrl-C). Reaches models and drafters through npspec.decode.types' protocols only."""

import time
from dataclasses import dataclass, replace

import numpy as np

from . import round as rounds
from .checks import check_draft, check_pair, check_prompt, check_rng, check_rule, check_target, context_size
from .drafters.model import ModelDrafter
from .schedule import next_gamma, round_gamma, tree_depth
from .stats import Generation, GenerationInterrupted, Stats, trace_record
from .types import Drafter, Forwarder, Options, SamplingParams


def as_drafter(draft):
    """A model (a Forwarder) becomes ModelDrafter(draft); a Drafter or None is returned; TypeError for anything else."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, Forwarder):
        return ModelDrafter(draft)
    check_draft(draft)


@dataclass(frozen=True)
class Job:
    """A checked generation (prepare's): target, Drafter or None, prompt ids, Options (gamma clamped), n_ctx, rng."""

    target: object
    drafter: object
    prompt: list
    options: Options
    n_ctx: int
    rng: object

    def with_drafter(self, drafter):
        return replace(self, drafter=drafter)


def prepare(target, draft, prompt_ids, options, rng=None):  # -> Job
    """Check a generation before any forward (errors: speculative_generate) and clamp gamma to max_new_tokens - 1 and
    n_ctx - 1; the draft is checked even when gamma is 0, then not used. rng: a Generator, an int seed or None (0)."""
    check_target(target)
    drafter = as_drafter(draft)  # checked even when gamma is 0
    if drafter is not None:
        check_pair(target, drafter)
    drafter = drafter if options.gamma else None
    if drafter is not None:
        check_rule(options.rule, drafter)
    n_ctx = context_size(target, drafter)
    check_prompt(prompt_ids, n_ctx, target.config.n_vocab)
    check_rng(rng)
    gamma = min(options.gamma, options.max_new_tokens - 1, n_ctx - 1) if drafter is not None else 0
    if rng is None or isinstance(rng, (int, np.integer)):
        rng = np.random.default_rng(0 if rng is None else rng)
    return Job(target, drafter if gamma else None, [int(i) for i in prompt_ids], replace(options, gamma=gamma),
               n_ctx, rng)


def decode(job, on_emit=None, trace=False):  # -> Generation
    target, drafter, options = job.target, job.drafter, job.options
    seq, stats, records = list(job.prompt), Stats(tested_by_position=[0] * options.gamma,
                                                  accepted_by_position=[0] * options.gamma), []
    t0 = time.perf_counter()
    forwards = drafter.forwards if drafter is not None else 0
    done = len(seq)  # ids emitted by completed rounds (prompt included)
    try:
        cache = start(target, drafter, seq, stats, t0)
        gamma = options.gamma
        while not stopped(stats, seq, job):
            g = max(0, round_gamma(gamma, options.max_new_tokens - (len(seq) - len(job.prompt)), job.n_ctx, len(seq)))
            depth = tree_depth(drafter, g, job.n_ctx, len(seq)) if drafter is not None else g
            outcome = rounds.finish(rounds.play(target, cache, drafter, seq, depth, job.rng, options.sampling,
                                                options.rule), target.config.eos_token_id)
            rounds.roll_back(cache, drafter, len(seq), outcome)
            seq.extend(outcome.emitted)
            done = len(seq)  # the round is counted: an interrupt from here on keeps it
            count(stats, outcome)
            if drafter is not None:
                drafter.update(outcome)
            if trace:
                records.append(trace_record(outcome))
            if on_emit is not None:
                on_emit(outcome.emitted, outcome.accepted)
            if outcome.emitted[-1] == target.config.eos_token_id:
                stats.stop_reason = "eos"
                break
            if drafter is not None:
                gamma = next_gamma(options.gamma_schedule, gamma, outcome.accepted)
    except KeyboardInterrupt as e:  # Ctrl-C: keep what the completed rounds emitted
        del seq[done:]
        stats.stop_reason = "interrupted"
        raise GenerationInterrupted(finished(seq[len(job.prompt):], stats, records, drafter, forwards, t0)) from e
    return finished(seq[len(job.prompt):], stats, records, drafter, forwards, t0)


def start(target, drafter, seq, stats, t0):
    """Prefill the target with the prompt but its last id, start the drafter; the target's cache."""
    cache = target.new_cache()
    target.prefill(np.asarray(seq[:-1]), cache)  # all but the last id
    stats.target_forwards += len(seq) > 1
    stats.seconds_verify = time.perf_counter() - t0
    if drafter is not None:
        drafter.start(list(seq))
        stats.seconds_draft = time.perf_counter() - t0 - stats.seconds_verify
    return cache


def stopped(stats, seq, job):
    if len(seq) - len(job.prompt) >= job.options.max_new_tokens:
        stats.stop_reason = "max_new_tokens"
    elif len(seq) >= job.n_ctx:
        stats.stop_reason = "context"
    return bool(stats.stop_reason)


def count(stats, outcome):
    stats.target_forwards += 1
    stats.seconds_draft += outcome.seconds_draft
    stats.seconds_verify += outcome.seconds_verify
    stats.drafted += outcome.drafted
    stats.record_round(outcome.proposed, outcome.tested, outcome.accepted)


def finished(ids, stats, records, drafter, forwards, t0):
    """The Generation of `ids`, its stats completed (draft forwards since `forwards`, seconds since t0)."""
    if drafter is not None:
        stats.draft_forwards = drafter.forwards - forwards
    stats.new_tokens = len(ids)
    stats.seconds = time.perf_counter() - t0
    return Generation(ids, stats, records)


def speculative_generate(target, draft, prompt_ids, max_new_tokens, gamma=4, temperature=1.0, top_k=0, top_p=1.0,
                         rng=None, on_emit=None, trace=False, gamma_schedule="constant", verify="token"):
    """Generate with speculative decoding (Leviathan et al. 2023, Algorithm 1): a Generation (ids, Stats, trace).

    target: a Model (a Forwarder); draft: a model of its vocabulary, a Drafter (npspec.decode.drafters) or None (plain
    decoding, as gamma=0); prompt_ids `[n >= 1]`; gamma_schedule "constant" or "heuristic"; verify: a name in
    npspec.decode.rules.RULES; rng: a Generator or int seed (default 0). on_emit(ids, n_accepted): each round's new
    ids, the first n_accepted of them kept drafts; trace: a record per round (stats.trace_record). The output is
    exactly target-distributed; at temperature 0, greedy's ids with a batch-invariant kernel. Stops at EOS (kept),
    max_new_tokens or n_ctx. ValueError for bad options, pair, prompt or proposals, TypeError for wrong types
    (npspec.decode.checks), ContextOverflowError for a prompt that fills the context; Ctrl-C raises
    GenerationInterrupted holding the completed rounds."""
    options = Options(max_new_tokens, gamma, SamplingParams(temperature, top_k, top_p), gamma_schedule, verify)
    return decode(prepare(target, draft, prompt_ids, options, rng), on_emit, trace)
