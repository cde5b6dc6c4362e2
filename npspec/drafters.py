"""Drafters: who proposes the tokens that one speculative round verifies.

A drafter is a small object (after transformers' `CandidateGenerator` and vLLM's proposers):
  n_vocab            the vocabulary its ids and rows use (must equal the target's);
  n_ctx              the context it can hold (None: no limit of its own);
  tokenizer, source  its tokenizer (None if it has none) and a name for messages;
  forwards           the draft forwards it has run (0 for a drafter without a model);
  start(prompt_ids)  get ready for a generation that starts with `[n_prompt]` ids;
  propose(seq, gamma, u, warp_args) -> (d, q)
                     up to gamma ids d (a list of k <= gamma ints) after the ids `seq`, and q, float64
                     `[k, n_vocab]`: row i is the distribution d[i] was drawn from. At temperature 0
                     q is None (the round compares ids with the target's argmax and needs no rows);
  update(proposed, accepted)  the round's outcome: how many it proposed, how many were kept;
  rollback(length)   forget every position from `length` on.

What a drafter must guarantee for the output to stay exactly target-distributed (the proof is
per position: notes/derivation.md, "Drafters"; tested by enumeration in tests/test_drafters_exact.py):
  1. q[i] is exactly the distribution d[i] was drawn from, given everything before it, the decision
     to propose a token at position i included. A deterministic proposer (n-gram lookup) reports a
     one-hot row: the test then keeps d with probability p(d), and the residual is p without d,
     renormalised. Drawing a token and then withholding it depending on the token breaks this.
  2. Whether it proposes a token at position i may depend on anything fixed before d[i] is drawn:
     the ids so far, earlier rounds' outcomes, its own earlier draws and rows in this round
     (confidence stopping looks at q[i-1]). It never depends on the round's acceptance tests,
     which the drafter never sees: the round draws their uniforms separately (README,
     Reproducibility).
  3. It draws d[i] from q[i] with u[i] alone (npspec.sampling.sample), so a run is reproducible.
     A deterministic drafter ignores u.
How many it proposes may be fewer than gamma, none included: the round then verifies what was
proposed (no proposal is one plain target step).

Two chain drafters: `ModelDrafter` (a smaller model, optionally with confidence stopping,
llama.cpp's `--draft-p-min`) and `NgramDrafter` (prompt lookup: Saxena 2023; transformers'
`prompt_lookup_num_tokens`; vLLM's `ngram`). A tree drafter (`TreeDrafter`, `DynamicTreeDrafter`) has
`propose_tree(seq, depth, u, warp_args) -> (ids, parents, q)` and `tree_size(depth)` instead of
`propose` (npspec.trees: the same guarantees, per node). Imports npspec.gpt2, npspec.sampling
and npspec.trees.
"""

import numpy as np

from .gpt2 import softmax
from .sampling import check_integer, greedy, sample, warp
from .trees import MAX_TREE_NODES, branching_tree, children, depths, grow_tree

MAX_NGRAM = 64  # policy: the longest n-gram NgramDrafter matches (--ngram-max); README's option table says it


class DraftModelCache:
    """What every drafter built on a draft model shares: the model's attributes, its KV cache, start, rollback."""

    def __init__(self, model):
        if not all(hasattr(model, a) for a in ("config", "new_cache", "forward", "prefill")):
            raise TypeError(f"a draft model must be an npspec Model (npspec.load(spec, role='draft')), got "
                            f"{type(model).__name__} {model!r:.60}; for prompt lookup use "
                            "NgramDrafter(n_vocab, eos_token_id)")
        self.model = model
        self.n_vocab, self.n_ctx = model.config.n_vocab, model.config.n_ctx
        self.tokenizer, self.source = model.tokenizer, model.source
        self.forwards, self.cache = 0, None

    def start(self, prompt_ids):  # [n_prompt] ids
        """A fresh cache holding every prompt id but the last (as the target's)."""
        self.cache = self.model.new_cache()
        if len(prompt_ids) > 1:
            self.model.prefill(np.asarray(prompt_ids[:-1]), self.cache)
            self.forwards += 1

    def step(self, ids):  # [n] ids -> [n_vocab] float32
        """One draft forward: feed `ids` after the cache and return the logits after the last of them."""
        self.forwards += 1
        return self.model.forward(np.asarray(ids), self.cache)[-1]

    def update(self, proposed, accepted):
        """Nothing to learn: a draft model does not adapt."""

    def rollback(self, length):
        """Forget cached positions from `length` on (O(1))."""
        self.cache.rollback(length)


