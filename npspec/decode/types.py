"""The types of a round: SamplingParams, Options, Proposal, Outcome, and the typing.Protocols a drafter (Drafter)
and a model (Forwarder, TreeForwarder, HiddenForwarder) implement. NOTE: letters as in Leviathan et al. 2023: `p`
the target's rows, `q` the draft's. Imports numpy and npspec.decode's sampling, rules and schedule."""

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from .sampling import check_integer, check_warp_args, warp
from .rules import get_rule
from .schedule import SCHEDULES


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are sampled, in transformers' order: temperature (0 = greedy: one-hot argmax rows), top_k (0 = off),
    top_p in (0, 1] (1 = off). ValueError naming a bad option and its range, TypeError for a wrong type."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        check_warp_args(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self):
        return self.temperature == 0

    def warp(self, logits):  # [..., n_vocab] float32 -> [..., n_vocab] float64
        """The rows a token is drawn from (npspec.decode.sampling.warp with these options)."""
        return warp(logits, self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True)
class Options:
    """What a generation is asked to do, validated once: max_new_tokens >= 1; gamma >= 0 drafts per round (0 = none);
    sampling; gamma_schedule (schedule.SCHEDULES); verify (a name in rules.RULES). ValueError naming the first bad
    option and its range, TypeError for a wrong type (integers are Python or NumPy ints, never floats or bools)."""

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
        return get_rule(self.verify)


@dataclass
class Proposal:
    """A drafter's proposal: ids `[k]`; parents `[k]` (-1: the last id, or an earlier candidate); q float64
    `[k, n_vocab]`, row i the law ids[i] was drawn from (checked: finite, >= 0, rows summing to 1 within
    checks.Q_TOLERANCE), or None (deterministic: one-hot rows); extra_ids `[m]`, extra_parents `[m]`: nodes
    scored in the same forward, each parent -1 or an earlier node of ids + extra_ids."""

    ids: list
    parents: list
    q: np.ndarray | None = None
    extra_ids: list = field(default_factory=list)
    extra_parents: list = field(default_factory=list)

    @classmethod
    def chain(cls, ids, q=None):
        return cls([int(x) for x in ids], list(range(-1, len(ids) - 1)), q)

    def q_rows(self, n_vocab):  # -> [k, n_vocab] float64
        if self.q is not None:
            return self.q
        rows = np.zeros((len(self.ids), n_vocab))
        rows[np.arange(len(self.ids)), self.ids] = 1.0
        return rows


@dataclass
class Outcome:
    """What a round did (Drafter.update reads it; the trace records it). path: the kept candidates, root down; token:
    the corrected or bonus id (None after an accepted EOS); emitted: its new ids; tested, drafted: candidates tested
    (a rejected one included) and drafted (cut after an EOS). logits `[1 + k + m, n_vocab]` float32, the verify's rows
    (row 1 + i after node i); hidden `[1 + k + m, n_embd]` or None; gamma: its depth; p_drafts, q_drafts: each
    draft's p and q (None for a tree); u_tests: its uniforms (None at temperature 0)."""

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
    """A KV cache (npspec.model.gpt2.KVCache): `length` positions held, O(1) rollback, keep(rows, start)."""

    length: int

    def rollback(self, length: int) -> None: ...

    def keep(self, rows: list, start: int) -> None: ...


@runtime_checkable
class Forwarder(Protocol):
    """What the loop needs of a model (npspec.model.model.Model, npspec.testing.TableModel): config (n_vocab, n_ctx,
    eos_token_id); forward(ids `[n_new]`, cache) -> logits `[n_new, n_vocab]` float32 after cache.length; prefill."""

    config: object
    tokenizer: object
    source: str

    def new_cache(self) -> Cache: ...

    def forward(self, ids: np.ndarray, cache: Cache) -> np.ndarray: ...

    def prefill(self, ids: np.ndarray, cache: Cache) -> np.ndarray: ...


@runtime_checkable
class TreeForwarder(Forwarder, Protocol):
    """forward_tree(ids, parents, cache): each row's logits after the cached ids and its path (tree attention)."""

    def forward_tree(self, ids: np.ndarray, parents: list, cache: Cache) -> np.ndarray: ...


@runtime_checkable
class HiddenForwarder(TreeForwarder, Protocol):
    """forward_hidden / forward_tree_hidden -> (logits `[n_new, n_vocab]`, hidden `[n_new, n_embd]`)."""

    def forward_hidden(self, ids: np.ndarray, cache: Cache) -> tuple: ...

    def forward_tree_hidden(self, ids: np.ndarray, parents: list, cache: Cache) -> tuple: ...


@runtime_checkable
class Drafter(Protocol):
    """Who proposes a round's tokens (after transformers' CandidateGenerator, vLLM's proposers): n_vocab; n_ctx (None:
    no limit); tokenizer, source; forwards (draft forwards so far); tree (verified by tree attention and a Rule's tree
    form); depth (None: gamma's); reads_hidden (update reads Outcome.hidden); siblings (how a tree's children are
    drawn, Rule.siblings). tree_size(depth): the candidates asked for; start(prompt_ids); propose(seq, depth, u
    `[tree_size(depth)]`, sampling) -> Proposal (a chain may propose fewer, a tree exactly tree_size(depth));
    update(outcome); rollback(length). Guarantees: npspec.decode.drafters."""

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
    """A chain Drafter's defaults with no model: no context limit, no tokenizer, nothing to learn or forget."""

    n_ctx = None
    tokenizer = None
    source = "drafter"
    forwards = 0
    tree = False
    depth = None
    reads_hidden = False
    siblings = "iid"

    def tree_size(self, depth):  # -> int
        return depth

    def start(self, prompt_ids):
        pass

    def update(self, outcome):
        pass

    def rollback(self, length):
        pass


@runtime_checkable
class Uniforms(Protocol):
    """The one source of randomness: an np.random.Generator, or a stand-in (npspec.testing.ScriptedRng)."""

    def random(self, n: int) -> np.ndarray: ...
