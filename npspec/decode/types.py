"""The types of one speculative round: what is sampled, what a drafter proposes, what the target's verify returned,
and what a drafter and a target model must offer (typing.Protocol: a reader and a type checker see who implements it).

NOTE: letters as in Leviathan et al. 2023 (npspec.decode.round): `p` the target's rows, `q` the draft's.

Every round is a tree: a chain of k drafts is the tree whose parents are [-1, 0, 1, ..., k - 2]
(`Proposal.chain`). A proposal may also carry non-candidate nodes (`extra_ids`, e.g. the lookahead
branch of lookahead / Jacobi decoding): the target scores them in the same forward (tree attention)
and the drafter reads their rows in the Outcome, but they are never accepted. A drafter that reads
the target's hidden states (EAGLE and Medusa heads) says so with `reads_hidden`; the round then asks
a target that offers them (`HiddenForwarder`) for the last hidden state of every verified row.
Imports numpy, npspec.decode.sampling, npspec.decode.rules and npspec.decode.schedule.
"""

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from .sampling import check_integer, check_warp_args, warp
from .rules import get_rule
from .schedule import SCHEDULES


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are sampled: transformers' order, temperature, then top-k, then top-p; validated once, here.

    temperature: 0 = greedy (one-hot rows on the argmax); top_k: 0 = off; top_p in (0, 1], 1 = off.
    Raises ValueError naming the bad option and its range, TypeError for a value of the wrong type
    (npspec.decode.sampling.check_warp_args).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        check_warp_args(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self):
        """True at temperature 0: every row is one-hot, so the round compares ids and builds no rows."""
        return self.temperature == 0

    def warp(self, logits):  # [..., n_vocab] float32 -> [..., n_vocab] float64
        """The probs a token is drawn from (npspec.decode.sampling.warp with these options)."""
        return warp(logits, self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True)
class Options:
    """What a generation is asked to do, validated once, here (the CLI builds it before any model loads).

    max_new_tokens >= 1; gamma >= 0 drafts per round (0 = no drafting; the heuristic schedule's start);
    sampling: SamplingParams; gamma_schedule: one of schedule.SCHEDULES; verify: the name of an acceptance
    rule (acceptance.RULES). Raises ValueError naming the first bad option and its valid range, TypeError
    for an option of the wrong type (integers are Python or NumPy ints, never floats or bools).
    """

    max_new_tokens: int
    gamma: int = 4
    sampling: SamplingParams = SamplingParams()
    gamma_schedule: str = "constant"
    verify: str = "token"

    def __post_init__(self):
        check_integer(self.max_new_tokens, "max_new_tokens", 1)
        check_integer(self.gamma, "gamma", 0, " (0 = no drafting)")
        if self.gamma_schedule not in SCHEDULES:
            raise ValueError(f"gamma_schedule (--gamma-schedule) must be one of {', '.join(SCHEDULES)}, "
                             f"got {self.gamma_schedule!r}")
        get_rule(self.verify)

    @property
    def rule(self):
        """The acceptance Rule named by `verify`."""
        return get_rule(self.verify)


@dataclass
class Proposal:
    """What a drafter proposes in one round.

    ids `[k]`: the candidates; parents `[k]`: -1 (a child of the last id) or an earlier candidate;
    q: float64 `[k, n_vocab]`, row i the distribution ids[i] was drawn from, or None for a
    deterministic proposal (every row one-hot on its id: n-gram lookup, top-k children, greedy).
    extra_ids `[m]`, extra_parents `[m]`: non-candidate nodes scored in the same forward, each parent
    -1, a candidate or an earlier extra node (an index into ids + extra_ids); never accepted.
    """

    ids: list
    parents: list
    q: np.ndarray | None = None
    extra_ids: list = field(default_factory=list)
    extra_parents: list = field(default_factory=list)

    @classmethod
    def chain(cls, ids, q=None):
        """A chain of drafts: candidate i's parent is i - 1."""
        return cls([int(x) for x in ids], list(range(-1, len(ids) - 1)), q)

    def q_rows(self, n_vocab):  # -> [k, n_vocab] float64
        """q, with a deterministic proposal's one-hot rows built."""
        if self.q is not None:
            return self.q
        rows = np.zeros((len(self.ids), n_vocab))
        rows[np.arange(len(self.ids)), self.ids] = 1.0
        return rows


@dataclass
class Outcome:
    """What one round did, as the drafter learns it (Drafter.update) and the trace records it.

    path: the kept candidates, root down (cut after an accepted EOS); token: the corrected or bonus id
    (None when the round ended on an accepted EOS); emitted: the round's new ids; tested: candidates
    tested along the path (a rejected one included); drafted: candidates counted as drafted (all k,
    or the path when an EOS ended it). logits: `[1 + k + m, n_vocab]` float32, the target's verify rows
    (row 0 after the last id, row 1 + i after node i, extra nodes last); hidden: `[1 + k + m, n_embd]`
    their last hidden states when the drafter reads them, else None. gamma: the round's depth;
    p_drafts, q_drafts: each candidate's probability under the target's row at its parent and under
    its own q (one-hot at temperature 0); u_tests: the acceptance uniforms (None at temperature 0).
    """

    proposal: Proposal
    gamma: int
    path: list
    token: int | None
    emitted: list
    tested: int
    drafted: int
    logits: np.ndarray
    hidden: np.ndarray | None = None
    p_drafts: np.ndarray | None = None
    q_drafts: np.ndarray | None = None
    u_tests: np.ndarray | None = None
    seconds_draft: float = 0.0
    seconds_verify: float = 0.0
    tree: bool = False  # a tree drafter's round (the tree rule; no per-draft p, q, u in the trace)
    tree_attention: bool = False  # verified with tree attention (a tree, or extra nodes); KVCache.keep rolls it back

    @property
    def accepted(self):
        return len(self.path)

    @property
    def proposed(self):
        return len(self.proposal.ids)


