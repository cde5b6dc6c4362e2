"""Every check of a generation, each called once (options in Options, pair, prompt, rng in loop.prepare, a round's
uniforms as it draws them, a proposal in the round); errors are one line naming the problem and the fix. Imports
numpy, npspec.model.gpt2, npspec.decode."""

import types
from collections.abc import Sequence

import numpy as np

from ..model.gpt2 import ContextOverflowError
from .sampling import check_integer
from .text import same_tokenizer
from .rules import RULES, SIBLINGS
from .types import Forwarder, HiddenForwarder, Proposal, TreeForwarder, Uniforms


def check_target(target):
    """TypeError unless `target` is a model (a Forwarder)."""
    if not isinstance(target, Forwarder):
        raise TypeError(f"target must be an npspec Model (npspec.load(spec) or npspec.random_model(shape)), got "
                        f"{type(target).__name__} {target!r:.60}")


def check_draft(draft):
    """TypeError for a draft that is neither a model, a Drafter nor None (a str points to NgramDrafter)."""
    if isinstance(draft, str):
        raise TypeError(f"draft must be a Model, a drafter (npspec.decode.drafters) or None, got the str "
                        f"{draft!r:.60}; load a model with npspec.load(spec, role='draft'), or for prompt lookup pass "
                        "npspec.NgramDrafter(target.config.n_vocab, target.config.eos_token_id)")
    raise TypeError(f"draft must be a Model, a drafter (npspec.decode.drafters) or None, got {type(draft).__name__} "
                    f"{draft!r:.60}")


def check_pair(target, drafter):
    """ValueError unless `drafter` can speak for `target`: the same n_vocab and, when both have one, the same tokenizer
    (text.same_tokenizer); a tree drafter needs a TreeForwarder and a tree that fits in n_ctx - 1; a drafter that
    reads hidden states needs a HiddenForwarder."""
    if drafter.n_vocab != target.config.n_vocab:
        raise ValueError(f"draft vocabulary ({drafter.n_vocab}) differs from the target's "
                         f"({target.config.n_vocab}); pick a draft with the target's tokenizer")
    a, b = target.tokenizer, drafter.tokenizer
    if a is not None and b is not None and not same_tokenizer(a, b):
        raise ValueError(f"the draft ({drafter.source}) and target ({target.source}) use different tokenizers; "
                         "pick a draft trained with the target's tokenizer")
    if drafter.tree and not isinstance(target, TreeForwarder):
        raise ValueError(f"the drafter {drafter.source} proposes token trees, which the target {target.source} cannot "
                         "verify (forward_tree); draft chains or pick a target that does")
    if drafter.reads_hidden and not isinstance(target, HiddenForwarder):
        raise ValueError(f"the drafter {drafter.source} reads the target's hidden states, which the target "
                         f"{target.source} does not return (forward_hidden); pick a target that does")
    if drafter.tree:
        n_ctx, nodes = context_size(target, drafter), drafter.tree_size(drafter.depth)
        if nodes > n_ctx - 1:
            raise ValueError(f"the draft tree has {nodes} nodes but the context holds {n_ctx} ids, and a round "
                             f"verifies the last id and every node at once: give a tree of at most {n_ctx - 1} nodes")


def check_rule(rule, drafter):
    """ValueError if a tree drafter meets a rule without a tree form, or one lossless only for children drawn otherwise
    (Rule.siblings against Drafter.siblings; deterministic children suit every tree form)."""
    if drafter is None or not drafter.tree:
        return
    if rule.tree is None:
        raise ValueError(f"the {rule.name} rule (--verify {rule.name}) verifies chains only, and the drafter "
                         f"{drafter.source} proposes trees; draft a chain or use --verify token")
    if drafter.siblings not in (rule.siblings, "deterministic"):
        fits = [name for name, other in RULES.items() if other.tree is not None and other.siblings == drafter.siblings]
        raise ValueError(f"the {rule.name} rule (verify={rule.name!r}) is lossless only for {SIBLINGS[rule.siblings]}, "
                         f"and {type(drafter).__name__} proposes {SIBLINGS.get(drafter.siblings, drafter.siblings)}: "
                         f"use verify={' or '.join(map(repr, fits)) or 'a rule for them'} (the CLI's --verify picks "
                         "the tree drafter to match)")


def context_size(target, drafter):
    """The context a generation can use: the smaller of the target's n_ctx and the drafter's (None: no limit)."""
    if drafter is None or drafter.n_ctx is None:
        return target.config.n_ctx
    return min(target.config.n_ctx, drafter.n_ctx)


def check_rng(rng):
    """TypeError unless rng is None, an int seed or a source of uniforms (Uniforms; not a module such as `random`
    or np.random.RandomState); ValueError for a negative seed."""
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        check_integer(rng, "rng (an int seed)", 0, " or an np.random.Generator")
    elif isinstance(rng, (types.ModuleType, np.random.RandomState)) or not (rng is None or isinstance(rng, Uniforms)):
        raise TypeError(f"rng must be an np.random.Generator or an int seed, got {rng!r:.60} (a {type(rng).__name__}); "
                        "pass np.random.default_rng(seed) or a seed >= 0")


