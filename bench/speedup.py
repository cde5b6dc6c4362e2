"""python -m bench.speedup: speculative against plain (AR) decoding, greedy, tokens per second.

Rows (all greedy, temperature 0, so the output must be token-identical to AR decoding):
  * the shipped pair, with its real acceptance, on fixed validation prompts;
  * GPT-2 shapes with random weights (gpt2-large/distilgpt2, gpt2-medium/distilgpt2,
    gpt2-large/gpt2, gpt2/distilgpt2) with CONTROLLED ACCEPTANCE (npspec/decode/drafters/controlled.py): the
    real draft forward runs, but each draft token is the target's greedy token with
    probability a; gamma = 1, 2, 3, 4, 8 with a = 0.5, 0.7, 0.9 for the first pair, a = 0.7 for the others.
Targets and drafts decode with the kernels npspec.load gives their roles (npspec.kernels.probe.choose_kernels),
both with the run's thread count. Each speed is the median over runs after a warm-up run; every
speedup divides by the FASTEST plain decoding of the target measured in the same run (ar_speeds:
every kernel plain decoding can use, and bench/minimal.py's decoder). Next to
each row, the speedup model of npspec.decode.evaluate.predicted_speedup(alpha, gamma, c, v) (Leviathan
et al. 2023, section 3.4; alpha = a for controlled rows, the measured alpha for the shipped pair),
with the draft/target cost ratio c = t_draft(1)/t_target(1) and v = t_target(gamma+1)/t_target(1)
from forwards timed alone in the same run.

A second table, speedup_ar.csv, compares npspec's AR decode on each shape with the bandwidth
roofline (weight bytes per token / read bandwidth, measured in the same run) and, when torch and
transformers are installed, with transformers' GPT2LMHeadModel.generate (greedy, random
weights of the same shape) as "what a user would pick instead".
"""

import sys
import time

import numpy as np

from npspec.decode.evaluate import predicted_speedup
from npspec.cli.harness import plain_label
from npspec.kernels.registry import REGISTRY
from npspec.sources import SHAPES
from npspec.decode import Stats, speculative_generate

from . import common, models
from .controlled import ControlledDraft
from .minimal import MinimalDecoder
from .verify_cost import PAUSE, time_forward, time_sweep

FULL_PAIRS = [("gpt2-large", "distilgpt2"), ("gpt2-medium", "distilgpt2"), ("gpt2-large", "gpt2"),
              ("gpt2", "distilgpt2")]
QUICK_PAIRS = [("gpt2", "distilgpt2")]
AR_KERNELS = tuple(k for k in ("compiled-panels", "gemm-blocks", "gemv-panels", "gemv-rows", "gemm")
                   if REGISTRY[k].available())  # every kernel plain decoding can use (compiled-panels: the fast extra)


def runner(target, draft, prompts, new_tokens, gamma):
    """A function that decodes every prompt greedily (gamma 0: AR) and returns the Generations."""
    return lambda: [speculative_generate(target, draft, p, new_tokens, gamma=gamma, temperature=0) for p in prompts]


def pooled(gens):
    """One Stats pooling the counts and seconds of several Generations (Stats.pooled; alpha, tokens/round, shares
    over all)."""
    return Stats.pooled(g.stats for g in gens)


def median_run(run, repeats, warmup=True):
    """A warm-up run (unless warmup=False), then `repeats` runs; returns (median tokens/s, the last run's Generations).

    Each run's speed pools its prompts: all new tokens over all seconds.
    """
    if warmup:
        run()
    speeds, gens = [], None
    for _ in range(repeats):
        gens = run()
        speeds.append(pooled(gens).tokens_per_s)
    return common.median(speeds), gens


