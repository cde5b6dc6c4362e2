"""Speculative decoding: propose -> verify -> accept -> roll back.

NOTE: letters as in Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative
Decoding", ICML, Algorithm 1): `p` is the TARGET's distribution, `q` the DRAFT's. Chen et al.
2023 swap the two letters. `gamma` is the number of draft tokens per round.

One round, with `seq` the ids so far (prompt + emitted) and both caches holding `seq[:-1]`:
  1. propose: the draft samples d_1..d_gamma, d_i ~ q_i, keeping each q_i exactly as the
     array it sampled from (after warping);
  2. verify: the target runs ONE forward over [seq[-1], d_1..d_gamma] -> p_1..p_{gamma+1},
     warped the same way;
  3. accept: d_i is kept while u_i < p_i(d_i) / q_i(d_i) (strict); at the first rejection
     emit a sample of residual(p_i, q_i) = norm(max(0, p_i - q_i)); if every draft is kept,
     emit a bonus token from p_{gamma+1};
  4. roll back: both caches forget everything past what was emitted (O(1), no copy).
`gamma = 0` is plain autoregressive decoding: each round is one target forward and a sample
from p_1 (the same code path, so both share prefill, warping and statistics).

Temperature 0 (greedy) takes a fast path with the same result: with one-hot p and q, sampling
q_i gives argmax q_i, `u < p(d) / q(d)` holds exactly when d = argmax p (p(d) is 1 or 0, u < 1),
and the residual of two different one-hots is p's one-hot. So a greedy round takes the argmax
of the float32 logits (`propose_greedy`, `verify_greedy`) and keeps drafts while they equal the
target's argmax (`accept_greedy`), without building the float64 one-hot rows.

Randomness: one `np.random.Generator`, seeded once per run. Each round draws exactly
`2 * gamma_r + 1` uniforms at its start, in this order: gamma_r for the draft's samples,
gamma_r for the acceptance tests, 1 for the residual or bonus sample (gamma_r = this round's
clamped gamma). The draw count never depends on what gets accepted.

Options are validated here only (`check_options`, `check_pair`, `check_prompt`); the CLI calls
the same functions early and maps their errors to messages. Imports npspec.gpt2, npspec.sampling
and npspec.text; the models are duck-typed (`config`, `tokenizer`, `new_cache`, `forward`, `prefill`).
"""

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .gpt2 import ContextOverflowError
from .sampling import check_warp_args, greedy, residual, sample, warp
from .text import same_tokenizer


@dataclass
class Stats:
    """What a generation did. Times in seconds (prefill included, model loading excluded)."""

    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0  # draft tokens proposed (cut after an accepted EOS)
    accepted: int = 0  # drafts kept
    rejected: int = 0  # drafts tested and rejected (at most one per round)
    target_forwards: int = 0
    draft_forwards: int = 0
    seconds: float = 0.0
    seconds_draft: float = 0.0
    seconds_verify: float = 0.0
    stop_reason: str = ""  # "eos", "max_new_tokens" or "context"
    tested_by_position: list = field(default_factory=list)  # [gamma] drafts tested at position i+1
    accepted_by_position: list = field(default_factory=list)  # [gamma] drafts kept at position i+1

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
        """[gamma] accepted / tested at each draft position 1..gamma (nan where none was tested)."""
        return [a / t if t else float("nan") for a, t in zip(self.accepted_by_position, self.tested_by_position)]

    def as_dict(self):
        d = asdict(self)
        for key in ("alpha", "draft_acceptance", "tokens_per_round", "tokens_per_s", "seconds_other",
                    "acceptance_by_position"):
            d[key] = getattr(self, key)
        return d


@dataclass
class Generation:
    """The result of a generation: the new ids `[new_tokens]` (EOS included) and the Stats."""

    ids: list
    stats: Stats
    trace: list = field(default_factory=list)


def check_options(max_new_tokens, gamma, temperature, top_k, top_p):
    """Raise ValueError naming the first bad option and its valid range (see speculative_generate)."""
    check_warp_args(temperature, top_k, top_p)
    if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens}")
    if isinstance(gamma, bool) or int(gamma) != gamma or gamma < 0:
        raise ValueError(f"gamma must be an integer >= 0 (0 = no drafting), got {gamma}")


