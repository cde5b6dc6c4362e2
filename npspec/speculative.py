"""Speculative decoding: propose -> verify -> accept -> roll back.

NOTE: letters as in Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative
Decoding", ICML, Algorithm 1): `p` is the TARGET's distribution, `q` the DRAFT's. Chen et al.
2023 swap the two letters. `gamma` is the number of draft tokens per round.

One round, with `seq` the ids so far (prompt + emitted) and the target's cache holding `seq[:-1]`:
  1. propose: a drafter (npspec.drafters: a draft model, n-gram lookup, or yours) proposes
     k <= g tokens d_1..d_k, each with the exact row q_i it was drawn from (after warping);
  2. verify: the target runs ONE forward over [seq[-1], d_1..d_k] -> p_1..p_{k+1}, warped the
     same way;
  3. accept: d_i is kept while u_i < p_i(d_i) / q_i(d_i) (strict); at the first rejection
     emit a sample of residual(p_i, q_i) = norm(max(0, p_i - q_i)); if every draft is kept,
     emit a bonus token from p_{k+1};
  4. roll back: the target's cache forgets everything past what was emitted (O(1), no copy);
     the drafter is told the outcome (`update`) and rolls itself back when it next proposes.
`gamma = 0`, no drafter, or a round with no proposal is plain autoregressive decoding: one
target forward and a sample from p_1 (the same code path, so all share prefill, warping and
statistics). The round's g is the schedule's gamma (`next_gamma`: "constant", or transformers'
"heuristic") cut by `round_gamma` to what the budget and the context allow.

Temperature 0 (greedy) takes a fast path with the same result: with one-hot p and q, sampling
q_i gives argmax q_i, `u < p(d) / q(d)` holds exactly when d = argmax p (p(d) is 1 or 0, u < 1),
and the residual of two different one-hots is p's one-hot. So a greedy round takes the argmax
of the float32 logits (`verify_greedy`) and keeps drafts while they equal the target's argmax
(`accept_greedy`), without building the float64 one-hot rows. (Any deterministic proposal,
n-gram lookup included, is accepted the same way.)

Randomness: one `np.random.Generator`, seeded once per run. Each round draws exactly
`2 * g + 1` uniforms at its start, in this order: g for the drafter's samples (u[i] for d_i),
g for the acceptance tests (u[g + i] tests d_i), 1 for the residual or bonus sample, with g the
round's scheduled and clamped gamma. A drafter that proposes k < g tokens leaves the rest
unused; the draw count never depends on what is proposed or accepted.

Options are validated here only (`check_options`, `check_pair`, `check_prompt`); the CLI calls
the same functions early and maps their errors to messages. Imports npspec.drafters,
npspec.gpt2, npspec.sampling and npspec.text; models and drafters are duck-typed.
"""

import time
import types
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .drafters import ModelDrafter
from .gpt2 import ContextOverflowError
from .sampling import check_integer, check_warp_args, greedy, residual, sample, warp
from .text import same_tokenizer
from .trees import accept_tree, accept_tree_greedy, children

SCHEDULES = ("constant", "heuristic")


