"""python -m bench.trees: token trees against chains of the same verify budget, against the FASTEST plain decoding.

Two tables:
  * trees_shipped: the shipped pair with its real acceptance, greedy and temperature 0.8 (top-p 0.95): the
    chain drafter at gamma 1..8, trees of 4, 8 and about 16 nodes (npspec.decode.drafters.TreeDrafter,
    sampled children; top-k children too at temperature 0.8), and dynamic trees of 4, 8 and 16 nodes
    (DynamicTreeDrafter, depth at most 4; their v is a chain's of as many rows, a close stand-in).
  * trees_controlled: random gpt2-large / distilgpt2 with CONTROLLED ACCEPTANCE (bench/controlled.py): each
    chain draft or tree node is the target's greedy token with probability a, independently; the real
    draft forwards run. a = 0.5 / 0.7 / 0.9.
Every row has the verify cost v = t(verify forward of its 1 + nodes rows) / t(one-token forward), timed
alone in the same run (a tree's verify runs tree attention), and speedup over the fastest plain decoding
over npspec's kernels (bench.drafters.fastest_ar). Median over timed runs after a warm-up.
"""

import sys

import numpy as np

from npspec.decode.drafters import DynamicTreeDrafter, ModelDrafter, TreeDrafter
from npspec.decode.rules.trees import branching_tree

from . import common, models
from .controlled import ControlledDraft, ControlledTree
from .drafters import controlled_options, decode, fastest_ar, row, timed

CHAIN_GAMMAS = (1, 2, 3, 4, 6, 8)
TREES = ((2, 1), (4,), (2, 1, 1, 1), (4, 1), (2, 2, 2), (4, 1, 1, 1))  # 4, 4, 8, 8, 14, 16 nodes


def verify_cost(model, parents, repeats, context):
    """t(forward_tree over 1 + len(parents) rows after `context` ids) / t(a one-token forward), medians."""
    rows = [-1] + [p + 1 if p >= 0 else 0 for p in parents]
    rng = np.random.default_rng(0)
    cache = model.new_cache()
    model.prefill(rng.integers(0, model.config.n_vocab, context), cache, threads=1)  # none left spinning (time_sweeps)
    ids = rng.integers(0, model.config.n_vocab, len(rows))

    def tree():
        model.forward_tree(ids, rows, cache)
        cache.rollback(context)

    def one():
        model.forward(ids[:1], cache)
        cache.rollback(context)
    return common.median(common.time_call(tree, repeats)) / common.median(common.time_call(one, repeats))


def shape_fields(branching):
    return {"tree": ",".join(map(str, branching)), "nodes": len(branching_tree(branching)), "depth": len(branching)}


def shipped_rows(n_prompts, new_tokens, repeats, threads):
    target, draft = models.get("shipped:target", threads=threads), models.get("shipped:draft", threads=threads)
    prompts = models.validation_prompts(models.validation_ids(target.tokenizer), n_prompts)
    context = models.PROMPT_LENGTH + new_tokens // 2
    v = {g: verify_cost(target, branching_tree((1,) * g), max(repeats, 5), context) for g in CHAIN_GAMMAS}
    rows = []
    for temperature in common.steps((0.0, 0.8), "shipped trees, temperature"):
        warp = dict(temperature=temperature, top_p=0.95 if temperature else 1.0)
        ar, ar_gens = fastest_ar(target, prompts, new_tokens, repeats, threads, **warp)
        for gamma in CHAIN_GAMMAS:
            speed, gens = timed(decode(target, lambda: ModelDrafter(draft), prompts, new_tokens, gamma, **warp), repeats)
            rows.append(row("shipped", "chain", gamma, "constant", speed, gens, ar, ar_gens, temperature == 0,
                            target.kernel, temperature=temperature, tree="", nodes=gamma, depth=gamma, v=v[gamma],
                            threads=threads))
        for branching in TREES:
            kinds = ("sampled", "top-k") if temperature and branching in ((2, 1, 1, 1), (4, 1)) else ("sampled",)
            cost = verify_cost(target, branching_tree(branching), max(repeats, 5), context)
            for kind in kinds:
                make = (lambda b, k: lambda: TreeDrafter(draft, b, k))(branching, kind)
                speed, gens = timed(decode(target, make, prompts, new_tokens, len(branching), **warp), repeats)
                rows.append(row("shipped", f"tree {kind}", len(branching), "constant", speed, gens, ar, ar_gens,
                                temperature == 0, target.kernel, temperature=temperature, **shape_fields(branching),
                                v=cost, threads=threads))
        for budget in (4, 8, 16):  # dynamic trees, depth at most 4
            make = (lambda b: lambda: DynamicTreeDrafter(draft, b))(budget)
            speed, gens = timed(decode(target, make, prompts, new_tokens, 4, **warp), repeats)
            rows.append(row("shipped", "tree dynamic", 4, "constant", speed, gens, ar, ar_gens, temperature == 0,
                            target.kernel, temperature=temperature, tree=f"budget {budget}", nodes=budget, depth=4,
                            v=verify_cost(target, branching_tree((1,) * budget), max(repeats, 5), context),
                            threads=threads))
    return rows


