"""Each role's kernel for generate's checked job (probed), the target's rows per round that the probe times
(verify_rows) and the kernels chosen (kernels_used). Imports npspec.kernels.probe, npspec.sources, npspec.decode
and drafts.
"""

from dataclasses import replace

from ..decode import tree_depth
from ..kernels.probe import choose_kernels
from ..sources import choice_store
from .drafts import draft_model, make_drafter


def probed(job, args, draft, threads):  # -> Job
    """The checked job decoding with each role's default kernel, threads and prefill length, chosen in one call
    (npspec.kernels.probe.choose_kernels, kept in the cache's choices.json as --kernel-probe says) once every check
    has passed; --target-kernel / --draft-kernel stay as given. A draft model the job does not use (gamma clamped to
    0) is not measured. draft: load_draft's model."""
    draft = draft if job.drafter is not None else None  # the draft model the job decodes beside (None: none)
    roles = [role for role, given in (("target", args.target_kernel), ("draft", args.draft_kernel)) if given is None]
    chosen = choose_kernels(job.target, draft, threads, choice_store(), args.kernel_probe, rows=(verify_rows(job),),
                            roles=roles)
    drafter = job.drafter
    if draft is not None and chosen.draft.model is not draft:  # a re-chosen draft model: its drafter anew
        drafter = make_drafter(args, chosen.target.model, chosen.draft.model)
    return replace(job, target=chosen.target.model, drafter=drafter)


def verify_rows(job):  # Job -> int
    """The rows of the target's forward in one of the job's rounds, as first scheduled: a chain of gamma drafts is
    verified with the last token as gamma + 1 rows, a tree with every node (drafter.tree_size at the first round's
    depth, decode.tree_depth) and the root; 1 with no drafter (plain decoding). What the kernel probe times the target
    at (npspec.kernels.probe)."""
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