@dataclass
class Stats:
    """What a generation did. Times in seconds (prefill included, model loading excluded).

    Besides npspec's own counts, vLLM's speculative-decoding metrics (vllm v1/spec_decode/metrics.py)
    so figures compare across engines: num_drafts (rounds with at least one proposed token),
    num_draft_tokens (tokens proposed), num_accepted_tokens, mean_acceptance_length
    (1 + accepted / num_drafts) and acceptance_rate_by_position (accepted at position i / num_drafts).
    """

    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0  # draft tokens proposed, cut after an accepted EOS
    accepted: int = 0  # drafts kept
    rejected: int = 0  # drafts tested and rejected (at most one per round)
    target_forwards: int = 0
    draft_forwards: int = 0
    seconds: float = 0.0
    seconds_draft: float = 0.0
    seconds_verify: float = 0.0
    stop_reason: str = ""  # "eos", "max_new_tokens", "context", or "interrupted" (GenerationInterrupted)
    tested_by_position: list = field(default_factory=list)  # [max k] drafts tested at position i+1
    accepted_by_position: list = field(default_factory=list)  # [max k] drafts kept at position i+1
    proposal_lengths: list = field(default_factory=list)  # [max k + 1] rounds that proposed k tokens, k = 0, 1, ...

    @property
    def alpha(self):
        """Per-token acceptance of the drafts actually tested: accepted / (accepted + rejected)."""
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else float("nan")

    @property
    def draft_acceptance(self):
        """accepted / drafted."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_round(self):
        return self.new_tokens / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_s(self):
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def seconds_other(self):
        return self.seconds - self.seconds_draft - self.seconds_verify

    @property
    def acceptance_by_position(self):
        """[max k] accepted / tested at each draft position 1, 2, ... (nan where none was tested)."""
        return [a / t if t else float("nan") for a, t in zip(self.accepted_by_position, self.tested_by_position)]

    @property
    def rounds_without_proposal(self):
        """Rounds in which the drafter proposed nothing (plain target steps)."""
        return self.proposal_lengths[0] if self.proposal_lengths else 0

    @property
    def num_drafts(self):
        """vLLM's num_drafts: rounds with at least one proposed token."""
        return self.rounds - self.rounds_without_proposal

    @property
    def num_draft_tokens(self):
        """vLLM's num_draft_tokens: every proposed token (sum of the proposal lengths)."""
        return sum(k * n for k, n in enumerate(self.proposal_lengths))

    @property
    def num_accepted_tokens(self):
        """vLLM's num_accepted_tokens: drafts kept (= accepted)."""
        return self.accepted

    @property
    def mean_acceptance_length(self):
        """vLLM's mean_acceptance_length: 1 + accepted / num_drafts, the tokens a round with a proposal emits on average."""
        return 1 + self.accepted / self.num_drafts if self.num_drafts else float("nan")

    @property
    def acceptance_rate_by_position(self):
        """[max k] vLLM's per-position acceptance rate: drafts kept at position i / num_drafts."""
        return [a / self.num_drafts if self.num_drafts else float("nan") for a in self.accepted_by_position]

    def record_round(self, proposed, tested, accepted):
        """Count one round: k proposed, the first `tested` of them tested, `accepted` of those kept."""
        grow = max(proposed, tested) - len(self.tested_by_position)
        self.tested_by_position += [0] * grow
        self.accepted_by_position += [0] * grow
        self.proposal_lengths += [0] * (proposed + 1 - len(self.proposal_lengths))
        self.proposal_lengths[proposed] += 1
        for i in range(tested):
            self.tested_by_position[i] += 1
            self.accepted_by_position[i] += i < accepted
        self.accepted += accepted
        self.rejected += tested - accepted
        self.rounds += 1

    def as_dict(self):
        d = asdict(self)
        for key in ("alpha", "draft_acceptance", "tokens_per_round", "tokens_per_s", "seconds_other",
                    "acceptance_by_position", "rounds_without_proposal", "num_drafts", "num_draft_tokens",
                    "num_accepted_tokens", "mean_acceptance_length", "acceptance_rate_by_position"):
            d[key] = getattr(self, key)
        return d