def controlled_rows(new_tokens, a_values, repeats, threads, target_shape, draft_shape="distilgpt2"):
    draft = models.get(f"random:{draft_shape}", seed=1, role="draft", threads=threads)
    target = models.get(f"random:{target_shape}", seed=0, threads=threads, partner=draft)
    prompt = models.random_prompt()
    ar, ar_gens = fastest_ar(target, [prompt], new_tokens, repeats, threads, temperature=0)
    greedy = prompt + ar_gens[0].ids
    context = len(prompt) + new_tokens // 2
    trees = ((2, 1, 1), (3, 1, 1), (4, 1), (2, 2, 1))
    cost = {b: verify_cost(target, branching_tree(b), repeats, context) for b in [(1,) * g for g in (2, 3, 4)] + list(trees)}
    rows = []
    for a in common.steps(a_values, "controlled trees, acceptance"):
        for gamma in (2, 3, 4):
            make = (lambda s: lambda: ControlledDraft(draft, greedy, a, np.random.default_rng(s)))(1000 * gamma)
            speed, gens = timed(decode(target, make, [prompt], new_tokens, gamma, temperature=0), repeats)
            rows.append(row("controlled", "chain", gamma, "constant", speed, gens, ar, ar_gens, True, target.kernel,
                            target=f"random:{target_shape}", a=a, tree="", nodes=gamma, depth=gamma,
                            v=cost[(1,) * gamma], threads=threads))
        for branching in trees:
            make = (lambda b, s: lambda: ControlledTree(draft, b, greedy, a, np.random.default_rng(s)))(branching, 7)
            speed, gens = timed(decode(target, make, [prompt], new_tokens, len(branching), temperature=0), repeats)
            rows.append(row("controlled", "tree", len(branching), "constant", speed, gens, ar, ar_gens, True,
                            target.kernel,
                            target=f"random:{target_shape}", a=a, **shape_fields(branching), v=cost[branching],
                            threads=threads))
    target = draft = None  # free the large models
    models.release()
    return rows


def main(argv=None):
    run = common.command_line("bench.trees", __doc__, argv, controlled_options, threads=("2", "1"), many=False)
    args = run.args
    repeats = args.repeats or (1 if args.quick else 3)
    n_prompts, shipped_tokens = (2, 32) if args.quick else (6, 96)
    new_tokens = 24 if args.quick else 64
    a_values = args.a or ((0.7,) if args.quick else (0.5, 0.7, 0.9))
    n = run.threads[0]
    with common.blas_threads(n):
        shipped = shipped_rows(n_prompts, shipped_tokens, repeats, n)
        controlled = controlled_rows(new_tokens, a_values, repeats, n, args.target or ("gpt2" if args.quick else
                                                                                        "gpt2-large"))
    note = ("speedup: against the fastest plain decoding over npspec's kernels, same prompts and options, same run. "
            "v: the verify forward of 1 + nodes rows over a one-token forward (tree attention for trees), timed alone. "
            "mean_acceptance_length: 1 + kept / rounds with a proposal (for a tree: the kept path). identical: greedy "
            "ids equal plain decoding's.")
    return common.finish(run, [
        common.Table("trees_shipped", shipped, "Token trees vs chains on the shipped pair (real acceptance)", note),
        common.Table("trees_controlled", controlled, "Token trees vs chains, random weights, controlled acceptance",
                     note + " Controlled: each chain draft or tree node is the target's greedy token with probability "
                     "a (bench/controlled.py).")])


if __name__ == "__main__":
    sys.exit(main())
