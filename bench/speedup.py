"""python -m bench.speedup: speculative against plain (AR) decoding, greedy, tokens per second.

Rows (all greedy, temperature 0, so the output must be token-identical to AR decoding):
  * the shipped pair, with its real acceptance, on fixed validation prompts;
  * GPT-2 shapes with random weights (gpt2-large/distilgpt2, gpt2-medium/distilgpt2,
    gpt2-large/gpt2, gpt2/distilgpt2) with CONTROLLED ACCEPTANCE (bench/controlled.py): the
    real draft forward runs, but each draft token is the target's greedy token with
    probability a; gamma = 1, 2, 4, 8 with a = 0.5, 0.7, 0.9 for the first pair, a = 0.7 for the others.
Each speed is the median over runs after a warm-up run. Next to each controlled row, the
prediction E[tokens/round] / (gamma c + t(gamma+1)/t(1)) from Leviathan et al. 2023 (section
3.4, with E[tokens/round] = (1 - a^(gamma+1)) / (1 - a)), with the draft/target cost ratio
c = t_draft(1)/t_target(1) and the target's forward times t(M) measured in the same run.

A second table, speedup_ar.csv, compares npspec's AR decode on each shape with the bandwidth
roofline (weight bytes per token / read bandwidth, measured in the same run) and, when torch and
transformers are installed, with transformers' GPT2LMHeadModel.generate (greedy, random
weights of the same shape) as "what a user would pick instead".
"""

import sys
import time
from dataclasses import dataclass

import numpy as np

from npspec.evaluate import fixed_prompts, split_corpus
from npspec.models import as_draft, shipped_dir
from npspec.speculative import Stats, speculative_generate

from . import common, models
from .controlled import ControlledDraft
from .verify_cost import time_forward

FULL_PAIRS = [("gpt2-large", "distilgpt2"), ("gpt2-medium", "distilgpt2"), ("gpt2-large", "gpt2"),
              ("gpt2", "distilgpt2")]
QUICK_PAIRS = [("gpt2", "distilgpt2")]
PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog chases the fox around the"


def expected_tokens_per_round(a, gamma):
    """E[tokens per round] = (1 - a^(gamma+1)) / (1 - a) for i.i.d. acceptance a (Leviathan et al. 2023, eq. 1)."""
    return gamma + 1.0 if a == 1 else (1 - a ** (gamma + 1)) / (1 - a)


def median_run(run, repeats, warmup=True):
    """A warm-up run (unless warmup=False), then `repeats` runs; returns (median tokens/s, the last Generation)."""
    if warmup:
        run()
    speeds, gen = [], None
    for _ in range(repeats):
        gen = run()
        speeds.append(gen.stats.new_tokens / gen.stats.seconds)
    return common.median(speeds), gen


@dataclass
class Pooled:
    """Generations over several prompts: their ids, pooled token count and seconds, and each run's Stats."""

    ids: list
    stats: Stats
    parts: list


def shipped_rows(n_prompts, new_tokens, gammas, repeats, threads, log):
    from npspec.models import load

    target, draft = load(None, "target"), load(None, "draft")
    text = (shipped_dir("shakespeare/target").parent / "input.txt").read_text(encoding="utf-8")
    prompts = fixed_prompts(target.tokenizer.encode(split_corpus(text)[1]).ids, n=n_prompts, length=16)

    def run_all(gamma):
        def run():
            gens = [speculative_generate(target, draft, p, new_tokens, gamma=gamma, temperature=0) for p in prompts]
            total = Stats(new_tokens=sum(g.stats.new_tokens for g in gens), seconds=sum(g.stats.seconds for g in gens))
            return Pooled([g.ids for g in gens], total, [g.stats for g in gens])
        return run

    ar_speed, ar = median_run(run_all(0), repeats)
    context = 16 + new_tokens // 2
    t = {m: time_forward(target, m, None, max(repeats, 5), context) for m in range(1, max(gammas) + 2)}
    c = time_forward(draft, 1, None, max(repeats, 5), context) / t[1]
    rows = []
    for gamma in gammas:
        speed, spec = median_run(run_all(gamma), repeats)
        parts = spec.parts
        accepted, rejected = sum(s.accepted for s in parts), sum(s.rejected for s in parts)
        rounds = sum(s.rounds for s in parts)
        split = {k: sum(getattr(s, k) for s in parts) / sum(s.seconds for s in parts)
                 for k in ("seconds_draft", "seconds_verify", "seconds_other")}
        tokens_per_round = sum(s.new_tokens for s in parts) / rounds
        forwards = gamma * c + t[gamma + 1] / t[1]  # per round, in target one-token forwards
        seconds_per_round = sum(s.seconds for s in parts) / rounds
        rows.append({"target": "shipped target", "draft": "shipped draft", "acceptance": "real", "a": "",
                     "gamma": gamma, "threads": threads, "alpha": accepted / max(accepted + rejected, 1),
                     "tokens_per_round": tokens_per_round,
                     "ar_tok_s": ar_speed, "spec_tok_s": speed, "speedup": speed / ar_speed,
                     "predicted_speedup": tokens_per_round / forwards, "identical": spec.ids == ar.ids,
                     "draft_share": split["seconds_draft"], "verify_share": split["seconds_verify"],
                     "other_share": split["seconds_other"], "c": c, "v": t[gamma + 1] / t[1],
                     "overhead_ms_per_round": 1e3 * (seconds_per_round - forwards * t[1]),
                     "ar_overhead_ms_per_token": 1e3 * (1 / ar_speed - t[1])})
        log(f"shipped gamma {gamma}: AR {ar_speed:.1f} tok/s, spec {speed:.1f} tok/s ({speed / ar_speed:.2f}x), "
            f"alpha {rows[-1]['alpha']:.3f}")
    return rows