@dataclass
class Generation:
    """The result of a generation: the new ids `[new_tokens]` (EOS included) and the Stats."""

    ids: list
    stats: Stats
    trace: list = field(default_factory=list)


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C (KeyboardInterrupt) during speculative_generate. `generation`: what was emitted before it, by whole
    rounds (a round cut short emits nothing), with stats.stop_reason "interrupted". A KeyboardInterrupt, so code
    that stops on Ctrl-C still does."""

    def __init__(self, generation):
        super().__init__("interrupted")
        self.generation = generation


def check_options(max_new_tokens, gamma, temperature, top_k, top_p, gamma_schedule="constant"):
    """Raise ValueError naming the first bad option and its valid range, TypeError naming an option of the wrong type
    (integers are Python or NumPy ints, never floats or bools; see speculative_generate)."""
    check_warp_args(temperature, top_k, top_p)
    check_integer(max_new_tokens, "max_new_tokens", 1)
    check_integer(gamma, "gamma", 0, " (0 = no drafting)")
    if gamma_schedule not in SCHEDULES:
        raise ValueError(f"gamma_schedule (--gamma-schedule) must be one of {', '.join(SCHEDULES)}, "
                         f"got {gamma_schedule!r}")


def as_drafter(draft):
    """A drafter (npspec.drafters) for `draft`: a model becomes ModelDrafter(draft); a drafter or None is returned as is."""
    return ModelDrafter(draft) if draft is not None and not hasattr(draft, "start") else draft


def check_pair(target, draft):
    """Raise ValueError, before any decoding, unless `draft` (a model, a drafter or None) can speak for `target`.

    Both must have the same `n_vocab`, and, when both carry a tokenizer, the same tokenizer
    (text.same_tokenizer: the same ids mean the same text; runtime truncation/padding settings aside); a tree
    drafter's whole tree must fit in the context after one id (a round verifies the last id and every node).
    Raises TypeError for a target that is not a model or a draft that is neither a model, a drafter nor None.
    """
    if not all(hasattr(target, a) for a in ("config", "tokenizer", "new_cache", "forward", "prefill")):
        raise TypeError(f"target must be an npspec Model (npspec.load(spec) or npspec.random_model(shape)), got "
                        f"{type(target).__name__} {target!r:.60}")
    if isinstance(draft, str):
        raise TypeError(f"draft must be a Model, a drafter (npspec.drafters) or None, got the str {draft!r:.60}; load "
                        "a model with npspec.load(spec, role='draft'), or for prompt lookup pass "
                        "npspec.NgramDrafter(target.config.n_vocab, target.config.eos_token_id)")
    if draft is None:
        return
    if not hasattr(draft, "start") and not hasattr(draft, "config"):
        raise TypeError(f"draft must be a Model, a drafter (npspec.drafters) or None, got {type(draft).__name__} "
                        f"{draft!r:.60}")
    drafter = as_drafter(draft)
    if drafter.n_vocab != target.config.n_vocab:
        raise ValueError(f"draft vocabulary ({drafter.n_vocab}) differs from the target's "
                         f"({target.config.n_vocab}); pick a draft with the target's tokenizer")
    a, b = target.tokenizer, drafter.tokenizer
    if a is not None and b is not None and not same_tokenizer(a, b):
        raise ValueError(f"the draft ({drafter.source}) and target ({target.source}) use different tokenizers; "
                         "pick a draft trained with the target's tokenizer")
    if hasattr(drafter, "propose_tree"):
        n_ctx, nodes = context_size(target, drafter), drafter.tree_size(drafter.depth)
        if nodes > n_ctx - 1:
            raise ValueError(f"the draft tree has {nodes} nodes but the context holds {n_ctx} ids, and a round "
                             f"verifies the last id and every node at once: give a tree of at most {n_ctx - 1} nodes")


def context_size(target, draft):
    """The context a generation can use: the target's n_ctx, or the smaller of it and the draft's (a model or a
    drafter; None or a drafter without a limit of its own: the target's)."""
    drafter = as_drafter(draft)
    if drafter is None or drafter.n_ctx is None:
        return target.config.n_ctx
    return min(target.config.n_ctx, drafter.n_ctx)


def check_prompt(prompt_ids, n_ctx, n_vocab):
    """Check the prompt before any forward.

    Raises TypeError unless `prompt_ids` is a 1-D sequence (a list, a tuple, a 1-D integer array) of integer ids
    (Python or NumPy ints, not bools or floats); ValueError for an empty prompt or an id outside [0, n_vocab);
    ContextOverflowError unless it leaves room for a new token: at most n_ctx - 1 ids.
    """
    what = "prompt_ids must be a 1-D sequence of integer token ids (a list or a 1-D integer array)"
    if isinstance(prompt_ids, np.ndarray):
        if prompt_ids.ndim != 1 or prompt_ids.dtype.kind not in "iu":
            raise TypeError(f"{what}, got an array of shape {prompt_ids.shape} and dtype {prompt_ids.dtype}")
    elif isinstance(prompt_ids, (str, bytes)):
        raise TypeError(f"{what}, got a {type(prompt_ids).__name__}; encode text with the model's tokenizer first "
                        "(or call npspec.generate_text)")
    elif not isinstance(prompt_ids, Sequence):
        raise TypeError(f"{what}, got {type(prompt_ids).__name__}")
    n = len(prompt_ids)
    if not n:
        raise ValueError("the prompt is empty: give at least one id (GPT-2 starts from <|endoftext|>)")
    if n >= n_ctx:
        raise ContextOverflowError(f"the prompt has {n} tokens but the context holds {n_ctx}, which leaves no room for "
                                   f"a new token past {n_ctx - 1}; shorten it")
    if not isinstance(prompt_ids, np.ndarray):
        for i, x in enumerate(prompt_ids):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"{what}; prompt_ids[{i}] is {x!r} (a {type(x).__name__})")
    for i, x in enumerate(prompt_ids):
        if not 0 <= x < n_vocab:
            raise ValueError(f"prompt_ids[{i}] is {x}, not a token id of this vocabulary: ids are in [0, {n_vocab})")