def drawn_uniforms(rng, n):  # -> [n] float64
    """`rng.random(n)` as a float64 array, checked: raise ValueError unless it holds n numbers (a source of uniforms
    that returns fewer or more would leave a draft, a test or the final draw without its uniform)."""
    u = rng.random(n)
    try:
        out = np.asarray(u, dtype=np.float64)
    except (TypeError, ValueError):
        out = None
    if out is None or out.shape != (n,):
        got = f"an array of shape {out.shape}" if out is not None else f"{type(u).__name__} {u!r:.40}"
        raise ValueError(f"rng.random({n}) returned {got}, expected shape ({n},): the rng must return n uniforms "
                         "in [0, 1) for random(n), as np.random.Generator does")
    return out


def check_prompt(prompt_ids, n_ctx, n_vocab):
    """TypeError unless prompt_ids is a 1-D sequence of integer ids (not bools or floats); ValueError if empty or an id
    is outside [0, n_vocab); ContextOverflowError unless it leaves room for a new token (at most n_ctx - 1 ids)."""
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


def check_proposal(proposal, n_asked, n_vocab, sampling, tree):
    """Raise TypeError unless a drafter's propose returned a Proposal, ValueError unless it is well formed.

    A chain drafter's: at most n_asked ids, parents [-1, 0, 1, ...]; a tree drafter's: exactly n_asked nodes, each
    parent -1 or an earlier node. Every id, extra ones included, in [0, n_vocab); extra parents -1 or an earlier
    node of ids + extra_ids. When sampling (temperature > 0) and q is given: a float array `[k, n_vocab]` with
    q[i, ids[i]] > 0 (a token it cannot have drawn is a drafter bug), each row a distribution (q_problem: finite,
    >= 0, summing to 1 within Q_TOLERANCE, 1e-6 for float64 rows, 1e-4 for float32); q None is a deterministic
    proposal.
    """
    if not isinstance(proposal, Proposal):
        raise TypeError(f"a drafter's propose must return an npspec.decode.Proposal (the Drafter protocol, "
                        f"npspec.decode.types.Drafter; a chain's is Proposal.chain(ids, q)), got "
                        f"{type(proposal).__name__} {proposal!r:.60}")
    ids, parents = list(proposal.ids), list(proposal.parents)
    if tree and (len(ids) != n_asked or len(parents) != n_asked or any(not -1 <= p < i for i, p in enumerate(parents))):
        raise ValueError(f"the tree drafter proposed {len(ids)} ids with parents {parents}: {n_asked} nodes, "
                         "each parent -1 or an earlier node, were asked for")
    if len(ids) > n_asked or any(not 0 <= int(x) < n_vocab for x in ids + list(proposal.extra_ids)):
        raise ValueError(f"the drafter proposed {ids}: at most {n_asked} ids in [0, {n_vocab}) were asked for")
    if not tree and parents != list(range(-1, len(ids) - 1)):
        raise ValueError(f"the chain drafter proposed parents {parents}: a chain's are [-1, 0, 1, ...] "
                         "(a drafter of trees says tree = True)")
    check_extra(proposal, len(ids))
    q = proposal.q
    if sampling.greedy or not ids or q is None:
        return
    if not isinstance(q, np.ndarray) or q.dtype.kind not in "fiu":
        raise ValueError(f"the drafter's q is {type(q).__name__} {q!r:.40}; it must be a float array [k, n_vocab] "
                         "of the rows the ids were drawn from (or None for a deterministic proposal)")
    if q.shape != (len(ids), n_vocab) or not np.all(q[np.arange(len(ids)), ids] > 0):
        raise ValueError(f"the drafter's q has shape {np.shape(q)} or gives a proposed id probability 0; it must be "
                         f"the [{len(ids)}, {n_vocab}] rows the ids were drawn from (or None for a deterministic "
                         "proposal)")
    if problem := q_problem(q):
        raise ValueError(problem)


Q_TOLERANCE = {"float64": 1e-6, "float32": 1e-4}  # |a q row's sum - 1| allowed (the sum is 1: relative = absolute)


def q_problem(q):
    """What makes the rows of q `[k, n_vocab]` not probability distributions, one line, or None: every entry must be
    finite and >= 0, every row sum 1 within Q_TOLERANCE (float32 rows and narrower: 1e-4; float64 and integer rows:
    1e-6), summed in float64. Two vectorised passes (a min and a row sum): nothing in Python per entry."""
    tol = Q_TOLERANCE["float32" if q.dtype.kind == "f" and q.dtype.itemsize <= 4 else "float64"]
    sums = q.sum(axis=1, dtype=np.float64)
    if q.min() >= 0 and np.all(np.abs(sums - 1) <= tol):  # a NaN fails both comparisons, an inf the second
        return None
    lows = q.min(axis=1)
    i = int(np.flatnonzero(~((lows >= 0) & (np.abs(sums - 1) <= tol)))[0])
    what = ("holds NaN or inf" if not np.all(np.isfinite(q[i])) else f"holds {lows[i]:.6g} < 0" if lows[i] < 0
            else f"sums to {sums[i]:.9g}")
    return (f"the drafter's q row {i} {what}: each row must be the distribution its id was drawn from, finite, >= 0 "
            f"and summing to 1 within {tol:g} ({q.dtype} rows)")


def check_extra(proposal, k):
    """ValueError unless each non-candidate node has one parent, -1 or an earlier node."""
    extra, parents = list(proposal.extra_ids), list(proposal.extra_parents)
    if len(extra) != len(parents) or any(not -1 <= p < k + j for j, p in enumerate(parents)):
        raise ValueError(f"the drafter's extra nodes {extra} have parents {parents}: one each, -1 or an earlier "
                         "node of ids + extra_ids")
