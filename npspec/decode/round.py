"""One speculative round: propose -> verify -> accept -> roll back (Leviathan et al. 2023, Algorithm 1). NOTE:
letters as in Leviathan et al.: `p` is the TARGET's distribution, `q` the DRAFT's (Chen et al. 2023 swap them);
`gamma` is the drafts per round (a tree's depth). Every round is a tree (a chain's parents: -1, 0, 1, ...); the one
place greedy is handled (temperature 0: keep the drafts equal to the target's argmax). A round draws 2n + 1
uniforms, n = drafter.tree_size(depth): u[:n] for drafting, u[n + i] tests candidate i, u[2n] the last sample,
whatever is proposed or kept. Imports numpy and npspec.decode's modules."""

import time

import numpy as np

from .sampling import greedy
from .rules.trees import accept_tree_greedy, children
from .checks import check_proposal, drawn_uniforms
from .types import Outcome, Proposal


def play(target, cache, drafter, seq, depth, rng, sampling, rule):
    """One round after the ids `seq` (not changed): its Outcome, EOS not yet cut (finish). target: a Forwarder whose
    cache holds seq[:-1]; drafter: a Drafter or None; depth: the clamped gamma; rule: an acceptance Rule."""
    n = drafter.tree_size(depth) if drafter is not None and depth else 0
    u = drawn_uniforms(rng, 2 * n + 1)
    t1 = time.perf_counter()
    proposal = propose(drafter, seq, depth, u[:n], sampling, target.config.n_vocab)
    t2 = time.perf_counter()
    k, tree = len(proposal.ids), drafter is not None and drafter.tree  # a tree drafter's round: the tree rule
    attention = tree or bool(proposal.extra_ids)  # verified with tree attention, rolled back with KVCache.keep
    hidden = drafter is not None and drafter.reads_hidden
    logits, states = verify(target, cache, seq, proposal, attention, hidden)
    path, token, p_drafts, q_drafts, u_tests = accept(proposal, logits, sampling, rule, tree, u[n:n + k], u[2 * n],
                                                      target.config.n_vocab)
    t3 = time.perf_counter()
    return Outcome(proposal, depth, path, token, [proposal.ids[i] for i in path] + [token], 0, k, logits, states,
                   p_drafts, q_drafts, u_tests, t2 - t1, t3 - t2, tree, attention)


def propose(drafter, seq, depth, u, sampling, n_vocab):  # -> Proposal
    """Step 1: the drafter's Proposal of up to len(u) candidates (none: the empty chain), checked."""
    if not len(u):
        return Proposal([], [])
    proposal = drafter.propose(list(seq), depth, u, sampling)
    check_proposal(proposal, len(u), n_vocab, sampling, drafter.tree)
    return proposal


def verify(target, cache, seq, proposal, tree, hidden):  # -> (logits [1 + k + m, n_vocab] float32, hidden or None)
    """Step 2: ONE target forward over [seq[-1]] + candidates + extra nodes after cache.length = len(seq) - 1; tree
    attention when `tree`; hidden: also each row's last hidden state (HiddenForwarder)."""
    nodes = np.asarray([seq[-1]] + list(proposal.ids) + list(proposal.extra_ids))
    if tree:
        parents = list(proposal.parents) + list(proposal.extra_parents)
        rows = [-1] + [parent + 1 if parent >= 0 else 0 for parent in parents]  # row 0 is seq's last id
        if hidden:
            return target.forward_tree_hidden(nodes, rows, cache)
        return target.forward_tree(nodes, rows, cache), None
    return target.forward_hidden(nodes, cache) if hidden else (target.forward(nodes, cache), None)


def accept(proposal, logits, sampling, rule, tree, u_tests, u_final, n_vocab):
    """Step 3: (path, token, p_drafts, q_drafts, u_tests). logits: row 0 after the last id, row 1 + i after candidate
    i. At temperature 0 the path follows the argmax; else rule.tree (tree) or rule.chain on p = the warped rows and q.
    p_drafts, q_drafts: each draft's p at its parent's row and its q (None for a tree); u_tests: None when greedy."""
    ids, parents, k = list(proposal.ids), list(proposal.parents), len(proposal.ids)
    d, at = np.array(ids, dtype=np.int64), np.array([parent + 1 for parent in parents], dtype=np.int64)
    if sampling.greedy:
        best = greedy(logits[:k + 1])
        path, token = accept_tree_greedy(ids, parents, best)
        return path, token, None if tree else (d == best[at]).astype(np.float64), None if tree else np.ones(k), None
    p, q = sampling.warp(logits[:k + 1]), proposal.q_rows(n_vocab)
    if tree:
        path, token = rule.tree(ids, parents, q, p, u_tests, u_final)
        return path, token, None, None, u_tests
    n, token = rule.chain(d, p, q, u_tests, u_final)
    return list(range(n)), token, p[at, d], q[np.arange(k), d], u_tests


def finish(outcome, eos):  # -> Outcome
    """Cut the path and the emitted ids after an EOS; count what was tested (the path, and the rejected candidate
    unless the walk ended at a leaf) and drafted."""
    path, emitted = outcome.path, outcome.emitted
    if eos is not None and eos in emitted:
        emitted = emitted[:emitted.index(eos) + 1]
    if len(emitted) <= len(path):  # an accepted draft was EOS: the round ends there
        outcome.path, outcome.token = path[:len(emitted)], None
        outcome.tested = outcome.drafted = len(emitted)
    else:
        at_leaf = not children(outcome.proposal.parents)[path[-1] if path else -1]
        outcome.tested = len(path) + (not at_leaf)
    outcome.emitted = emitted
    return outcome


def roll_back(cache, drafter, length, outcome):
    """Step 4: the target's cache keeps the `length` ids before the round and the emitted ones but the last (a tree's
    kept path moved in place first: KVCache.keep); the drafter forgets every position from there on."""
    if outcome.tree_attention:
        cache.keep([length + i for i in outcome.path], length)  # node i was fed at position length + i
    end = length + len(outcome.emitted) - 1
    cache.rollback(end)
    if drafter is not None:
        drafter.rollback(end)