def verify(target, cache, seq, gamma, warp_args):
    """Step 2: ONE target forward over [last id, d_1..d_gamma]. Returns p `[gamma + 1, n_vocab]` float64."""
    logits = target.forward(np.asarray(seq[cache.length:]), cache)
    return warp(logits[-(gamma + 1):], **warp_args)


def accept(d, p, q, u_accept, u_final):
    """Step 3, modified rejection sampling (Leviathan et al. 2023, Algorithm 1).

    d `[gamma]` ids, p `[gamma + 1, n_vocab]`, q `[gamma, n_vocab]`, u_accept `[gamma]`, u_final float.
    Returns (n accepted, the corrected or bonus token id).
    """
    gamma = len(d)
    rows = np.arange(gamma)
    with np.errstate(over="ignore"):  # a denormal q(d) makes p/q inf: accepted, as min(1, p/q) = 1 says
        kept = u_accept < p[rows, d] / q[rows, d]  # strict: p(d) = 0 is never accepted, even with u = 0
    n = int(np.argmin(kept)) if not kept.all() else gamma
    last = p[gamma] if n == gamma else residual(p[n], q[n])
    return n, sample(last, u_final)


def verify_greedy(target, cache, seq, gamma):
    """Step 2 at temperature 0: ONE target forward over [last id, d_1..d_gamma]. Returns its argmax ids `[gamma + 1]`."""
    return greedy(target.forward(np.asarray(seq[cache.length:]), cache)[-(gamma + 1):])


def accept_greedy(d, best):
    """Step 3 at temperature 0: keep d_i while it equals the target's argmax best[i-1].

    d `[gamma]` ids, best `[gamma + 1]` the target's argmax ids. Returns (n accepted, best[n]): the
    correction at the first mismatch, or the bonus token if every draft is kept. Equals
    `accept` on the one-hot rows `warp(logits, temperature=0)` for any uniforms.
    """
    gamma = len(d)
    kept = np.asarray(d, dtype=np.int64) == best[:gamma]
    n = int(np.argmin(kept)) if not kept.all() else gamma
    return n, int(best[n])


def round_gamma(gamma, remaining, n_ctx, length):  # -> int
    """The number of drafts of one round: gamma, cut so the round emits at most what is left.

    A round emits at most g + 1 ids, so g = min(gamma, remaining - 1, n_ctx - length - 1), with
    remaining the ids still allowed by max_new_tokens and length the ids so far (prompt included).
    n_ctx None means no context limit. g = 0 is a plain target step.
    """
    if n_ctx is None:
        return min(gamma, remaining - 1)
    return min(gamma, remaining - 1, n_ctx - length - 1)


def next_gamma(schedule, gamma, accepted):  # -> int
    """The next round's scheduled gamma after a round that kept `accepted` of its drafts.

    "constant": gamma. "heuristic": transformers' `num_assistant_tokens_schedule="heuristic"`
    (AssistedCandidateGenerator.update_candidate_strategy): gamma + 2 if the round kept as many
    drafts as it scheduled, else max(1, gamma - 1). It starts from the gamma the caller gives.
    It depends only on past rounds, so the output stays exactly target-distributed.
    """
    if schedule == "constant":
        return gamma
    return gamma + 2 if accepted == gamma else max(1, gamma - 1)