def transformers_ar(shape, prompt_ids, new_tokens, repeats, threads):
    """tokens/s of transformers' GPT2LMHeadModel.generate, greedy, random weights of `shape`; None without torch."""
    try:
        import torch
        from transformers import GPT2Config as HFConfig, GPT2LMHeadModel
    except ImportError:
        return None
    from npspec.init import SHAPES

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
        del hf


def controlled_rows(pair, new_tokens, a_values, gammas, repeats, threads, bandwidth, log):
    """Rows of the speedup table for one random-weight pair, and its row of the AR table.

    The models are warm from the AR run, so the speculative runs have no extra warm-up.
    """
    target, draft = models.get(f"random:{pair[0]}", seed=0), models.get(f"random:{pair[1]}", seed=1)
    as_draft(draft)  # decode as npspec.models.load(spec, "draft") does
    prompt = target.tokenizer.encode(PROMPT).ids[:16]
    ar_speed, ar = median_run(lambda: speculative_generate(target, None, prompt, new_tokens, gamma=0,
                                                           temperature=0), repeats)
    greedy = prompt + ar.ids
    context = len(prompt) + new_tokens // 2
    t = {m: time_forward(target, m, None, repeats, context) for m in range(1, max(gammas) + 2)}
    c = time_forward(draft, 1, None, repeats, context) / t[1]
    rows = []
    for a in a_values:
        for gamma in gammas:
            rng = np.random.default_rng(1000 * gamma + int(100 * a))
            steered = ControlledDraft(draft, greedy, a, rng)
            speed, spec = median_run(lambda: speculative_generate(target, steered, prompt, new_tokens, gamma=gamma,
                                                                  temperature=0), repeats, warmup=False)
            s = spec.stats
            predicted = expected_tokens_per_round(a, gamma) / (gamma * c + t[gamma + 1] / t[1])
            rows.append({"target": f"random:{pair[0]}", "draft": f"random:{pair[1]}", "acceptance": "controlled",
                         "a": a, "gamma": gamma, "threads": threads, "alpha": s.alpha,
                         "tokens_per_round": s.tokens_per_round, "ar_tok_s": ar_speed, "spec_tok_s": speed,
                         "speedup": speed / ar_speed, "predicted_speedup": predicted,
                         "identical": spec.ids == ar.ids, "draft_share": s.seconds_draft / s.seconds,
                         "verify_share": s.seconds_verify / s.seconds, "other_share": s.seconds_other / s.seconds,
                         "c": c, "v": t[gamma + 1] / t[1],
                         "overhead_ms_per_round": 1e3 * (s.seconds / s.rounds - (gamma * c + t[gamma + 1] / t[1]) * t[1]),
                         "ar_overhead_ms_per_token": 1e3 * (1 / ar_speed - t[1])})
            log(f"{pair[0]}/{pair[1]} a {a} gamma {gamma}: {speed / ar_speed:.2f}x (predicted {predicted:.2f}x), "
                f"alpha {s.alpha:.3f}")
    ar_row = {"model": f"random:{pair[0]}", "threads": threads, "weight_MB": models.matrix_bytes(target) / 1e6,
              "npspec_tok_s": ar_speed, "roofline_tok_s": bandwidth / models.matrix_bytes(target),
              "of_roofline": ar_speed * models.matrix_bytes(target) / bandwidth}
    del target, draft
    models.release()
    return rows, ar_row, prompt


