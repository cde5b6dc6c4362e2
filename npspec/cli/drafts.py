"""generate's models and drafter from its options: a model --target or --draft names (load_role, load_draft) and the
drafter (make_drafter). Imports npspec.decode.drafters, npspec.sources and options' drafting.
"""

from ..decode import RULES
from ..decode.drafters import COMMANDS, TREE_DRAFTERS, DraftModelCache, DynamicTreeDrafter, ModelDrafter, TreeDrafter
from ..sources import first_kernel, load
from ..sources.errors import NoCodes
from .options import command_values, drafting


def load_draft(args, threads, progress=None, target=None):
    """The draft model --draft names (the shipped draft for the shipped target), or None when the run drafts
    without one; with --draft-kernel, else sources.first_kernel's until probed chooses; target: the loaded target
    Model a `SCHEME:self` draft quantizes (None: --target loaded again). Raises NoCodes, CheckpointError."""
    if not drafting(args) or args.draft in COMMANDS:
        return None
    return load_role(args.draft, "draft", args.draft_kernel, threads, progress,
                     target=args.target if target is None else target)


def load_role(spec, role, kernel, threads, progress=None, **extra):  # -> the Model --ROLE names
    """npspec.load of `spec` as `role` ("target" or "draft") with --ROLE-kernel `kernel`, else sources.first_kernel's
    until probed chooses; extra: load's other arguments. load refuses a kernel reading int codes for float weights
    (NoCodes), said here with the CLI's options. Raises NoCodes, CheckpointError."""
    try:
        return load(spec, role, kernel=kernel or first_kernel(spec), threads=threads, progress=progress, **extra)
    except NoCodes as e:
        raise NoCodes(e.kernel, role, e.source, f"--{role}-kernel {e.kernel}", f"--{role} int8-g64:SPEC") from None


def make_drafter(args, target, draft):
    """The drafter --draft names, or None when not drafting(args): a COMMANDS word's, else over `draft`
    (load_draft's) a ModelDrafter, a tree drafter with --tree, or DynamicTreeDrafter with --tree-budget."""
    if not drafting(args):
        return None
    if args.draft in COMMANDS:
        return COMMANDS[args.draft].build(target, **command_values(COMMANDS[args.draft], args))
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