def speculative_generate(target, draft, prompt_ids, max_new_tokens, gamma=4, temperature=1.0, top_k=0,
                         top_p=1.0, rng=None, on_emit=None, trace=False, gamma_schedule="constant"):
    """Generate with speculative decoding (Leviathan et al. 2023, Algorithm 1); gamma=0 or draft=None is autoregressive.

    target: a loaded `Model`. draft: a `Model` with the target's vocabulary (drafted by
    npspec.drafters.ModelDrafter), any drafter (npspec.drafters: NgramDrafter, ModelDrafter with
    p_min, or yours), or None.
    prompt_ids: `[n_prompt]` ids, n_prompt >= 1. max_new_tokens >= 1. gamma >= 0.
    gamma_schedule: "constant" (every round schedules gamma) or "heuristic" (next_gamma; starts at gamma).
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
    decoding of the target when the target's kernel is batch invariant (npspec.kernels).
    Stops at EOS (included in the ids and counted), after max_new_tokens, or when the sequence
    reaches the smaller n_ctx of the target and the drafter (stop_reason "context").
    Raises ValueError for bad options (check_options), a vocabulary or tokenizer mismatch
    (check_pair), an empty prompt, or a drafter that proposes more than asked or malformed rows,
    and ContextOverflowError if the prompt leaves no room in the context (check_prompt); all but
    the drafter's before any forward. TypeError for an option or prompt of the wrong type (check_options,
    check_prompt), a target that is not a model or a draft that is neither a model, a drafter nor None (check_pair), or
    an rng that is neither a Generator nor an int seed (a module such as `random`, or the legacy np.random.RandomState,
    is refused; ValueError for a negative seed).
    Ctrl-C raises GenerationInterrupted, which holds the Generation of the rounds completed before it.
    """
    check_options(max_new_tokens, gamma, temperature, top_k, top_p, gamma_schedule)
    check_pair(target, draft)
    drafter = as_drafter(draft) if gamma else None
    if drafter is None:
        gamma = 0
    n_ctx = context_size(target, drafter)
    check_prompt(prompt_ids, n_ctx, target.config.n_vocab)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        check_integer(rng, "rng (an int seed)", 0, " or an np.random.Generator")
    elif isinstance(rng, (types.ModuleType, np.random.RandomState)) or \
            not (rng is None or callable(getattr(rng, "random", None))):  # a Generator or a double (ScriptedRng)
        raise TypeError(f"rng must be an np.random.Generator or an int seed, got {rng!r:.60} (a {type(rng).__name__}); "
                        "pass np.random.default_rng(seed) or a seed >= 0")
    seq = [int(i) for i in prompt_ids]
    gamma = min(gamma, max_new_tokens - 1, n_ctx - 1)  # no round can use more (and a huge gamma costs nothing)
    drafter = drafter if gamma else None  # no round can draft: the drafter is not even started
    if rng is None or isinstance(rng, (int, np.integer)):
        rng = np.random.default_rng(0 if rng is None else rng)
    warp_args = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    eos = target.config.eos_token_id
    stats = Stats(tested_by_position=[0] * gamma, accepted_by_position=[0] * gamma)
    rounds = []
    n_prompt = len(seq)

    t0 = time.perf_counter()
    forwards = drafter.forwards if drafter is not None else 0
    done = len(seq)  # ids emitted by completed rounds (prompt included)
    try:
        tcache = target.new_cache()
        target.prefill(np.asarray(seq[:-1]), tcache)  # all but the last id
        stats.target_forwards += len(seq) > 1
        stats.seconds_verify = time.perf_counter() - t0
        if drafter is not None:
            drafter.start(list(seq))
            stats.seconds_draft = time.perf_counter() - t0 - stats.seconds_verify

        while True:
            remaining = max_new_tokens - (len(seq) - n_prompt)
            if remaining <= 0:
                stats.stop_reason = "max_new_tokens"
                break
            if len(seq) >= n_ctx:
                stats.stop_reason = "context"
                break
            g = max(0, round_gamma(gamma, remaining, n_ctx, len(seq)))
            base = len(seq)
            t1 = time.perf_counter()
            if drafter is not None and hasattr(drafter, "propose_tree"):  # a token tree (npspec.trees)
                g = tree_depth(drafter, g, n_ctx, len(seq))
                k = drafter.tree_size(g) if g else 0
                u = rng.random(2 * k + 1)
                ids, parents, q = drafter.propose_tree(list(seq), g, u[:k], warp_args) if k else ([], [], None)
                check_tree(ids, parents, q, k, target.config.n_vocab, temperature)
                t2 = time.perf_counter()
                path, token = verify_accept_tree(target, tcache, seq, ids, parents, q, u[k:2 * k], u[2 * k], warp_args)
                d, n = [ids[i] for i in path], len(path)
                untested = not children(parents)[path[-1] if path else -1]  # the walk ended at a leaf: no rejection
                tree_nodes = {"ids": [int(x) for x in ids], "parents": list(parents)}
            else:
                u, tree_nodes = rng.random(2 * g + 1), None
                d, q = [], None
                if g:
                    d, q = drafter.propose(list(seq), g, u[:g], warp_args)
                    check_proposal(d, q, g, target.config.n_vocab, temperature)
                k = len(d)
                seq.extend(d)
                t2 = time.perf_counter()
                if temperature == 0:
                    best = verify_greedy(target, tcache, seq, k)
                    n, token = accept_greedy(d, best)
                else:
                    p = verify(target, tcache, seq, k, warp_args)
                    q = np.zeros((0, target.config.n_vocab)) if q is None else q
                    n, token = accept(np.array(d, dtype=np.int64), p, q, u[g:g + k], u[2 * g])
                untested = n == k  # every draft kept: none was rejected
            stats.target_forwards += 1
            t3 = time.perf_counter()
            stats.seconds_draft += t2 - t1
            stats.seconds_verify += t3 - t2

            emitted = list(d[:n]) + [token]
            if eos is not None and eos in emitted:  # nothing after an EOS is emitted or counted
                emitted = emitted[: emitted.index(eos) + 1]
            if len(emitted) <= n:  # an accepted draft was EOS: the round ends there
                n, tested, drafted = len(emitted), len(emitted), len(emitted)
            else:
                tested, drafted = n + (not untested), k
            stats.drafted += drafted
            stats.record_round(k, tested, n)
            del seq[base:]
            seq.extend(emitted)
            done = len(seq)  # the round is counted: an interrupt from here on keeps it
            tcache.rollback(len(seq) - 1)
            if drafter is not None:
                drafter.update(k, n)
            if trace:
                rounds.append(trace_record(d, drafted, n, emitted, k, g, t2 - t1, t3 - t2, tree_nodes,
                                           None if tree_nodes else (best if temperature == 0 else (p, q, u[g:]))))
            if on_emit is not None:
                on_emit(emitted, n)
            if eos is not None and emitted[-1] == eos:
                stats.stop_reason = "eos"
                break
            if drafter is not None:
                gamma = next_gamma(gamma_schedule, gamma, n)
    except KeyboardInterrupt as e:  # Ctrl-C: keep what the completed rounds emitted
        del seq[done:]
        stats.stop_reason = "interrupted"
        raise GenerationInterrupted(finished(seq[n_prompt:], stats, rounds, drafter, forwards, t0)) from e
    return finished(seq[n_prompt:], stats, rounds, drafter, forwards, t0)


