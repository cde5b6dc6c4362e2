"""Acceptance rules, step 3 of a round: the registry RULES, name -> Rule, read by verify= and --verify. NOTE: letters
as in Leviathan et al. 2023: `p` the target's rows, `q` the draft's. A Rule's chain form has token.accept's signature,
its tree form (None: chains only) trees.accept_tree's; sampled rounds only (temperature 0: npspec.decode.round.accept).
"token": rejection sampling (token.py; trees.py); "block": block verification (block.py); "rsd": siblings without
replacement (rsd.py), the token rule on a chain; "exact-match": the target's own sample (exact_match.py);
"traversal": a tree of siblings without replacement (or deterministic) leaves up, block verification on a chain
(traversal.py). Proofs: notes/derivation.md, claims 1, 9, 10, 11, 12. Imports numpy and npspec.decode.sampling."""

from collections.abc import Callable
from dataclasses import dataclass

from .block import block_accept, block_thresholds, block_weights
from .exact_match import exact_match_accept
from .rsd import accept_tree_rsd, draw_children, sibling_rows
from .token import accept
from .traversal import accept_tree_traversal, traversal_accept
from .trees import accept_tree


@dataclass(frozen=True)
class Rule:
    """An acceptance rule: `chain`, `tree` (None: chains only), and `siblings`, how its tree form needs a node's
    sampled children drawn: "iid" (independent draws of the node's row) or "distinct" (without replacement)."""

    name: str
    chain: Callable
    tree: Callable | None = None
    siblings: str = "iid"


SIBLINGS = {"iid": "i.i.d. children", "distinct": "children drawn without replacement",
            "deterministic": "deterministic children"}  # Rule.siblings and Drafter.siblings, in words

RULES = {rule.name: rule for rule in (Rule("token", accept, accept_tree), Rule("block", block_accept),
                                      Rule("rsd", accept, accept_tree_rsd, "distinct"),
                                      Rule("exact-match", exact_match_accept),
                                      Rule("traversal", traversal_accept, accept_tree_traversal, "distinct"))}


def get_rule(name):
    """The Rule registered as `name`; ValueError naming the registered ones."""
    if name not in RULES:
        raise ValueError(f"verify (--verify) must be one of {', '.join(RULES)}, got {name!r}")
    return RULES[name]
