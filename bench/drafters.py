"""python -m bench.drafters: the drafting strategies measured, each against the FASTEST plain decoding npspec has.

Three tables:
  * drafters_shipped: the shipped pair with its real acceptance, greedy and temperature 0.8 (top-p
    0.95): the draft model at constant gamma 4, with the heuristic schedule (from 4), with confidence
    stopping at p_min 0.3 / 0.5 / 0.7; n-gram lookup (gamma 4, sizes 1..4) on open-ended prompts
    (validation slices, as bench.speedup) and on input-grounded ones (a validation passage, then its
    first ids again, so copying it is right).
  * drafters_controlled: random gpt2-large with CONTROLLED ACCEPTANCE (bench/controlled.py), greedy:
    n-gram lookup (ControlledLookup: the real lookup runs, its proposal is steered; c ~ 0) at
    a = 0.5 / 0.7 / 0.9, gamma 2..8 and the heuristic schedule; the distilgpt2 draft at constant
    gamma 1..8 and the heuristic schedule.
  * ngram_cost: the lookup's share of a round on the shipped target at its n_ctx, and the cost per
    round of the index against a plain scan at n_ctx 1024.
"speedup" divides by the fastest plain (AR) decoding of the same target, prompts and options over
every kernel npspec has (npspec.kernels.registry's, compiled-panels with the fast extra), measured in the same run;
"vs_target_ar" by the target's own AR path (its kernel, as npspec.kernels.probe.choose_kernels chose it). Median over timed runs after a warm-up.
"""

import sys
import time

import numpy as np

from npspec.decode.drafters import ModelDrafter, NgramDrafter, ngram_scan
from npspec.kernels.registry import REGISTRY, names
from npspec.decode import Stats, speculative_generate

from . import common, models
from .controlled import ControlledDraft, ControlledLookup
from .speedup import median_run as timed, numbers
from .verify_cost import time_forward

P_MINS = (0.3, 0.5, 0.7)


def pooled(gens):
    """One Stats pooling several Generations' (Stats.pooled: every count and list summed)."""
    return Stats.pooled(g.stats for g in gens)


def decode(target, make_drafter, prompts, new_tokens, gamma, schedule="constant", **warp):
    """A run function: every prompt decoded (seeded per prompt), with a fresh drafter from make_drafter (None: AR)."""
    def run():
        return [speculative_generate(target, None if make_drafter is None else make_drafter(), p, new_tokens,
                                     gamma=gamma if make_drafter is not None else 0, gamma_schedule=schedule,
                                     rng=np.random.default_rng(i), **warp) for i, p in enumerate(prompts)]
    return run


def fastest_ar(target, prompts, new_tokens, repeats, threads, **warp):
    """Plain decoding with every kernel: returns ({kernel: median tokens/s}, the target's own kernel's Generations)."""
    speeds, own = {}, None
    for kernel in (k for k in names(codes=False) if REGISTRY[k].available()):
        speeds[kernel], gens = timed(decode(target.with_kernel(kernel, threads), None, prompts, new_tokens, 0, **warp),
                                     repeats)
        if kernel == target.kernel:
            own = gens
    return speeds, own


def row(table, name, gamma, schedule, speed, gens, ar, ar_gens, greedy, own_kernel, **extra):
    """One result row: acceptance in npspec's and vLLM's terms, speed against the fastest and the target's own AR."""
    s = pooled(gens)
    best = max(ar, key=ar.get)
    out = {"table": table, "strategy": name, "gamma": gamma, "schedule": schedule, **extra, "alpha": s.alpha,
           "mean_acceptance_length": s.mean_acceptance_length, "tokens_per_round": s.tokens_per_round,
           "no_proposal_share": s.rounds_without_proposal / s.rounds if s.rounds else 0.0,
           "tok_s": speed, "fastest_ar_kernel": best, "fastest_ar_tok_s": ar[best], "speedup": speed / ar[best],
           "vs_target_ar": speed / ar[own_kernel],
           "identical": ([g.ids for g in gens] == [g.ids for g in ar_gens]) if greedy else ""}
    common.log(f"{table} {name} gamma {gamma} {schedule}: {speed:.1f} tok/s, {out['speedup']:.2f}x fastest AR, "
               f"alpha {s.alpha:.3f}, mean acceptance length {out['mean_acceptance_length']:.2f}")
    return out