def finished(ids, stats, rounds, drafter, forwards, t0):
    """The Generation of `ids`: its stats completed with the draft forwards since `forwards`, the new tokens and the
    seconds since t0."""
    if drafter is not None:
        stats.draft_forwards = drafter.forwards - forwards
    stats.new_tokens = len(ids)
    stats.seconds = time.perf_counter() - t0
    return Generation(ids, stats, rounds)


def trace_record(d, drafted, n, emitted, k, g, seconds_draft, seconds_verify, tree, rows):
    """One round's `--trace` record (see speculative_generate). rows: the greedy round's target argmax ids, or
    (p, q, u_tests) of a sampled round, or None for a tree round."""
    dk = np.asarray(d[:drafted], dtype=np.int64)
    record = {"drafted": dk.tolist(), "accepted": n, "token": int(emitted[-1]) if len(emitted) > n else None,
              "proposed": k, "gamma": g, "p": None, "q": None, "u": None,
              "seconds_draft": seconds_draft, "seconds_verify": seconds_verify}
    if tree is not None:
        record["tree"] = tree
    elif isinstance(rows, tuple):  # p(d_i), q(d_i) and the acceptance uniform u_i of each draft
        p, q, u_tests = rows
        i = np.arange(drafted)
        record.update(p=p[i, dk].tolist(), q=q[i, dk].tolist(), u=u_tests[:drafted].tolist())
    else:  # greedy: one-hot rows, no uniform decides anything
        record.update(p=(dk == rows[:drafted]).astype(np.float64).tolist(), q=np.ones(drafted).tolist())
    return record