class ModelDrafter(DraftModelCache):
    """A draft model as a drafter: d_i ~ q_i = warp(the model's logits), one forward per token.

    model: an npspec Model (or anything with config, tokenizer, source, new_cache, forward, prefill).
    p_min: confidence stopping (llama.cpp `--draft-p-min`): after proposing d_i, stop if the
    largest probability of the row it was drawn from is below p_min (d_i itself is still
    proposed). The row is q_i after warping; at temperature 0, where that row is one-hot, the
    model's softmax at temperature 1. 0 (default) = never stop early. Raises ValueError for
    p_min outside [0, 1].
    """

    def __init__(self, model, p_min=0.0):
        check_p_min(p_min)
        super().__init__(model)
        self.p_min = float(p_min)

    def __repr__(self):
        return f"ModelDrafter({self.source!r}, p_min={self.p_min})"

    def propose(self, seq, gamma, u, warp_args):  # list[int], int, [>= gamma] -> (list[int] [k], [k, n_vocab] | None)
        """Draw up to gamma tokens after seq, one forward each; see the module docstring.

        The cache is first rolled back to what seq still agrees with (what the last round
        kept), so nothing is copied. At temperature 0 each d_i is the argmax (q is None).
        """
        self.rollback(min(self.cache.length, len(seq) - 1))
        ctx, d, q = list(seq), [], []
        greedy_round = warp_args.get("temperature", 1.0) == 0
        for i in range(gamma):
            logits = self.step(ctx[self.cache.length:])
            if greedy_round:
                token, top = int(greedy(logits)), (softmax(logits.astype(np.float64)).max() if self.p_min else 1.0)
            else:
                row = warp(logits, **warp_args)
                token, top = sample(row, u[i]), row.max()
                q.append(row)
            d.append(token)
            ctx.append(token)
            if top < self.p_min:  # confidence stopping: this token is proposed, no more
                break
        return d, (None if greedy_round else np.array(q).reshape(len(d), self.n_vocab))


class NgramDrafter:
    """Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of the last n ids.

    For n from ngram_max down to ngram_min: if the last n ids of seq occurred earlier (ending
    before the last position, so something followed them), propose the up to gamma ids that
    followed the MOST RECENT such occurrence, cut after the first EOS (eos_token_id), never past
    the end of seq; the first n that matches decides. No match: no proposal. q is one-hot.
    Defaults follow llama.cpp's lookup (n-gram sizes 1..4); transformers calls ngram_max
    `max_matching_ngram_size`, vLLM `prompt_lookup_max`.

    Cost: an index per n from n-gram to its latest end, updated as ids are appended, so a round
    costs O((ngram_max - ngram_min + 1) * ngram_max) per new id plus the same per lookup, with
    no scan of the sequence (bench/ngram.py measures it at n_ctx). Raises ValueError for sizes
    < 1 or > MAX_NGRAM, ngram_min > ngram_max, an n_vocab < 1 or an eos_token_id outside [0, n_vocab)
    (TypeError for a non-integer).
    """

    forwards = 0
    n_ctx = None
    tokenizer = None
    source = "ngram"

    def __init__(self, n_vocab, eos_token_id=None, ngram_min=1, ngram_max=4):
        check_ngram_sizes(ngram_min, ngram_max)
        check_integer(n_vocab, "NgramDrafter's n_vocab", 1, " (the target's vocabulary: target.config.n_vocab)")
        if eos_token_id is not None:
            check_integer(eos_token_id, "NgramDrafter's eos_token_id", 0, " or None (target.config.eos_token_id)")
            if eos_token_id >= n_vocab:
                raise ValueError(f"NgramDrafter's eos_token_id ({eos_token_id}) is not an id of its vocabulary of "
                                 f"{n_vocab}; pass target.config.eos_token_id")
        self.n_vocab, self.eos = int(n_vocab), eos_token_id
        self.sizes = range(ngram_max, ngram_min - 1, -1)
        self.ids, self.index = [], {n: {} for n in self.sizes}

    def __repr__(self):
        return f"NgramDrafter(ngram_min={self.sizes[-1]}, ngram_max={self.sizes[0]})"

    def start(self, prompt_ids):  # [n_prompt] ids
        """Forget any earlier generation."""
        self.ids, self.index = [], {n: {} for n in self.sizes}

    def _append(self, ids):  # index the n-grams ending before each new position
        for token in ids:
            end = len(self.ids)  # the n-gram seq[end - n:end] is followed by `token`
            for n in self.sizes:
                if end >= n:
                    self.index[n][tuple(self.ids[end - n:end])] = end
            self.ids.append(int(token))

    def lookup(self, seq, gamma):  # list[int], int -> list[int]
        """The ids this drafter proposes after seq: the continuation of the latest match (see the class)."""
        if len(seq) < len(self.ids) or seq[len(self.ids) - 1:len(self.ids)] != self.ids[-1:]:
            self.rollback(0)  # not the sequence it indexed: start over
        self._append(seq[len(self.ids):])
        for n in self.sizes:
            if len(seq) > n:
                end = self.index[n].get(tuple(seq[len(seq) - n:]))
                if end is not None:
                    return cut_after(seq[end:end + gamma], self.eos)
        return []

    def propose(self, seq, gamma, u, warp_args):  # list[int], int, [>= gamma] -> (list[int] [k], [k, n_vocab] | None)
        """The lookup's ids with one-hot q rows (None at temperature 0); u is not used."""
        d = self.lookup(seq, gamma)
        if warp_args.get("temperature", 1.0) == 0:
            return d, None
        q = np.zeros((len(d), self.n_vocab))
        q[np.arange(len(d)), d] = 1.0
        return d, q

    def update(self, proposed, accepted):
        """Nothing to learn."""

    def rollback(self, length):
        """Forget indexed ids from `length` on (rebuilds the index: O(length); the loop never needs it)."""
        if length < len(self.ids):
            ids = self.ids[:length]
            self.start(ids)
            self._append(ids)


