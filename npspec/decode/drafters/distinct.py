"""A token tree whose siblings are drawn WITHOUT replacement, for the "rsd" acceptance rule (Recursive Speculative
Decoding: Jeon, Gagrani, Goel, Park, Lee, Lott, arXiv 2402.14160, 2024).

DistinctTreeDrafter is TreeDrafter's static tree with one step changed: a node's k sampled children are k distinct
draws of its warped row (npspec.decode.rules.draw_children: child j from the row with children 1..j-1 removed and
renormalised), each reported with the node's row before any exclusion, as npspec.decode.rules.accept_tree_rsd expects
(it removes the earlier siblings itself). The round then verifies with the registered "rsd" rule
(npspec.decode.rules.RULES); checks.check_rule refuses this drafter with a rule that needs i.i.d. children, and
TreeDrafter's i.i.d. children with "rsd". A node's children never repeat a token, so no verify row is spent twice
on one token, and each rejection removes that token from the next child's law: RSD keeps at least as much per
node as i.i.d. children (notes/derivation.md, claim 11; tests/test_tree_rules.py compares them exactly).

When the warped row has fewer than k tokens of positive probability (a top-k below the node's width, or a narrow
nucleus), the remaining children repeat the last distinct one. They are never kept, so the law is unchanged:
sibling_rows gives a repeat a row without mass, and once its token was rejected the running residual is 0 there
(a rejection means r(x) < q_j(x), and the residual max(0, r - q_j) stays 0 at x), so its test is 0 / 0, false.
Each costs a verify row and, with children of its own, draft forwards.
Imports npspec.decode.rules and npspec.decode.drafters.tree.
"""

from ..rules.rsd import draw_children
from .tree import TreeDrafter


class DistinctTreeDrafter(TreeDrafter):
    """A draft model proposing a static token tree (branching per depth, npspec.decode.rules.trees) with each node's children
    drawn without replacement from the draft's warped row (RSD); verify it with verify="rsd" (--verify rsd).

    At temperature 0 it takes the top-k ids of the logits, as TreeDrafter does. One draft forward per node that has
    children. Raises ValueError for a bad branching (npspec.decode.rules.trees.branching_tree).
    """

    siblings = "distinct"

    def __init__(self, model, branching):
        super().__init__(model, branching, "sampled")

    def __repr__(self):
        return f"DistinctTreeDrafter({self.source!r}, branching={list(self.branching)})"

    def draw(self, row, u):  # [n_vocab] float64, [k] uniforms -> [k] ids
        """k distinct children of the row, child j drawn with u[j] (npspec.decode.rules.draw_children); if the row has fewer
        than k tokens of positive probability, the last one repeated (never kept: the module docstring)."""
        ids = draw_children(row, len(u), u)
        return [int(x) for x in ids] + [int(ids[-1])] * (len(u) - len(ids))
