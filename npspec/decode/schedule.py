"""How many drafts a round asks for: the budget and context clamp (round_gamma), the gamma schedule (next_gamma)
and a round's depth (tree_depth: the clamp of a drafter's depth and of its tree's size). Imports nothing of npspec.
"""

SCHEDULES = ("constant", "heuristic")


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


def tree_depth(drafter, g, n_ctx, length):  # -> int
    """A round's depth: at most g (round_gamma's clamp) and the drafter's own depth (None: no limit), and small
    enough that the verify's 1 + tree_size(depth) rows fit in the context after `length` ids. For a chain
    (tree_size(g) = g) that is g itself: round_gamma already left room."""
    depth = g if drafter.depth is None else min(g, drafter.depth)
    while depth and length + drafter.tree_size(depth) > n_ctx:
        depth -= 1
    return depth
