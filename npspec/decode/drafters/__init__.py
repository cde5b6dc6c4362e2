"""Drafters: who proposes the tokens that one speculative round verifies, one file each.

A drafter implements npspec.decode.types.Drafter (after transformers' `CandidateGenerator` and
vLLM's proposers): propose(seq, depth, u, sampling) -> Proposal (ids, parents, q or None for a
deterministic proposal), update(outcome) learns from the round's Outcome (the path kept, the
target's verify rows and, for a drafter that reads them, its hidden states), rollback(length).
`BaseDrafter` holds the defaults of a chain drafter without a model.

What a drafter must guarantee for the output to stay exactly target-distributed (the proof is
per position: notes/derivation.md, "Drafters"; tested by enumeration in tests/test_drafters_exact.py):
  1. q[i] is exactly the distribution ids[i] was drawn from, given everything before it, the decision
     to propose a token at position i included. A deterministic proposer (n-gram lookup) reports
     q None (one-hot rows): the test then keeps d with probability p(d), and the residual is p
     without d, renormalised. Drawing a token and then withholding it depending on the token breaks this.
  2. Whether it proposes a token at position i may depend on anything fixed before ids[i] is drawn:
     the ids so far, earlier rounds' outcomes, its own earlier draws and rows in this round
     (confidence stopping looks at q[i-1]). It never depends on the round's acceptance tests,
     which the drafter never sees: the round draws their uniforms separately (README,
     Reproducibility).
  3. It draws ids[i] from q[i] with u[i] alone (npspec.decode.sampling.sample), so a run is reproducible.
     A deterministic drafter ignores u.
A chain drafter may propose fewer than asked, none included (no proposal is one plain target
step); a tree drafter proposes exactly tree_size(depth) nodes (npspec.decode.rules.trees: the same guarantees, per node).

The files: model (ModelDrafter: a smaller model, optionally with confidence stopping, llama.cpp's
`--draft-p-min`), ngram (NgramDrafter: prompt lookup), tree (TreeDrafter, DynamicTreeDrafter), distinct
(DistinctTreeDrafter: siblings without replacement, for the "rsd" rule; TREE_DRAFTERS picks it or TreeDrafter),
controlled (the SIMULATED acceptance of --simulate-acceptance and the bench). COMMANDS is the one
place a drafter that needs no model registers its `--draft WORD` for the command line.
"""

from . import ngram
from .command import Command
from .controlled import ControlledDraft, ControlledLookup, ControlledTree
from .distinct import DistinctTreeDrafter
from .model import DraftModelCache, ModelDrafter, check_p_min
from .ngram import MAX_NGRAM, NgramDrafter, check_ngram_sizes, cut_after, ngram_scan
from .tree import DynamicTreeDrafter, TreeDrafter

TREE_DRAFTERS = {  # the static tree drafter for each way of drawing siblings (acceptance.Rule.siblings): --tree's
    "iid": TreeDrafter,  # i.i.d. children, the "token" rule's tree form (npspec.decode.rules.trees.accept_tree)
    "distinct": DistinctTreeDrafter,  # children without replacement, the "rsd" rule's (npspec.decode.rules.accept_tree_rsd)
}

COMMANDS = {command.word: command for command in (
    ngram.COMMAND,  # --draft ngram
)}

__all__ = ["COMMANDS", "Command", "ControlledDraft", "ControlledLookup", "ControlledTree", "DistinctTreeDrafter",
           "DraftModelCache", "DynamicTreeDrafter", "MAX_NGRAM", "ModelDrafter", "NgramDrafter", "TREE_DRAFTERS",
           "TreeDrafter", "check_ngram_sizes", "check_p_min", "cut_after", "ngram", "ngram_scan"]