class TreeDrafter(DraftModelCache):
    """A draft model proposing a token tree with a static branching per depth (npspec.trees).

    branching: children per node at each depth, e.g. (3, 2, 1). kind: "sampled" (each node's
    children drawn i.i.d. from the draft's warped row at the node, q = that row) or "top-k" (the
    row's most likely ids, ties to the lower id, each with a one-hot q). At temperature 0 both
    take the top-k ids of the logits (q is None). One draft forward per node that has children,
    depth first, rolling the cache back after each subtree. Raises ValueError for a bad
    branching or kind.
    """

    def __init__(self, model, branching, kind="sampled"):
        if kind not in ("sampled", "top-k"):
            raise ValueError(f"a tree's kind must be sampled or top-k, got {kind!r}")
        super().__init__(model)
        self.kind, self.branching = kind, tuple(branching)
        self.parents = branching_tree(self.branching)
        self.depth_of = depths(self.parents)

    def __repr__(self):
        return f"TreeDrafter({self.source!r}, branching={list(self.branching)}, kind={self.kind!r})"

    @property
    def depth(self):
        return len(self.branching)

    def tree_size(self, depth):  # -> int
        """Nodes of the tree cut at `depth` (the tree's first levels)."""
        return sum(d <= depth for d in self.depth_of)

    def propose_tree(self, seq, depth, u, warp_args):  # -> (list[int] [N], list[int] [N], [N, n_vocab] | None)
        """The tree cut at `depth` after seq: ids, parents (-1: a child of seq's last id) and the rows q.

        u: `[N]` uniforms, u[i] draws node i (sampled kind). Nodes come in npspec.trees.branching_tree's
        order (depth by depth).
        """
        parents = self.parents[:self.tree_size(depth)]
        kids = children(parents)
        greedy_round = warp_args.get("temperature", 1.0) == 0
        ids, q = [0] * len(parents), [None] * len(parents)
        self.rollback(min(self.cache.length, len(seq) - 1))

        def expand(node, logits):
            if not kids[node]:
                return
            row = None if greedy_round else warp(logits, **warp_args)
            ranked = np.argsort(-(logits if greedy_round else row), kind="stable")
            for j, c in enumerate(kids[node]):
                if greedy_round or self.kind == "top-k":
                    ids[c] = int(ranked[j])
                    if row is not None:
                        q[c] = np.eye(1, self.n_vocab, ids[c], dtype=np.float64)[0]
                else:
                    ids[c], q[c] = sample(row, u[c]), row
            for c in kids[node]:
                if kids[c]:
                    length = self.cache.length
                    expand(c, self.step([ids[c]]))
                    self.rollback(length)

        expand(-1, self.step(seq[self.cache.length:]))
        return ids, list(parents), (None if greedy_round else np.array(q).reshape(len(parents), self.n_vocab))