def plain_decoders(target, prompts, new_tokens, threads):
    """{name: decode() -> (tokens/s, Generations or None)}: one plain greedy decoding of every prompt with each kernel
    of AR_KERNELS at `threads` (its own workers, or BLAS's: npspec.kernels.blas), with the target's own kernel also at its
    own thread count when the probe chose another (npspec.kernels.probe; named by npspec.cli.harness.plain_label), and with
    bench.minimal's decoder ("minimal", no Generations; its time counts its decoding steps only, not its prompt,
    which favours it). tokens/s pools the prompts: all new tokens over all seconds."""
    runs = {kernel: target.with_kernel(kernel, threads) for kernel in AR_KERNELS}
    if target.threads != threads:
        runs[plain_label(target, threads)] = target
    def speed(run):  # a runner -> decode() -> (tokens/s, its Generations)
        def decode():
            gens = run()
            return pooled(gens).tokens_per_s, gens
        return decode
    decoders = {name: speed(runner(model, None, prompts, new_tokens, 0)) for name, model in runs.items()}
    minimal = MinimalDecoder(target)

    def decode_minimal():
        out = [minimal.generate(list(p), new_tokens) for p in prompts]
        return len(prompts) * new_tokens / sum(t for _, t in out), None
    decoders["minimal"] = decode_minimal
    return decoders


def ar_speeds(decoders, own, repeats, pause=PAUSE):
    """The plain decodings of plain_decoders, timed: ({name: median tokens/s}, the Generations of decoder `own`, the
    target's own kernel). The decoders run in turn: a warm-up pass, then `repeats` passes that each decode once with
    every one of them, so that the host's drift moves them alike (bench.verify_cost.time_sweeps: timed one after
    another on an Intel Sapphire Rapids, gpt2-medium decoded at 13.0 tokens/s with the kernel whose one-token forward
    was fastest and 17.8 with `gemm`, bench/results/kernels-by-cpu/README.md, section `intel2/`); `pause` seconds before each
    decoding let the BLAS threads of the previous one fall asleep (common.in_turn).
    """
    runs = common.in_turn(decoders, repeats, pause)  # {name: [(tokens/s, Generations)] of the timed passes}
    return {name: common.median([speed for speed, _ in r]) for name, r in runs.items()}, runs[own][-1][1]


def paired_runs(spec, plain, repeats, warmup=True, pause=PAUSE):
    """A row's speculative runs, each followed at once by a plain decoding with the fastest plain decoder, so that each
    ratio divides two runs seconds apart, not a row's runs by a plain block timed minutes before it, across the host's
    drift (bench/results/kernels-by-cpu/README.md, section `intel3/`: gpt2-large's rounds at a = 0.9 and gamma 4 took 278
    ms, against about 247 expected from the same block's a = 0.7, gamma 3 rounds and the forwards' measured costs).

    spec(): the row's Generations; plain(): (tokens/s, Generations or None), one of plain_decoders. A warm-up
    speculative run first unless warmup=False; `pause` seconds before every run (ar_speeds). Returns (median
    speculative tokens/s, the last run's Generations, median plain tokens/s of the pairs, median over the pairs of
    speculative / plain tokens/s)."""
    if warmup:
        spec()
    speeds, plains, ratios, gens = [], [], [], None
    for _ in range(repeats):
        time.sleep(pause)
        gens = spec()
        speeds.append(pooled(gens).tokens_per_s)
        time.sleep(pause)
        plains.append(plain()[0])
        ratios.append(speeds[-1] / plains[-1])
    return common.median(speeds), gens, common.median(plains), common.median(ratios)


def fastest(speeds):
    """(name, tokens/s) of the fastest plain decoding in `speeds` (ar_speeds')."""
    return max(speeds.items(), key=lambda kv: kv[1])


def forward_costs(target, draft, gammas, repeats, context):
    """The target's forward seconds t[M] for M = 1..max(gammas) + 1 (medians, every M timed in turn: time_sweep),
    and c = t_draft(1) / t_target(1)."""
    t, _ = time_sweep(target, list(range(1, max(gammas) + 2)), repeats, context)
    return t, time_forward(draft, 1, repeats, context) / t[1]