def grounded_prompts(val_ids, n, passage=96, restart=8):
    """Input-grounded prompts: a validation passage of `passage` ids, then its first `restart` ids again."""
    step = (len(val_ids) - passage) // n
    return [list(val_ids[i * step:i * step + passage]) + list(val_ids[i * step:i * step + restart]) for i in range(n)]


def shipped_rows(n_prompts, new_tokens, repeats, threads):
    target, draft = models.get("shipped:target", threads=threads), models.get("shipped:draft", threads=threads)
    val = models.validation_ids(target.tokenizer)
    kinds = {"open-ended": models.validation_prompts(val, n_prompts), "grounded": grounded_prompts(val, n_prompts)}
    n_vocab, eos = target.config.n_vocab, target.config.eos_token_id
    rows = []
    for temperature in common.steps((0.0, 0.8), "shipped drafters, temperature"):
        warp = dict(temperature=temperature, top_p=0.95 if temperature else 1.0)
        greedy = temperature == 0
        for kind, prompts in kinds.items():
            ar, ar_gens = fastest_ar(target, prompts, new_tokens, repeats, threads, **warp)
            runs = [("ngram", lambda: NgramDrafter(n_vocab, eos), "constant", {})]
            if kind == "open-ended":
                runs += [("model", lambda: ModelDrafter(draft), "constant", {}),
                         ("model", lambda: ModelDrafter(draft), "heuristic", {})]
                runs += [("model", (lambda p: lambda: ModelDrafter(draft, p_min=p))(p), "constant", {"p_min": p})
                         for p in P_MINS]
            for name, make, schedule, extra in runs:
                speed, gens = timed(decode(target, make, prompts, new_tokens, 4, schedule, **warp), repeats)
                rows.append(row("shipped", name, 4, schedule, speed, gens, ar, ar_gens, greedy, target.kernel, prompts=kind,
                                temperature=temperature, p_min=extra.get("p_min", ""), threads=threads))
    return rows


def controlled_rows(new_tokens, a_values, gammas, repeats, threads, target_shape="gpt2-large", draft_shape="distilgpt2"):
    draft = models.get(f"random:{draft_shape}", seed=1, role="draft", threads=threads)
    target = models.get(f"random:{target_shape}", seed=0, threads=threads, partner=draft)
    prompt = models.random_prompt()
    ar, ar_gens = fastest_ar(target, [prompt], new_tokens, repeats, threads, temperature=0)
    greedy = prompt + ar_gens[0].ids
    n_vocab, eos = target.config.n_vocab, target.config.eos_token_id
    rows = []
    for a in common.steps(a_values, "controlled drafters, acceptance"):
        for schedule, gs in (("constant", gammas), ("heuristic", (4,))):
            for gamma in gs:
                seed = 1000 * gamma + int(100 * a)
                lookup = (lambda s: lambda: ControlledLookup(n_vocab, eos, greedy, a, np.random.default_rng(s)))(seed)
                steered = (lambda s: lambda: ControlledDraft(draft, greedy, a, np.random.default_rng(s)))(seed)
                for name, make in (("ngram", lookup), (f"model {draft_shape}", steered)):
                    speed, gens = timed(decode(target, make, [prompt], new_tokens, gamma, schedule, temperature=0),
                                        repeats)
                    rows.append(row("controlled", name, gamma, schedule, speed, gens, ar, ar_gens, True, target.kernel,
                                    target=f"random:{target_shape}", a=a, threads=threads))
    target = draft = None  # free the large models before the next command's
    models.release()
    return rows


