"""The loop: speculative_generate = prepare (every check, once) + decode (prefill, rounds, EOS cut, statistics,
on_emit, Ctrl-C). Each round is npspec.decode.round's propose -> verify -> accept -> roll back; its gamma comes
from npspec.decode.schedule. Models and drafters are reached through npspec.decode.types' protocols only.
Imports numpy and npspec.decode's modules.
"""

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
    """The Drafter for `draft`: a model (a Forwarder) becomes ModelDrafter(draft); a Drafter or None is returned.
    Raises TypeError for anything else (checks.check_draft)."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, Forwarder):
        return ModelDrafter(draft)
    check_draft(draft)


@dataclass(frozen=True)
class Job:
    """A checked generation (prepare's): the target, the Drafter (None: plain decoding), the prompt ids, the
    Options with gamma clamped, the context n_ctx it may use, and the source of uniforms."""

    target: object
    drafter: object
    prompt: list
    options: Options
    n_ctx: int
    rng: object

    def with_drafter(self, drafter):
        """The same job drafting with `drafter` (same vocabulary and context: npspec.cli.harness.simulated)."""
        return replace(self, drafter=drafter)


def prepare(target, draft, prompt_ids, options, rng=None):  # -> Job
    """Check a generation once, before any forward, and clamp gamma (see speculative_generate for the errors).
    The draft is checked against the target even when gamma is 0 (it then drafts nothing).

    draft: a model, a Drafter or None; options: Options (validated when built); rng: an np.random.Generator,
    an int seed or None (seed 0). gamma larger than `max_new_tokens - 1` or `n_ctx - 1` is clamped to that
    (the heuristic schedule starts there); when no round can draft, the drafter is not used at all.
    """
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
    """Run a prepared Job (see speculative_generate for on_emit, trace, the stop reasons and Ctrl-C)."""
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
    """Prefill the target with every prompt id but the last, start the drafter; returns the target's cache."""
    cache = target.new_cache()
    target.prefill(np.asarray(seq[:-1]), cache)  # all but the last id
    stats.target_forwards += len(seq) > 1
    stats.seconds_verify = time.perf_counter() - t0
    if drafter is not None:
        drafter.start(list(seq))
        stats.seconds_draft = time.perf_counter() - t0 - stats.seconds_verify
    return cache


def stopped(stats, seq, job):
    """Whether the budget or the context ends the generation before another round (sets stats.stop_reason)."""
    if len(seq) - len(job.prompt) >= job.options.max_new_tokens:
        stats.stop_reason = "max_new_tokens"
    elif len(seq) >= job.n_ctx:
        stats.stop_reason = "context"
    return bool(stats.stop_reason)


def count(stats, outcome):
    """Add one round's Outcome to the statistics."""
    stats.target_forwards += 1
    stats.seconds_draft += outcome.seconds_draft
    stats.seconds_verify += outcome.seconds_verify
    stats.drafted += outcome.drafted
    stats.record_round(outcome.proposed, outcome.tested, outcome.accepted)


def finished(ids, stats, records, drafter, forwards, t0):
    """The Generation of `ids`: its stats completed with the draft forwards since `forwards`, the new tokens and the
    seconds since t0."""
    if drafter is not None:
        stats.draft_forwards = drafter.forwards - forwards
    stats.new_tokens = len(ids)
    stats.seconds = time.perf_counter() - t0
    return Generation(ids, stats, records)


def speculative_generate(target, draft, prompt_ids, max_new_tokens, gamma=4, temperature=1.0, top_k=0, top_p=1.0,
                         rng=None, on_emit=None, trace=False, gamma_schedule="constant", verify="token"):
    """Generate with speculative decoding (Leviathan et al. 2023, Algorithm 1); gamma=0 or draft=None is autoregressive.

    target: a loaded `Model` (any npspec.decode.types.Forwarder). draft: a model with the target's vocabulary
    (drafted by npspec.decode.drafters.ModelDrafter), any Drafter (npspec.decode.drafters: NgramDrafter,
    ModelDrafter with p_min, TreeDrafter, DynamicTreeDrafter, or yours), or None.
    prompt_ids: `[n_prompt]` ids, n_prompt >= 1. max_new_tokens >= 1. gamma >= 0.
    gamma_schedule: "constant" (every round schedules gamma) or "heuristic" (next_gamma; starts at gamma).
    verify: the acceptance rule's name (npspec.decode.rules.RULES: "token").
    rng: an `np.random.Generator`, or an int seed (default: seeded with 0).
    gamma larger than `max_new_tokens - 1` or `n_ctx - 1` is clamped to that up front (the
    heuristic schedule starts there), and each round drafts at most round_gamma(scheduled gamma, ...).
    on_emit(ids, n_accepted): called after each round with the round's new ids, of which the
    first n_accepted are accepted drafts and the rest (none after an accepted EOS, else one)
    target-produced (corrected or bonus).
    trace: record each round in `Generation.trace` as `{"drafted": ids, "accepted": n, "token": id,
    "proposed": k, "gamma": g, "p": [p_i(d_i)], "q": [q_i(d_i)], "u": [u_i], "seconds_draft": s,
    "seconds_verify": s}`, with "drafted" cut after an accepted EOS (as the statistics are), "token"
    the corrected or bonus id (None when the round ended on an accepted EOS), k the number proposed,
    g the round's scheduled and clamped gamma, p and q the warped probabilities of each draft
    (one-hot at temperature 0) and u its acceptance uniform (d_i is kept while u_i < p/q; None at
    temperature 0, where no uniform decides anything). A tree round's record has "tree": its ids and
    parents, "drafted" its kept path, and p, q, u None.
    Output is exactly target-distributed; with temperature 0 it is token-identical to greedy
    decoding of the target when the target's kernel is batch invariant (npspec.kernels.products).
    Stops at EOS (included in the ids and counted), after max_new_tokens, or when the sequence
    reaches the smaller n_ctx of the target and the drafter (stop_reason "context").
    Raises ValueError for bad options (npspec.decode.types.Options, SamplingParams), a vocabulary or tokenizer
    mismatch (checks.check_pair), an empty prompt, or a drafter that proposes more than asked or malformed
    rows, and ContextOverflowError if the prompt leaves no room in the context (checks.check_prompt); all but
    the drafter's before any forward. TypeError for an option or prompt of the wrong type or an rng that is
    neither a Generator nor an int seed (a module such as `random`, or the legacy np.random.RandomState, is
    refused; ValueError for a negative seed); TypeError for a target that is not a model or a draft that is
    neither a model, a drafter nor None.
    Ctrl-C raises GenerationInterrupted, which holds the Generation of the rounds completed before it.
    """
    options = Options(max_new_tokens, gamma, SamplingParams(temperature, top_k, top_p), gamma_schedule, verify)
    return decode(prepare(target, draft, prompt_ids, options, rng), on_emit, trace)
