"""DistinctTreeDrafter: TreeDrafter's static tree with a node's sampled children drawn WITHOUT replacement, for the
"rsd" rule (Jeon et al., arXiv 2402.14160, 2024; npspec.decode.rules.rsd, notes/derivation.md claim 11).
Imports npspec.decode.rules.rsd and npspec.decode.drafters.tree."""

from ..rules.rsd import draw_children
from .tree import TreeDrafter


class DistinctTreeDrafter(TreeDrafter):
    """A static token tree whose children are distinct draws of the node's warped row, each reported with the row
    before any exclusion; verify it with verify="rsd". ValueError for a bad branching."""

    siblings = "distinct"

    def __init__(self, model, branching):
        super().__init__(model, branching, "sampled")

    def __repr__(self):
        return f"DistinctTreeDrafter({self.source!r}, branching={list(self.branching)})"

    def draw(self, row, u):  # [n_vocab] float64, [k] uniforms -> [k] ids
        """k distinct children (rules.rsd.draw_children); a row with fewer positive tokens repeats the last one, never
        kept (a row without mass in sibling_rows, a zero residual after its rejection), so the law is unchanged."""
        ids = draw_children(row, len(u), u)
        return [int(x) for x in ids] + [int(ids[-1])] * (len(u) - len(ids))