class DynamicTreeDrafter(DraftModelCache):
    """A draft model proposing a dynamic tree of `budget` nodes, grown best first by cumulative draft
    probability (EAGLE-2's idea; npspec.trees.grow_tree): each node offers its `max_children` most likely ids.

    Children are deterministic, so each is tested with a one-hot q. Ranking uses the draft's warped
    row (its softmax at temperature 1 when temperature is 0). One draft forward per node that may
    get children, feeding its path after the prefix. Raises ValueError for budget or max_children < 1,
    or a budget over MAX_TREE_NODES (npspec.trees).
    """

    def __init__(self, model, budget, max_children=4):
        for name, v in (("budget", budget), ("max_children", max_children)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"a dynamic tree's {name} must be an integer >= 1, got {v!r}")
        if budget > MAX_TREE_NODES:
            raise ValueError(f"a dynamic tree's budget (--tree-budget) is at most {MAX_TREE_NODES} nodes, the largest "
                             f"tree npspec drafts, got {budget}; give a smaller budget such as 16")
        super().__init__(model)
        self.budget, self.max_children = int(budget), int(max_children)
        self.depth = self.budget  # at most a chain of budget nodes

    def __repr__(self):
        return f"DynamicTreeDrafter({self.source!r}, budget={self.budget}, max_children={self.max_children})"

    def tree_size(self, depth):  # -> int
        """The nodes grown with depth at most `depth`: the budget, or all max_children-ary nodes that fit."""
        k = min(self.max_children, self.n_vocab)
        return min(self.budget, sum(k ** d for d in range(1, depth + 1)))

    def propose_tree(self, seq, depth, u, warp_args):  # -> (list[int] [N], list[int] [N], [N, n_vocab] | None)
        """The tree (ids, parents, q) grown to tree_size(depth) nodes after seq; u is not used."""
        greedy_round = warp_args.get("temperature", 1.0) == 0
        self.rollback(min(self.cache.length, len(seq) - 1))
        root = self.step(seq[self.cache.length:])
        base = self.cache.length

        def row_at(path):
            if path:
                self.rollback(base)
                logits = self.step(list(path))
            else:
                logits = root
            return softmax(logits.astype(np.float64)) if greedy_round else warp(logits, **warp_args)

        ids, parents = grow_tree(row_at, self.tree_size(depth), self.max_children, depth)
        self.rollback(base)
        if greedy_round:
            return ids, parents, None
        q = np.zeros((len(ids), self.n_vocab))  # one-hot rows, built row by row (np.eye(n_vocab) is n_vocab**2)
        q[np.arange(len(ids)), ids] = 1.0
        return ids, parents, q


def cut_after(ids, eos):  # list[int] -> list[int]
    """ids up to and including the first `eos` (all of them if eos is None or absent)."""
    return ids[:ids.index(eos) + 1] if eos is not None and eos in ids else list(ids)


def ngram_scan(seq, gamma, ngram_min=1, ngram_max=4, eos=None):  # list[int] -> list[int]
    """NgramDrafter's proposal by a plain scan of seq, O(len(seq) * ngram_max): the reference the index is tested against."""
    for n in range(ngram_max, ngram_min - 1, -1):
        if len(seq) > n:
            key = list(seq[len(seq) - n:])
            for end in range(len(seq) - 1, n - 1, -1):  # latest first; end < len(seq): something follows
                if list(seq[end - n:end]) == key:
                    return cut_after(list(seq[end:end + gamma]), eos)
    return []


def check_p_min(p_min):
    """Raise ValueError unless 0 <= p_min <= 1."""
    if isinstance(p_min, bool) or not isinstance(p_min, (int, float, np.floating, np.integer)) or not 0 <= p_min <= 1:
        raise ValueError(f"p_min (--draft-p-min) must be a probability in [0, 1], got {p_min!r}; 0 turns it off")


def check_ngram_sizes(ngram_min, ngram_max):
    """Raise ValueError unless both are integers in [1, MAX_NGRAM] and ngram_min <= ngram_max."""
    for name, v in (("ngram_min", ngram_min), ("ngram_max", ngram_max)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} (--{name.replace('_', '-')}) must be an integer >= 1, got {v!r}")
        if v > MAX_NGRAM:
            raise ValueError(f"{name} (--{name.replace('_', '-')}) is at most {MAX_NGRAM}, the longest n-gram npspec "
                             f"matches (each is indexed at every position), got {v}; give a smaller size such as 4")
    if ngram_min > ngram_max:
        raise ValueError(f"ngram_min ({ngram_min}) is larger than ngram_max ({ngram_max}); "
                         "give --ngram-min <= --ngram-max")
