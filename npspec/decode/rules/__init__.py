"""Acceptance rules: step 3 of a round, pluggable. One registry, name -> Rule, read by the API's `verify=` and the
CLI's `--verify` (its choices are this registry's names).

NOTE: letters as in Leviathan et al. 2023: `p` the target's rows, `q` the draft's.

A Rule has a chain rule, rule(d `[k]` ids, p `[k + 1, n_vocab]` float64, q `[k, n_vocab]` float64,
u_tests `[k]`, u_final float) -> (n accepted, token id), and optionally a tree rule,
rule(ids `[N]`, parents `[N]`, q `[N, n_vocab]`, p `[N + 1, n_vocab]`, u_tests `[N]`, u_final) -> (path, token id)
(npspec.decode.rules.trees.accept_tree's signature). Both are called only for sampled rounds: at temperature 0
every row is one-hot, the target's law is a point mass, and every lossless rule keeps exactly the
drafts that equal the target's argmax (npspec.decode.round.accept, the one place greedy is handled).
"token": token-by-token modified rejection sampling (`accept` here) and its multi-candidate form down
a tree (npspec.decode.rules.trees.accept_tree), lossless for children drawn i.i.d. from the node's row. "block": block
verification of a chain (Sun et al. 2025, Algorithm 2: npspec.decode.rules.block_accept, the same signature and
uniforms); it has no tree form, so a tree drafter with it is refused (checks.check_rule). "rsd": recursive
rejection sampling over siblings drawn WITHOUT replacement (Jeon et al. 2024: npspec.decode.rules.accept_tree_rsd), lossless
only for such children (notes/derivation.md, claim 11); on a chain (one child per node) it is the token rule.
A Rule's `siblings` says how a tree's sampled children must be drawn for its tree form to be lossless ("iid" or
"distinct"); checks.check_rule refuses a tree drafter that draws them otherwise (a drafter's own `siblings`,
npspec.decode.types.Drafter; deterministic children, one-hot q, suit every tree form).
Imports numpy, npspec.decode.rules, npspec.decode.sampling and npspec.decode.rules.trees.
"""

from collections.abc import Callable
from dataclasses import dataclass

from .block import block_accept, block_thresholds, block_weights
from .rsd import accept_tree_rsd, draw_children, sibling_rows
from .token import accept
from .trees import accept_tree


@dataclass(frozen=True)
class Rule:
    """An acceptance rule: `chain` for a chain of drafts, `tree` for a token tree (None: chains only), and `siblings`,
    how the tree form needs a node's sampled children drawn: "iid" (independent draws of the node's row) or
    "distinct" (without replacement, npspec.decode.rules.draw_children)."""

    name: str
    chain: Callable
    tree: Callable | None = None
    siblings: str = "iid"


SIBLINGS = {"iid": "i.i.d. children", "distinct": "children drawn without replacement",
            "deterministic": "deterministic children"}  # Rule.siblings and Drafter.siblings, in words

RULES = {rule.name: rule for rule in (Rule("token", accept, accept_tree), Rule("block", block_accept),
                                      Rule("rsd", accept, accept_tree_rsd, "distinct"))}


def get_rule(name):
    """The Rule registered as `name`. Raises ValueError naming the registered ones."""
    if name not in RULES:
        raise ValueError(f"verify (--verify) must be one of {', '.join(RULES)}, got {name!r}")
    return RULES[name]