def speedup_row(names, a, gamma, threads, ar, spec, t, c, speeds):
    """A row of the speedup table.

    names: (target, draft) as shown; a: the controlled acceptance, None for the real one;
    ar: (median tokens/s, Generations) of the target's own AR; spec: paired_runs' result for the row;
    t, c: forward_costs; speeds: ar_speeds' tokens/s of every plain decoding. `speedup` is over the
    FASTEST of them, decoded right after each speculative run (paired_runs: `paired_ar_tok_s` is its median there),
    `speedup_vs_target_ar` over the target's own kernel's median in ar_speeds.
    """
    (ar_speed, ar_gens), (speed, gens, paired_speed, ratio) = ar, spec
    best_name, best_speed = fastest(speeds)
    s, v = pooled(gens), t[gamma + 1] / t[1]
    forwards = gamma * c + v  # a round's cost in target one-token forwards
    return {"target": names[0], "draft": names[1], "acceptance": "real" if a is None else "controlled",
            "a": "" if a is None else a, "gamma": gamma, "threads": threads, "alpha": s.alpha,
            "tokens_per_round": s.tokens_per_round, "fastest_ar": best_name, "fastest_ar_tok_s": best_speed,
            "paired_ar_tok_s": paired_speed, "ar_tok_s": ar_speed, "spec_tok_s": speed, "speedup": ratio,
            "speedup_vs_target_ar": speed / ar_speed,
            "predicted_speedup": predicted_speedup(s.alpha if a is None else a, gamma, c, v),
            "identical": [g.ids for g in gens] == [g.ids for g in ar_gens],
            "draft_share": s.seconds_draft / s.seconds, "verify_share": s.seconds_verify / s.seconds,
            "other_share": s.seconds_other / s.seconds, "c": c, "v": v,
            "overhead_ms_per_round": 1e3 * (s.seconds / s.rounds - forwards * t[1]),
            "ar_overhead_ms_per_token": 1e3 * (1 / ar_speed - t[1])}


def ar_row(shape, model, threads, speeds, bandwidth):
    """A row of the AR table: random:<shape>'s plain decoding with each kernel and the minimal decoder (tokens/s),
    the fastest, and the bandwidth roofline (the best read rate measured in the run: common.read_bandwidth, or a
    decoder's own rate if one read faster, so that no decoder sits above 1.0 of it)."""
    nbytes = models.matrix_bytes(model)
    name, best = fastest(speeds)
    bandwidth = common.best_read_rate(bandwidth, nbytes, 1 / best)
    return {"model": f"random:{shape}", "threads": threads, "weight_MB": nbytes / 1e6,
            "npspec_tok_s": speeds[model.kernel], "kernel": model.kernel,
            **{f"{k.replace('-', '_')}_tok_s": v for k, v in speeds.items()},
            "fastest_ar": name, "target_over_minimal": speeds[model.kernel] / speeds["minimal"],
            "roofline_tok_s": bandwidth / nbytes, "of_roofline": best * nbytes / bandwidth}