def lookup_seconds_per_round(ids, gamma, tokens_per_round=2, scan=False):
    """Mean seconds of one round's lookup while a sequence grows to len(ids) by tokens_per_round ids a round.

    scan=True times ngram_scan instead of the incremental index.
    """
    drafter = NgramDrafter(1 + max(ids))
    drafter.start(ids[:1])
    lengths = range(len(ids) // 2, len(ids) + 1, tokens_per_round)
    t0 = time.perf_counter()
    for n in lengths:
        ngram_scan(ids[:n], gamma) if scan else drafter.lookup(ids[:n], gamma)
    return (time.perf_counter() - t0) / len(lengths)


def cost_rows(repeats, threads, gamma=4):
    target = models.get("shipped:target", threads=threads)
    val = models.validation_ids(target.tokenizer)
    rows = []
    for n_ctx in (target.config.n_ctx, 1024):
        ids = list(val[:n_ctx])
        index = common.median([lookup_seconds_per_round(ids, gamma) for _ in range(repeats)])
        scan = common.median([lookup_seconds_per_round(ids, gamma, scan=True) for _ in range(repeats)])
        out = {"n_ctx": n_ctx, "gamma": gamma, "lookup_us_per_round": 1e6 * index, "scan_us_per_round": 1e6 * scan}
        if n_ctx <= target.config.n_ctx:
            verify = time_forward(target, gamma + 1, max(repeats, 5), n_ctx - gamma - 1)
            out.update(verify_ms=1e3 * verify, lookup_share=index / (index + verify))
        rows.append(out)
        common.log(f"ngram lookup at {n_ctx} ids: {1e6 * index:.1f} us/round (scan {1e6 * scan:.1f})")
    return rows


def controlled_options(ap):
    """The options bench.drafters and bench.trees share: --repeats, --a and --target."""
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per row, median taken (default 3; --quick: 1)")
    ap.add_argument("--a", type=numbers(float), default=None,
                    help="controlled acceptances, comma-separated (default 0.5,0.7,0.9; --quick: 0.7)")
    ap.add_argument("--target", default=None, help="the controlled rows' target shape (default gpt2-large; --quick: gpt2)")


def options(ap):
    controlled_options(ap)
    ap.add_argument("--gammas", type=numbers(int), default=None,
                    help="constant gammas of the controlled rows (default 1,2,3,4,5,6,8; --quick: 2,4)")


def main(argv=None):
    run = common.command_line("bench.drafters", __doc__, argv, options, threads=("2", "1"), many=False)
    args = run.args
    repeats = args.repeats or (1 if args.quick else 3)
    n_prompts, shipped_tokens = (2, 32) if args.quick else (6, 96)
    new_tokens = 24 if args.quick else 64
    a_values, gammas = ((0.7,), (2, 4)) if args.quick else ((0.5, 0.7, 0.9), (1, 2, 3, 4, 5, 6, 8))
    a_values, gammas = args.a or a_values, args.gammas or gammas
    n = run.threads[0]
    with common.blas_threads(n):
        shipped = shipped_rows(n_prompts, shipped_tokens, repeats, n)
        controlled = controlled_rows(new_tokens, a_values, gammas, repeats, n,
                                     args.target or ("gpt2" if args.quick else "gpt2-large"))
        cost = cost_rows(max(repeats, 3), n)
    run.meta["tokens"] = (f"shipped: {shipped_tokens} new tokens x {n_prompts} prompts per kind; controlled: "
                          f"{new_tokens} new tokens after a {models.PROMPT_LENGTH}-token prompt")
    speed_note = ("speedup: against the fastest plain decoding over npspec's kernels (fastest_ar_kernel), same "
                  "prompts and options, same run; vs_target_ar: against the target's own AR path (its kernel). "
                  "mean_acceptance_length: vLLM's 1 + accepted / rounds with a proposal. identical: greedy ids equal "
                  "plain decoding's.")
    return common.finish(run, [
        common.Table("drafters_shipped", shipped, "Drafting strategies on the shipped pair (real acceptance)",
                     speed_note + " grounded prompts: a validation passage, then its first ids again."),
        common.Table("drafters_controlled", controlled, "Drafting strategies on random gpt2-large, controlled acceptance",
                     speed_note + " Controlled acceptance (bench/controlled.py): each proposed token is the target's "
                     "greedy token with probability a; ngram runs the real lookup and proposes gamma steered tokens."),
        common.Table("ngram_cost", cost, "The n-gram lookup's cost per round",
                     "lookup_us_per_round: the index (NgramDrafter.lookup) while the sequence grows 2 ids a round over "
                     "the second half of n_ctx validation ids; scan_us_per_round: a plain scan (ngram_scan) instead; "
                     "lookup_share: lookup / (lookup + the verify forward of gamma + 1 tokens at that context).")])


if __name__ == "__main__":
    sys.exit(main())