def check_pair(target, draft):
    """Raise ValueError, before any decoding, unless `draft` can speak for `target`.

    Both must have the same `n_vocab`, and, when both carry a tokenizer, the same tokenizer
    (text.same_tokenizer: the same ids mean the same text; runtime truncation/padding settings aside).
    """
    if draft.config.n_vocab != target.config.n_vocab:
        raise ValueError(f"draft vocabulary ({draft.config.n_vocab}) differs from the target's "
                         f"({target.config.n_vocab}); pick a draft with the target's tokenizer")
    a, b = target.tokenizer, draft.tokenizer
    if a is not None and b is not None and not same_tokenizer(a, b):
        raise ValueError(f"the draft ({draft.source}) and target ({target.source}) use different tokenizers; "
                         "pick a draft trained with the target's tokenizer")


def context_size(target, draft):
    """The context a generation can use: the target's n_ctx, or the smaller of the two with a draft (None: no draft)."""
    return min(target.config.n_ctx, draft.config.n_ctx) if draft is not None else target.config.n_ctx


def check_prompt(prompt_ids, n_ctx):
    """Raise ValueError for an empty or non-integer prompt, ContextOverflowError for one longer than `n_ctx`."""
    if len(prompt_ids) and np.asarray(prompt_ids).dtype.kind not in "iu":
        raise ValueError("prompt_ids must be integer token ids; encode text with the model's tokenizer first")
    if not len(prompt_ids):
        raise ValueError("the prompt is empty: give at least one id (GPT-2 starts from <|endoftext|>)")
    if len(prompt_ids) > n_ctx:
        raise ContextOverflowError(f"the prompt has {len(prompt_ids)} tokens but the context holds {n_ctx}; shorten it")


def feed(model, cache, seq):
    """Feed `seq[cache.length:]` and return the logits of its last position `[n_vocab]`."""
    return model.forward(np.asarray(seq[cache.length:]), cache)[-1]


def propose(draft, cache, seq, gamma, u, warp_args):
    """Step 1: sample gamma draft tokens. Returns (d `[gamma]` ids, q `[gamma, n_vocab]` float64).

    Each q[i] is exactly the array d[i] was sampled from; `seq` is extended with the drafts.
    """
    q = []
    for i in range(gamma):
        qi = warp(feed(draft, cache, seq), **warp_args)
        seq.append(sample(qi, u[i]))
        q.append(qi)
    return seq[len(seq) - gamma:], np.array(q).reshape(gamma, -1)


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


def propose_greedy(draft, cache, seq, gamma):
    """Step 1 at temperature 0: d_i = argmax of the draft's logits. Returns d `[gamma]` ids; `seq` is extended."""
    for _ in range(gamma):
        seq.append(int(greedy(feed(draft, cache, seq))))
    return seq[len(seq) - gamma:]


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