def shipped_rows(n_prompts, new_tokens, gammas, repeats, threads):
    target, draft = models.get("shipped:target", threads=threads), models.get("shipped:draft", threads=threads)
    prompts = models.validation_prompts(models.validation_ids(target.tokenizer), n_prompts)
    decoders = plain_decoders(target, prompts, new_tokens, threads)
    speeds, own = ar_speeds(decoders, target.kernel, repeats)
    ar, plain = (speeds[target.kernel], own), decoders[fastest(speeds)[0]]
    t, c = forward_costs(target, draft, gammas, max(repeats, 5), models.PROMPT_LENGTH + new_tokens // 2)
    rows = []
    for gamma in common.steps(gammas, "shipped pair, gamma"):
        spec = paired_runs(runner(target, draft, prompts, new_tokens, gamma), plain, repeats)
        rows.append(speedup_row(("shipped target", "shipped draft"), None, gamma, threads, ar, spec, t, c, speeds))
        common.log(f"shipped gamma {gamma}: AR {ar[0]:.1f} tok/s, spec {spec[0]:.1f} tok/s "
                   f"({rows[-1]['speedup']:.2f}x), alpha {rows[-1]['alpha']:.3f}")
    return rows


def controlled_rows(pair, new_tokens, a_values, gammas, repeats, threads, bandwidth):
    """Rows of the speedup table for one random-weight pair, and the target's row of the AR table.

    The models are warm from the AR run, so the speculative runs have no extra warm-up.
    """
    draft = models.get(f"random:{pair[1]}", seed=1, role="draft", threads=threads)
    target = models.get(f"random:{pair[0]}", seed=0, threads=threads, partner=draft)  # timed in rounds beside it
    prompt = models.random_prompt()
    decoders = plain_decoders(target, [prompt], new_tokens, threads)
    speeds, own = ar_speeds(decoders, target.kernel, repeats)
    ar, plain = (speeds[target.kernel], own), decoders[fastest(speeds)[0]]
    t, c = forward_costs(target, draft, gammas, repeats, len(prompt) + new_tokens // 2)
    greedy = prompt + ar[1][0].ids
    rows = []
    for a in common.steps(a_values, f"{pair[0]}/{pair[1]}, acceptance"):
        for gamma in gammas:
            steered = ControlledDraft(draft, greedy, a, np.random.default_rng(1000 * gamma + int(100 * a)))
            spec = paired_runs(runner(target, steered, [prompt], new_tokens, gamma), plain, repeats, warmup=False)
            rows.append(speedup_row((f"random:{pair[0]}", f"random:{pair[1]}"), a, gamma, threads, ar, spec, t, c,
                                    speeds))
            common.log(f"{pair[0]}/{pair[1]} a {a} gamma {gamma}: {rows[-1]['speedup']:.2f}x "
                       f"(predicted {rows[-1]['predicted_speedup']:.2f}x), alpha {rows[-1]['alpha']:.3f}")
    target_row = ar_row(pair[0], target, threads, speeds, bandwidth)
    del target, draft
    models.release()
    return rows, target_row


def plain_ar_row(shape, new_tokens, repeats, threads, bandwidth):
    """The AR table's row of a shape that is no pair's target: random:<shape> decoding alone, as a target would."""
    model = models.get(f"random:{shape}", threads=threads)
    speeds, _ = ar_speeds(plain_decoders(model, [models.random_prompt()], new_tokens, threads), model.kernel, repeats)
    row = ar_row(shape, model, threads, speeds, bandwidth)
    del model
    models.release()
    return row


def transformers_ar(shape, prompt_ids, new_tokens, repeats, threads):
    """tokens/s of transformers' GPT2LMHeadModel.generate, greedy, random weights of `shape`; None without torch."""
    try:
        import torch
        from transformers import GPT2Config as HFConfig, GPT2LMHeadModel
    except ImportError:
        return None
    c = SHAPES[shape]
    torch.manual_seed(0)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        hf = GPT2LMHeadModel(HFConfig(vocab_size=c.n_vocab, n_positions=c.n_ctx, n_embd=c.n_embd,
                                      n_layer=c.n_layer, n_head=c.n_head)).eval()
        ids = torch.tensor([prompt_ids])
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

        def once():
            with torch.inference_mode():
                t0 = time.perf_counter()
                hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)
                return new_tokens / (time.perf_counter() - t0)

        once()
        return common.median([once() for _ in range(repeats)])
    finally:
        torch.set_num_threads(old)


def numbers(kind):
    """A parser of comma-separated numbers of `kind` ("0.5,0.7" -> (0.5, 0.7))."""
    return lambda text: tuple(kind(x) for x in text.split(","))


def options(ap):
    ap.add_argument("--pairs", type=lambda text: [tuple(p.split("/")) for p in text.split(",")], default=None,
                    help="comma-separated target/draft shapes, e.g. gpt2-large/distilgpt2 (default: "
                         + ",".join("/".join(p) for p in FULL_PAIRS) + "; --quick: gpt2/distilgpt2)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per random-weight run (default 64; --quick: 24)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per row, median taken (default 3; --quick: 1)")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers baseline")
    ap.add_argument("--a", type=numbers(float), default=None,
                    help="controlled acceptances, comma-separated (default 0.5,0.7,0.9; --quick: 0.7)")
    ap.add_argument("--gammas", type=numbers(int), default=None, help="gammas, comma-separated (default 1,2,3,4,8; "
                                                                       "--quick: 1,4)")


def main(argv=None):
    run = common.command_line("bench.speedup", __doc__, argv, options, threads=("2", "1"))
    args = run.args
    pairs = args.pairs or (QUICK_PAIRS if args.quick else FULL_PAIRS)
    new_tokens = args.new_tokens or (24 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 3)
    a_values = args.a or ((0.7,) if args.quick else (0.5, 0.7, 0.9))
    gammas = args.gammas or ((1, 4) if args.quick else (1, 2, 3, 4, 8))
    n_prompts, shipped_tokens = (2, 32) if args.quick else (8, 128)
    rows, ar_rows = [], []
    for n in run.threads:
        with common.blas_threads(n):
            bandwidth = common.read_bandwidth()
            run.meta[f"read_bandwidth_GBps_{n}_threads"] = f"{bandwidth / 1e9:.1f}"
            rows += shipped_rows(n_prompts, shipped_tokens, gammas, repeats, n)
            ar = {}  # shape -> its AR row; each shape once, in first-seen order
            for i, pair in enumerate(pairs):  # the full a grid for the first pair, a = 0.7 for the others
                r, target_row = controlled_rows(pair, new_tokens, a_values if i == 0 else (0.7,), gammas, repeats, n,
                                                bandwidth)
                rows += r
                ar.setdefault(pair[0], target_row)
                if pair[1] not in ar:
                    ar[pair[1]] = plain_ar_row(pair[1], new_tokens, repeats, n, bandwidth)
            for shape, row in ar.items():
                hf = (None if args.no_transformers
                      else transformers_ar(shape, models.random_prompt(), new_tokens, repeats, n))
                row["transformers_tok_s"] = float("nan") if hf is None else hf
                row["npspec_vs_transformers"] = float("nan") if hf is None else row["npspec_tok_s"] / hf
                ar_rows.append(row)
                common.log(f"AR {shape}: npspec {row['npspec_tok_s']:.1f} tok/s ({row['of_roofline']:.2f} of "
                           f"roofline), transformers {row['transformers_tok_s']:.1f} tok/s")
    run.meta["new_tokens"] = (f"random-weight rows: {new_tokens} (prompt {models.PROMPT_LENGTH} tokens); shipped pair: "
                              f"{shipped_tokens} tokens x {n_prompts} prompts")
    note = ("Greedy decoding. \"controlled\" rows use random weights with CONTROLLED ACCEPTANCE: each draft token "
            "is the target's greedy token with probability a (bench/controlled.py), the draft's real forward still "
            "runs. predicted_speedup = E[tokens/round] / (gamma c + v) (npspec.decode.evaluate.predicted_speedup) at alpha "
            "= a (controlled) or the measured alpha (real), c = t_draft(1)/t_target(1), "
            "v = t_target(gamma+1)/t_target(1), measured in the same run. speedup: the median over the row's runs of "
            "its tokens/s over that of a plain decoding with the fastest plain decoder (fastest_ar), run right after "
            "it (paired_ar_tok_s: their median). Medians of the timed runs after a warm-up. "
            "identical: greedy output equal to AR decoding.")
    return common.finish(run, [
        common.Table("speedup", rows, "Speculative vs AR decoding (greedy)", note),
        common.Table("speedup_ar", ar_rows, "AR decode: npspec, the bandwidth roofline, transformers",
                     "roofline_tok_s = read bandwidth / (weight matrix + head bytes per token), measured in the same "
                     "run; transformers: GPT2LMHeadModel.generate, greedy, same shape, random weights, torch CPU.")])


if __name__ == "__main__":
    sys.exit(main())
