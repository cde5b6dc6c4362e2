"""How many drafts a round asks for: the budget and context clamp (round_gamma), the gamma schedule (next_gamma),
a round's depth (tree_depth). Imports nothing of npspec."""

SCHEDULES = ("constant", "heuristic")


def round_gamma(gamma, remaining, n_ctx, length):  # -> int
    """min(gamma, remaining - 1, n_ctx - length - 1): a round emits at most g + 1 ids (n_ctx None: no limit;
    remaining: ids max_new_tokens still allows; length: ids so far). g = 0 is a plain target step."""
    if n_ctx is None:
        return min(gamma, remaining - 1)
    return min(gamma, remaining - 1, n_ctx - length - 1)


def next_gamma(schedule, gamma, accepted):  # -> int
    """The next round's gamma: "constant" keeps it; "heuristic" is transformers' (update_candidate_strategy): gamma + 2
    if the round kept all it scheduled, else max(1, gamma - 1). It reads only past rounds, so the law is unchanged."""
    if schedule == "constant":
        return gamma
    return gamma + 2 if accepted == gamma else max(1, gamma - 1)


def tree_depth(drafter, g, n_ctx, length):  # -> int
    """A round's depth: at most g and the drafter's depth, with 1 + tree_size(depth) verify rows fitting in n_ctx after
    `length` ids (for a chain, g itself)."""
    depth = g if drafter.depth is None else min(g, drafter.depth)
    while depth and length + drafter.tree_size(depth) > n_ctx:
        depth -= 1
    return depth
