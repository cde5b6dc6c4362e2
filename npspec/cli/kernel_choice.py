"""Each role's kernel for generate's checked job (probed), the target's rows per round that the probe times
(verify_rows) and the kernels chosen (kernels_used). Imports npspec.sources.role_model, npspec.decode and drafts.
"""

from dataclasses import replace

from ..decode import tree_depth
from ..sources import role_model
from .drafts import draft_model, make_drafter




def probed(job, args, draft, threads, note=None):  # -> Job
    """The checked job decoding with each role's default kernel and threads (npspec.sources.role_model: the fastest
    candidate on this machine, at `threads` or one, which may time them and write the cache's choices.json, as
    --kernel-probe says). Called once every
    check has passed, so that a refused command measures and writes nothing. --target-kernel / --draft-kernel stay
    as given; a draft model the job does not use (gamma clamped to 0) is not measured. The draft is chosen first,
    then the target in rounds beside it (its partner), as they will decode. draft: load_draft's model.
    note: gets a compiled kernel's compile note."""
    drafter = job.drafter
    partner = draft if drafter is not None else None  # the draft model the job decodes beside (None: none)
    if partner is not None and args.draft_kernel is None:
        partner = role_model(draft, "draft", threads, probe=args.kernel_probe, note=note)
    target = job.target
    if args.target_kernel is None:
        target = role_model(target, "target", threads, probe=args.kernel_probe, note=note, partner=partner,
                            rows=(verify_rows(job),))
    if partner is not None and partner is not draft:  # a re-chosen draft model: its drafter anew
        drafter = make_drafter(args, target, partner)
    return replace(job, target=target, drafter=drafter)


def verify_rows(job):  # Job -> int
    """The rows of the target's forward in one of the job's rounds, as first scheduled: a chain of gamma drafts is
    verified with the last token as gamma + 1 rows, a tree with every node (drafter.tree_size at the first round's
    depth, decode.tree_depth) and the root; 1 with no drafter (plain decoding). What the kernel probe times the target at (npspec.sources.choices)."""
    if job.drafter is None:
        return 1
    return job.drafter.tree_size(tree_depth(job.drafter, job.options.gamma, job.n_ctx, len(job.prompt))) + 1


def kernels_used(target, drafter):
    """{"target_kernel", "target_threads", "target_prefill_rows", and the same for "draft_"}: the products the two
    models decode with, the threads of their forwards, and the longest prompt each prefills with its kernel
    (Model.prefill_rows; draft None for all three: no draft model). Called before --simulate-acceptance wraps the
    draft model."""
    draft = draft_model(drafter)
    return {"target_kernel": target.kernel, "target_threads": target.threads, "target_prefill_rows": target.prefill_rows,
            **{f"draft_{k}": None if draft is None else getattr(draft, k) for k in ("kernel", "threads", "prefill_rows")}}