def tree_depth(drafter, g, n_ctx, length):  # -> int
    """A tree round's depth: at most g (round_gamma's clamp) and the drafter's own depth, and small enough that
    the verify's 1 + tree_size rows fit in the context after `length` ids."""
    depth = min(g, drafter.depth)
    while depth and length + drafter.tree_size(depth) > n_ctx:
        depth -= 1
    return depth


def verify_accept_tree(target, cache, seq, ids, parents, q, u_tests, u_final, warp_args):
    """Steps 2-4 for a tree: ONE target forward over [last id] + the nodes (tree attention), multi-candidate
    acceptance (npspec.trees.accept_tree, or the greedy walk at temperature 0), and the cache keeps the kept path.

    Returns (path: kept node indices, the corrected or bonus id). The cache then holds seq + the path's ids.
    """
    rows = [-1] + [parent + 1 if parent >= 0 else 0 for parent in parents]  # row 0 is seq's last id
    logits = target.forward_tree(np.asarray([seq[-1]] + list(ids)), rows, cache)
    if warp_args.get("temperature", 1.0) == 0:
        path, token = accept_tree_greedy(ids, parents, greedy(logits))
    else:
        path, token = accept_tree(ids, parents, q, warp(logits, **warp_args), u_tests, u_final)
    cache.keep([len(seq) + i for i in path], len(seq))  # node i was fed at position len(seq) + i
    return path, token


def check_tree(ids, parents, q, n_nodes, n_vocab, temperature):
    """Raise ValueError unless a tree drafter's proposal has n_nodes ids in range, valid parents and (temperature > 0)
    q `[n_nodes, n_vocab]` giving each id a positive probability."""
    if len(ids) != n_nodes or len(parents) != n_nodes or any(not -1 <= p < i for i, p in enumerate(parents)):
        raise ValueError(f"the tree drafter proposed {len(ids)} ids with parents {list(parents)}: {n_nodes} nodes, "
                         "each parent -1 or an earlier node, were asked for")
    check_proposal(ids, q, n_nodes, n_vocab, temperature)


def check_proposal(d, q, g, n_vocab, temperature):
    """Raise ValueError unless a drafter's proposal is well formed: at most g ids in [0, n_vocab), and (temperature > 0)
    q float `[len(d), n_vocab]` with q[i, d[i]] > 0 (a token it cannot have drawn is a drafter bug)."""
    if len(d) > g or any(not 0 <= int(x) < n_vocab for x in d):
        raise ValueError(f"the drafter proposed {list(d)}: at most {g} ids in [0, {n_vocab}) were asked for")
    if temperature == 0 or not len(d):
        return
    if q is None or np.shape(q) != (len(d), n_vocab) or (len(d) and not np.all(q[np.arange(len(d)), d] > 0)):
        raise ValueError(f"the drafter's q has shape {np.shape(q)} or gives a proposed id probability 0; it must be "
                         f"the [{len(d)}, {n_vocab}] rows the ids were drawn from")
