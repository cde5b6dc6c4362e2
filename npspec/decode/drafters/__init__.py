"""Drafters, one file each (npspec.decode.types.Drafter): model (ModelDrafter), ngram (NgramDrafter: prompt lookup),
tree (TreeDrafter, DynamicTreeDrafter), distinct (DistinctTreeDrafter, for "rsd"), controlled (the SIMULATED
acceptance of --simulate-acceptance); COMMANDS registers a drafter without a model as `--draft WORD`. The output
stays exactly target-distributed when a drafter (1) reports as q[i] exactly the law ids[i] was drawn from (q None:
deterministic); (2) decides to propose from what is fixed before ids[i] is drawn, never the round's tests; (3) draws
ids[i] with u[i] alone (notes/derivation.md, claim 8; tests/test_drafters_exact.py). Imports npspec.decode."""

from . import ngram
from .command import Command
from .controlled import ControlledDraft, ControlledLookup, ControlledTree
from .distinct import DistinctTreeDrafter
from .model import DraftModelCache, ModelDrafter, check_p_min
from .ngram import MAX_NGRAM, NgramDrafter, check_ngram_sizes, cut_after, ngram_scan
from .tree import DynamicTreeDrafter, TreeDrafter

TREE_DRAFTERS = {  # the static tree drafter for each way of drawing siblings (rules.Rule.siblings): --tree's
    "iid": TreeDrafter,  # i.i.d. children, the "token" rule's tree form (npspec.decode.rules.trees.accept_tree)
    "distinct": DistinctTreeDrafter,  # children without replacement, the "rsd" rule's (rules.rsd.accept_tree_rsd)
}

COMMANDS = {command.word: command for command in (
    ngram.COMMAND,  # --draft ngram
)}

__all__ = ["COMMANDS", "Command", "ControlledDraft", "ControlledLookup", "ControlledTree", "DistinctTreeDrafter",
           "DraftModelCache", "DynamicTreeDrafter", "MAX_NGRAM", "ModelDrafter", "NgramDrafter", "TREE_DRAFTERS",
           "TreeDrafter", "check_ngram_sizes", "check_p_min", "cut_after", "ngram", "ngram_scan"]
