"""generate's drafter, built from its options: the draft model --draft names (load_draft) and the drafter over it
or over a word of npspec.decode.drafters.COMMANDS (make_drafter).

Imports npspec.decode.drafters, npspec.kernels.registry (the static default), npspec.sources (load, NoCodes) and
options' drafting.
"""

from ..decode import RULES
from ..decode.drafters import COMMANDS, TREE_DRAFTERS, DraftModelCache, DynamicTreeDrafter, ModelDrafter, TreeDrafter
from ..kernels.registry import STATIC_DEFAULT
from ..sources import load
from ..sources.errors import NoCodes
from .options import drafting



def load_draft(args, threads, progress=None, note=None):
    """The draft model --draft names (the shipped draft for the shipped target without --draft), or None when the run
    drafts without one (not drafting(args), or a word of npspec.decode.drafters.COMMANDS such as `ngram`). It decodes
    with --draft-kernel, else registry.STATIC_DEFAULT until `probed` gives it the draft's (after every check)."""
    if not drafting(args) or args.draft in COMMANDS:
        return None
    try:  # load refuses a kernel reading int8 codes for float weights; said here with the CLI's options
        return load(args.draft, "draft", kernel=args.draft_kernel or STATIC_DEFAULT, threads=threads,
                    progress=progress, target=args.target, note=note)
    except NoCodes as e:
        raise NoCodes(e.kernel, "draft", e.source, f"--draft-kernel {e.kernel}", "--draft int8-g64:SPEC") from None


def make_drafter(args, target, draft):
    """The drafter --draft names (None when not drafting(args)): a registered word's (npspec.decode.drafters.COMMANDS,
    e.g. `ngram`), else ModelDrafter(draft), TreeDrafter with --tree, DynamicTreeDrafter with --tree-budget; `draft`
    is load_draft's model."""
    if not drafting(args):
        return None
    if args.draft in COMMANDS:
        return COMMANDS[args.draft].build(args, target)
    if args.tree and args.tree_kind == "top-k":
        return TreeDrafter(draft, args.tree, "top-k")
    if args.tree:  # sampled children, drawn as the rule needs (npspec.decode.drafters.TREE_DRAFTERS)
        return TREE_DRAFTERS[RULES[args.verify].siblings](draft, args.tree)
    if args.tree_budget is not None:
        return DynamicTreeDrafter(draft, args.tree_budget)
    return ModelDrafter(draft, p_min=args.draft_p_min)


def draft_model(drafter, default=None):
    """The draft model a drafter decodes with (a DraftModelCache's), else `default` (an n-gram drafter, or none)."""
    return drafter.model if isinstance(drafter, DraftModelCache) else default