def speculative_generate(target, draft, prompt_ids, max_new_tokens, gamma=4, temperature=1.0, top_k=0,
                         top_p=1.0, rng=None, on_emit=None, trace=False):
    """Generate with speculative decoding (Leviathan et al. 2023, Algorithm 1); gamma=0 or draft=None is autoregressive.

    target, draft: loaded `Model`s with the same vocabulary (draft may be None).
    prompt_ids: `[n_prompt]` ids, n_prompt >= 1. max_new_tokens >= 1. gamma >= 0.
    rng: an `np.random.Generator`, or an int seed (default: seeded with 0).
    gamma larger than `max_new_tokens - 1` or `n_ctx - 1` is clamped to that (stats lists have that length).
    on_emit(ids, n_accepted): called after each round with the round's new ids, of which the
    first n_accepted are accepted drafts and the rest (none after an accepted EOS, else one)
    target-produced (corrected or bonus).
    trace: record each round in `Generation.trace` as `{"drafted": ids, "accepted": n, "token": id,
    "p": [p_i(d_i)], "q": [q_i(d_i)], "u": [u_i], "seconds_draft": s, "seconds_verify": s}`, with
    "drafted" cut after an accepted EOS (as the statistics are), "token" the corrected or bonus
    id (None when the round ended on an accepted EOS), p and q the warped probabilities of each
    draft (one-hot at temperature 0) and u its acceptance uniform (d_i is kept while u_i < p/q;
    None at temperature 0, where no uniform decides anything).
    Output is exactly target-distributed; with temperature 0 it is token-identical to greedy
    decoding of the target when the target's kernel is batch invariant (npspec.kernels).
    Stops at EOS (included in the ids and counted), after max_new_tokens, or when the sequence
    reaches the smaller n_ctx of the two models (stop_reason "context").
    Raises ValueError for bad options (check_options), a vocabulary or tokenizer mismatch
    (check_pair) or an empty prompt, and ContextOverflowError if the prompt alone exceeds the
    context (check_prompt); all before any forward.
    """
    check_options(max_new_tokens, gamma, temperature, top_k, top_p)
    if draft is None:
        gamma = 0
    if gamma:
        check_pair(target, draft)
    n_ctx = context_size(target, draft if gamma else None)
    check_prompt(prompt_ids, n_ctx)
    seq = [int(i) for i in prompt_ids]
    gamma = min(gamma, max_new_tokens - 1, n_ctx - 1)  # no round can use more (and a huge gamma costs nothing)
    if rng is None or isinstance(rng, (int, np.integer)):
        rng = np.random.default_rng(0 if rng is None else rng)
    warp_args = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    eos = target.config.eos_token_id
    stats = Stats(tested_by_position=[0] * gamma, accepted_by_position=[0] * gamma)
    rounds = []
    n_prompt = len(seq)

    t0 = time.perf_counter()
    tcache = target.new_cache()
    target.prefill(np.asarray(seq[:-1]), tcache)  # all but the last id
    stats.target_forwards += len(seq) > 1
    stats.seconds_verify = time.perf_counter() - t0
    if gamma:
        dcache = draft.new_cache()
        draft.prefill(np.asarray(seq[:-1]), dcache)
        stats.draft_forwards += len(seq) > 1
        stats.seconds_draft = time.perf_counter() - t0 - stats.seconds_verify

    while True:
        remaining = max_new_tokens - (len(seq) - n_prompt)
        if remaining <= 0:
            stats.stop_reason = "max_new_tokens"
            break
        if len(seq) >= n_ctx:
            stats.stop_reason = "context"
            break
        g = round_gamma(gamma, remaining, n_ctx, len(seq))
        u = rng.random(2 * g + 1)
        base = len(seq)

        t1 = time.perf_counter()
        d, q = [], np.zeros((0, target.config.n_vocab))
        if g:
            dcache.rollback(min(dcache.length, base - 1))
            if temperature == 0:  # the greedy fast path (see the module docstring)
                d = propose_greedy(draft, dcache, seq, g)
            else:
                d, q = propose(draft, dcache, seq, g, u[:g], warp_args)
            stats.draft_forwards += g
        t2 = time.perf_counter()
        if temperature == 0:
            best = verify_greedy(target, tcache, seq, g)
            n, token = accept_greedy(d, best)
        else:
            p = verify(target, tcache, seq, g, warp_args)
            n, token = accept(np.array(d, dtype=np.int64), p, q, u[g:2 * g], u[2 * g])
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
            tested, drafted = n + (n < g), g
        stats.drafted += drafted
        stats.accepted += n
        stats.rejected += tested - n
        for i in range(tested):
            stats.tested_by_position[i] += 1
            stats.accepted_by_position[i] += i < n
        stats.rounds += 1
        del seq[base:]
        seq.extend(emitted)
        tcache.rollback(len(seq) - 1)
        if trace:  # p(d_i), q(d_i) of each draft (one-hot at temperature 0) and its uniform u_i
            k, dk = np.arange(drafted), np.asarray(d[:drafted], dtype=np.int64)
            p_d, q_d = ((dk == best[:drafted]) * 1.0, np.ones(drafted)) if temperature == 0 else (p[k, dk], q[k, dk])
            rounds.append({"drafted": dk.tolist(), "accepted": n,
                           "token": int(emitted[-1]) if len(emitted) > n else None,
                           "p": p_d.tolist(), "q": q_d.tolist(),
                           "u": None if temperature == 0 else u[g:g + drafted].tolist(),
                           "seconds_draft": t2 - t1, "seconds_verify": t3 - t2})
        if on_emit is not None:
            on_emit(emitted, n)
        if eos is not None and emitted[-1] == eos:
            stats.stop_reason = "eos"
            break

    stats.new_tokens = len(seq) - n_prompt
    stats.seconds = time.perf_counter() - t0
    return Generation(seq[n_prompt:], stats, rounds)