@runtime_checkable
class Cache(Protocol):
    """A target's or draft's KV cache (npspec.model.gpt2.KVCache): `length` positions held, O(1) rollback."""

    length: int

    def rollback(self, length: int) -> None: ...

    def keep(self, rows: list, start: int) -> None: ...


@runtime_checkable
class Forwarder(Protocol):
    """What the loop needs of a model (npspec.model.model.Model, npspec.testing.TableModel, drafters.ControlledDraft).

    config: n_vocab, n_ctx, eos_token_id. forward(ids `[n_new]`, cache) -> logits `[n_new, n_vocab]`
    float32 of ids fed after cache.length; prefill(ids, cache) a prompt's forward.
    """

    config: object
    tokenizer: object
    source: str

    def new_cache(self) -> Cache: ...

    def forward(self, ids: np.ndarray, cache: Cache) -> np.ndarray: ...

    def prefill(self, ids: np.ndarray, cache: Cache) -> np.ndarray: ...


@runtime_checkable
class TreeForwarder(Forwarder, Protocol):
    """A Forwarder that verifies a tree: forward_tree(ids, parents, cache), parents[i] -1 or an earlier row, each
    row's logits after the cached ids and its path (tree attention)."""

    def forward_tree(self, ids: np.ndarray, parents: list, cache: Cache) -> np.ndarray: ...


@runtime_checkable
class HiddenForwarder(TreeForwarder, Protocol):
    """A Forwarder that also returns the last hidden state of every row (what EAGLE and Medusa heads read).

    forward_hidden / forward_tree_hidden return (logits `[n_new, n_vocab]` float32, hidden `[n_new, n_embd]`).
    """

    def forward_hidden(self, ids: np.ndarray, cache: Cache) -> tuple: ...

    def forward_tree_hidden(self, ids: np.ndarray, parents: list, cache: Cache) -> tuple: ...


@runtime_checkable
class Drafter(Protocol):
    """Who proposes the tokens a round verifies (after transformers' CandidateGenerator and vLLM's proposers).

    n_vocab, n_ctx (None: no limit of its own), tokenizer (None if it has none), source (a name for
    messages), forwards (draft forwards run so far). tree: its proposals are verified with tree
    attention and the tree rule (npspec.decode.rules.trees); a chain drafter's with the one-row forward and the
    chain rule. depth: the deepest round it drafts (None: the scheduled gamma's). reads_hidden: its
    update() reads Outcome.hidden. siblings: how a tree drafter draws a node's sampled children, "iid"
    (independent draws of the node's row), "distinct" (without replacement, npspec.decode.rules.draw_children) or
    "deterministic" (one-hot q); the tree rule must suit it (acceptance.Rule.siblings; a chain's is moot).
    tree_size(depth) -> how many candidates a round of that depth asks for (a chain: depth); the round draws
    that many drafting uniforms. start(prompt_ids) gets ready for a generation; propose(seq, depth, u
    `[tree_size(depth)]`, sampling) -> Proposal (a chain drafter may propose fewer, none included; a tree
    drafter exactly tree_size(depth)); update(outcome) learns from the round; rollback(length) forgets every
    position from `length` on (a no-op past its end).
    What a drafter must guarantee for the output to stay target-distributed: npspec.decode.drafters.
    """

    n_vocab: int
    n_ctx: int | None
    tokenizer: object
    source: str
    forwards: int
    tree: bool
    depth: int | None
    reads_hidden: bool
    siblings: str

    def tree_size(self, depth: int) -> int: ...

    def start(self, prompt_ids: list) -> None: ...

    def propose(self, seq: list, depth: int, u: np.ndarray, sampling: SamplingParams) -> Proposal: ...

    def update(self, outcome: Outcome) -> None: ...

    def rollback(self, length: int) -> None: ...


class BaseDrafter:
    """Defaults for a chain Drafter with no model of its own: no context limit, no tokenizer, no forwards, chains of
    `depth` drafts, nothing to learn or forget. Subclass it and write propose (npspec.decode.drafters.ngram)."""

    n_ctx = None
    tokenizer = None
    source = "drafter"
    forwards = 0
    tree = False
    depth = None
    reads_hidden = False
    siblings = "iid"

    def tree_size(self, depth):  # -> int
        """A chain's candidates: depth."""
        return depth

    def start(self, prompt_ids):
        """Nothing to prepare."""

    def update(self, outcome):
        """Nothing to learn."""

    def rollback(self, length):
        """Nothing to forget."""


@runtime_checkable
class Uniforms(Protocol):
    """The one source of randomness: an np.random.Generator, or a stand-in (npspec.testing.ScriptedRng)."""

    def random(self, n: int) -> np.ndarray: ...