def main(argv=None):
    ap = common.parser("bench.speedup", __doc__.split("\n")[0])
    ap.add_argument("--pairs", default=None,
                    help="comma-separated target/draft shapes, e.g. gpt2-large/distilgpt2 (default: the four of the "
                         "issue; --quick: gpt2/distilgpt2)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per random-weight run (default 64; --quick: 24)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per row, median taken (default 3; --quick: 1)")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers baseline")
    ap.add_argument("--a", default=None, help="controlled acceptances, comma-separated (default 0.5,0.7,0.9)")
    ap.add_argument("--gammas", default=None, help="gammas, comma-separated (default 1,2,4,8)")
    args = ap.parse_args(argv)
    out = common.output_dir(args)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    pairs = ([tuple(p.split("/")) for p in args.pairs.split(",")] if args.pairs
             else QUICK_PAIRS if args.quick else FULL_PAIRS)
    new_tokens = args.new_tokens or (24 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 3)
    a_values, gammas = ((0.7,), (1, 4)) if args.quick else ((0.5, 0.7, 0.9), (1, 2, 4, 8))
    a_values = tuple(float(a) for a in args.a.split(",")) if args.a else a_values
    gammas = tuple(int(g) for g in args.gammas.split(",")) if args.gammas else gammas
    threads = common.thread_counts(args) if args.threads else [1 if args.quick else 2]
    meta = common.machine_info()
    rows, ar_rows = [], []
    for n in threads:
        with common.blas_threads(n):
            bandwidth = common.read_bandwidth()
            meta[f"read_bandwidth_GBps_{n}_threads"] = f"{bandwidth / 1e9:.1f}"
            rows += shipped_rows(2 if args.quick else 8, 32 if args.quick else 128, gammas, repeats, n, log)
            seen = set()
            for i, pair in enumerate(pairs):  # the full a grid for the first pair, a = 0.7 for the others
                r, ar_row, prompt = controlled_rows(pair, new_tokens, a_values if i == 0 else (0.7,), gammas, repeats, n,
                                                    bandwidth, log)
                rows += r
                for shape in pair:
                    if shape in seen:
                        continue
                    seen.add(shape)
                    if shape == pair[0]:
                        row = ar_row
                    else:
                        m = models.get(f"random:{shape}")
                        speed, _ = median_run(lambda: speculative_generate(m, None, prompt, new_tokens, gamma=0,
                                                                           temperature=0), repeats)
                        row = {"model": f"random:{shape}", "threads": n, "weight_MB": models.matrix_bytes(m) / 1e6,
                               "npspec_tok_s": speed, "roofline_tok_s": bandwidth / models.matrix_bytes(m),
                               "of_roofline": speed * models.matrix_bytes(m) / bandwidth}
                        del m
                        models.release()
                    hf = None if args.no_transformers else transformers_ar(shape, prompt, new_tokens, repeats, n)
                    row["transformers_tok_s"] = float("nan") if hf is None else hf
                    row["npspec_vs_transformers"] = float("nan") if hf is None else row["npspec_tok_s"] / hf
                    ar_rows.append(row)
                    log(f"AR {shape}: npspec {row['npspec_tok_s']:.1f} tok/s ({row['of_roofline']:.2f} of roofline), "
                        f"transformers {row['transformers_tok_s']:.1f} tok/s")
    meta["new_tokens"] = f"{new_tokens} (random-weight rows; prompt 16 tokens), shipped pair: 128 tokens x 8 prompts"
    meta["command"] = "python -m bench.speedup " + " ".join(argv if argv is not None else sys.argv[1:])
    note = ("Greedy decoding. \"controlled\" rows use random weights with CONTROLLED ACCEPTANCE: each draft token "
            "is the target's greedy token with probability a (bench/controlled.py), the draft's real forward still "
            "runs. predicted_speedup = E[tokens/round] / (gamma c + v), c = t_draft(1)/t_target(1), "
            "v = t_target(gamma+1)/t_target(1), measured in the same run. Median of the timed runs after a warm-up. "
            "identical: greedy output equal to AR decoding.")
    common.write_table(out, "speedup", rows, meta, "Speculative vs AR decoding (greedy)", note)
    common.write_table(out, "speedup_ar", ar_rows, meta, "AR decode: npspec, the bandwidth roofline, transformers",
                       "roofline_tok_s = read bandwidth / (weight matrix + head bytes per token), measured in the same "
                       "run; transformers: GPT2LMHeadModel.generate, greedy, same shape, random weights, torch CPU.")
    print(f"wrote {out / 'speedup.md'}, {out / 'speedup_ar.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
