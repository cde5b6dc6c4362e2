"""python -m bench.verification: block against token verification, RSD against i.i.d. tree children, with 95% intervals.

On the shipped pair (real acceptance), tables from interleaved runs (--tables chain, tree, exact-match):
  * verification_chain: the shipped draft model proposing a chain at gamma 2..8, temperatures 0.8 and 1.0 (top-p
    1.0: no nucleus cut, p and q the models' whole softmax rows), decoded with verify="token" (Leviathan et al.
    2023) and verify="block" (Sun et al. 2025, npspec.decode.rules.block_accept): mean_acceptance_length (vLLM's
    1 + accepted / rounds with a proposal), alpha, tokens per round and tokens/s, each the pooled ratio over n
    independent (prompt, seed) runs with its 95% interval; plus greedy rows (temperature 0, a few prompts) whose
    `identical` says block's ids, token's ids and plain greedy decoding's are the same.
  * verification_chain_paired: block - token per (temperature, gamma) on the same (prompt, seed) runs (the same
    seeded uniforms for both rules, common random numbers), each with its 95% interval; the tokens/s gain
    block / token - 1 beside what the paper reports.
  * verification_tree, verification_tree_paired: static token trees (4,1 and 2,2,2) with today's rule (children
    drawn i.i.d., npspec.decode.rules.trees.accept_tree: TreeDrafter with verify="token") against RSD (children drawn without
    replacement, npspec.decode.rules.accept_tree_rsd: DistinctTreeDrafter with verify="rsd", what --verify rsd picks), the
    same figures, rsd - iid paired.
  * verification_exact_match, verification_exact_match_paired (--tables exact-match, not in the default): the chain
    under token, block and exact-match (the engines' "strict", npspec.decode.rules.exact_match_accept) at the same
    gammas and temperatures, acceptance figures only; beside each measured mean_acceptance_length the expectation the
    rule's own per-position chance gives (Expectations), and exact-match - token, exact-match - block paired.
Each (prompt, seed) run decodes `--new-tokens` ids after a PROMPT_LENGTH-id validation prompt; the arms run
back to back on it, their order rotated by one each run (of two, the first first on even runs and the second first
on odd ones), so a change of load hits them alike.

Intervals: a pooled figure is a ratio r = sum(num_i) / sum(den_i) over the n runs (mean_acceptance_length: num =
accepted + rounds with a proposal, den = rounds with a proposal; alpha: accepted / tested; tokens per round: new
tokens / rounds; tokens/s: new tokens / seconds). Its standard error is the ratio estimator's (Cochran, Sampling
Techniques, 1977, section 6.3): se^2 = sum (num_i - r den_i)^2 / (n (n - 1) mean(den)^2); a paired difference
r_b - r_t takes the same form with z_i = (num_b,i - r_b den_b,i) / mean(den_b) - (num_t,i - r_t den_t,i) /
mean(den_t). The 95% interval is +- 1.96 se (normal approximation over n independent runs). Acceptance figures do
not depend on the machine's load; tokens/s does (the header records the load average at the start).
"""

import argparse
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from npspec.decode import get_rule, speculative_generate
from npspec.decode.rules import RULES as REGISTRY
from npspec.decode.drafters import TREE_DRAFTERS, ModelDrafter
from npspec.decode.rules.trees import branching_tree

from . import common, models

TEMPERATURES = (0.8, 1.0)
GAMMAS = (2, 3, 4, 5, 6, 7, 8)
TOP_P = 1.0
RULES = ("token", "block")
TREES = ((4, 1), (2, 2, 2))  # 8 and 14 nodes, as bench.trees
TABLES = ("chain", "tree", "exact-match")
DEFAULT_TABLES = ("chain", "tree")
STRICT = ("token", "block", "exact-match")  # the exact-match tables' arms; exact-match - each other one, paired
ACCEPTANCE = ("mean_acceptance_length", "alpha", "tokens_per_round")  # what they pool: no timing
KEEP = {"token": "sum_min", "exact-match": "sum_pq"}  # each rule's chance to keep a tested draft, given p and q
Z95 = 1.959964  # the two-sided 95% point of the normal law
PAPER = ("Sun et al. 2025 (Block Verification Accelerates Speculative Decoding, ICLR, arXiv 2403.10444) report "
         "5-8% wall-clock gains of block over token verification on large models")

# what each pooled figure divides: (numerator, denominator) of one run's Stats
FIGURES = {
    "mean_acceptance_length": lambda s: (s.accepted + s.num_drafts, s.num_drafts),
    "alpha": lambda s: (s.accepted, s.accepted + s.rejected),
    "tokens_per_round": lambda s: (s.new_tokens, s.rounds),
    "tok_s": lambda s: (s.new_tokens, s.seconds),
    "verify_ms_per_round": lambda s: (1e3 * s.seconds_verify, s.rounds),  # prefill included
}


def ratio(num, den):  # [n], [n] -> (r, se)
    """The pooled ratio r = sum(num) / sum(den) over n independent runs and its standard error (the ratio
    estimator's, Cochran 1977, 6.3): se^2 = sum (num_i - r den_i)^2 / (n (n - 1) mean(den)^2). se is nan for n < 2.
    Raises ValueError if the lengths differ or sum(den) is 0."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if num.shape != den.shape or den.sum() == 0:
        raise ValueError(f"a ratio needs as many numerators as denominators and a positive total, got {num.shape}, "
                         f"{den.shape} with sum {den.sum()}")
    r, n = num.sum() / den.sum(), len(num)
    se = np.sqrt(((num - r * den) ** 2).sum() / (n * (n - 1))) / den.mean() if n > 1 else float("nan")
    return float(r), float(se)


def paired_difference(num_a, den_a, num_b, den_b):  # 4 x [n] -> (r_b - r_a, se)
    """r_b - r_a of two pooled ratios measured on the same n runs (run i of a paired with run i of b), and its
    standard error: the ratio estimator's linearisation z_i = (num_b,i - r_b den_b,i) / mean(den_b) - (num_a,i -
    r_a den_a,i) / mean(den_a), se^2 = sum z_i^2 / (n (n - 1)). se is nan for n < 2."""
    num_a, den_a, num_b, den_b = (np.asarray(x, dtype=np.float64) for x in (num_a, den_a, num_b, den_b))
    (r_a, _), (r_b, _) = ratio(num_a, den_a), ratio(num_b, den_b)
    z = (num_b - r_b * den_b) / den_b.mean() - (num_a - r_a * den_a) / den_a.mean()
    n = len(z)
    return r_b - r_a, float(np.sqrt((z ** 2).sum() / (n * (n - 1)))) if n > 1 else float("nan")


def figures(stats, names=tuple(FIGURES)):
    """{figure: value, figure_ci95: half-width} of the FIGURES `names` pooled over `stats` (one Stats per run)."""
    out = {}
    for name in names:
        parts = FIGURES[name]
        num, den = zip(*(parts(s) for s in stats))
        r, se = ratio(num, den)
        out[name], out[f"{name}_ci95"] = r, Z95 * se
    return out


def paired(stats_a, stats_b, names=tuple(FIGURES)):
    """{figure_diff: r_b - r_a, figure_diff_ci95} for the FIGURES `names`, and (when tok_s is one of them) tok_s_gain =
    r_b / r_a - 1 with its interval (the difference's over r_a), on runs paired by position."""
    out = {}
    for name in names:
        parts = FIGURES[name]
        (num_a, den_a), (num_b, den_b) = (zip(*(parts(s) for s in stats)) for stats in (stats_a, stats_b))
        diff, se = paired_difference(num_a, den_a, num_b, den_b)
        out[f"{name}_diff"], out[f"{name}_diff_ci95"] = diff, Z95 * se
    if "tok_s" not in names:
        return out
    base = ratio(*zip(*(FIGURES["tok_s"](s) for s in stats_a)))[0]
    out["tok_s_gain"], out["tok_s_gain_ci95"] = out["tok_s_diff"] / base, out["tok_s_diff_ci95"] / base
    return out


def rule_microseconds(name, gamma, n_vocab, repeats=200):
    """Median microseconds of one call of the registered rule's chain function (get_rule(name).chain) on a round of
    `gamma` drafts over `n_vocab` ids: softmax rows of scaled normal logits, drafts drawn from q. Its cost alone,
    without the forward (which both rules share)."""
    rng = np.random.default_rng(0)

    def rows(n):
        x = np.exp(3.0 * rng.standard_normal((n, n_vocab)))
        return x / x.sum(axis=1, keepdims=True)
    p, q = rows(gamma + 1), rows(gamma)
    d = np.array([rng.choice(n_vocab, p=row) for row in q])
    u, chain = rng.random(gamma), get_rule(name).chain
    return 1e6 * common.median(common.time_call(lambda: chain(d, p, q, u, 0.5), repeats, warmup=5))


def decode_arms(target, arms, prompt, new_tokens, gamma, temperature, seed, shift):
    """One (prompt, seed) run under every arm, the arms' order rotated by `shift` (of two arms, the first first on
    even runs and the second on odd ones): {arm: Generation}. arms: {name: (make_drafter, verify)}; each run seeded with `seed` (the
    same uniforms for every arm)."""
    names = list(arms)
    order = names[shift % len(names):] + names[:shift % len(names)]
    return {name: speculative_generate(target, arms[name][0](), prompt, new_tokens, gamma=gamma,
                                       temperature=temperature, top_p=TOP_P if temperature else 1.0,
                                       rng=np.random.default_rng(seed), verify=arms[name][1])
            for name in order}


def decode_runs(target, arms, chosen, new_tokens, gamma, temperature, after=None):
    """Every arm on the (prompt, seed) runs `chosen`, arms interleaved (decode_arms): {arm: [Generation per run]}.
    after(): called after each run's arms (Expectations.take collects what the rules saw)."""
    gens = {name: [] for name in arms}
    for i, (prompt, seed) in enumerate(chosen):
        for name, g in decode_arms(target, arms, prompt, new_tokens, gamma, temperature, seed, i).items():
            gens[name].append(g)
        if after is not None:
            after()
    return gens


def plain_greedy(target, chosen, new_tokens):
    """Plain greedy decoding's ids on each run's prompt: what `identical` compares against."""
    return [speculative_generate(target, None, p, new_tokens, temperature=0).ids for p, _ in chosen]


def compared(target, arms, runs, prompts, new_tokens, gamma, temperatures, greedy_prompts, fields, rule_us=None):
    """Rows and paired rows of every arm at each temperature (0.0 first: greedy rows on `greedy_prompts` prompts,
    `identical` to plain greedy decoding), the last arm minus the first. fields(temperature): the rows' leading
    columns; rule_us(arm): its rule's microseconds, or None."""
    rows, pairs = [], []
    first, last = list(arms)[0], list(arms)[-1]
    for temperature in (0.0, *temperatures):
        chosen = runs if temperature else [(p, 0) for p in prompts[:greedy_prompts]]
        plain = plain_greedy(target, chosen, new_tokens) if not temperature else None
        gens = decode_runs(target, arms, chosen, new_tokens, gamma, temperature)
        stats = {name: [g.stats for g in gens[name]] for name in arms}
        for name in arms:
            row = {**fields(temperature), "verify": arms[name][1], "runs": len(chosen),
                   "new_tokens": sum(s.new_tokens for s in stats[name]), "rounds": sum(s.rounds for s in stats[name]),
                   **figures(stats[name]), **({"rule_us": rule_us(name)} if rule_us else {}),
                   "identical": [g.ids for g in gens[name]] == plain if plain is not None else ""}
            rows.append(row)
            common.log(f"{', '.join(f'{k} {v}' for k, v in fields(temperature).items())}, {name}: mean acceptance "
                       f"length {row['mean_acceptance_length']:.3f} +- {row['mean_acceptance_length_ci95']:.3f}, "
                       f"{row['tok_s']:.1f} tok/s")
        if temperature:
            pairs.append({**fields(temperature), "runs": len(chosen), **paired(stats[first], stats[last])})
    return rows, pairs


@dataclass
class Sums:
    """What a rule saw in one run: over its tested positions i (a round of k drafts keeping n tests i <= min(n, k -
    1)), pq = sum_i sum_x p_i(x) q_i(x) and mins = sum_i sum_x min(p_i(x), q_i(x)); tested positions; drafts (rounds
    with a proposal)."""

    pq: float = 0.0
    mins: float = 0.0
    tested: int = 0
    drafts: int = 0


class Expectations:
    """Inside `with Expectations(names) as e:` the rules `names` of npspec.decode.rules.RULES (the registry
    speculative_generate reads) are wrapped so that each chain call adds to e.sums[name] (Sums) what it tested; their
    results are unchanged, and the registry is restored on exit. e.take(): {name: Sums} since the last take.

    Given everything before position i, exact-match keeps d_i with chance sum_x p_i q_i and the token rule with
    sum_x min(p_i, q_i) (notes/derivation.md; tests/test_exact_match.py); the kept drafts are the sum of the keeps
    over the tested positions, so that sum of chances has their expectation (a martingale) and 1 + sum / drafts is
    an estimate of mean_acceptance_length with the same expectation (block keeps more than its own per-position
    sums: no such estimate for it)."""

    def __init__(self, names):
        self.names, self.sums = tuple(names), {name: Sums() for name in names}

    def __enter__(self):
        self.saved = {name: REGISTRY[name] for name in self.names}
        for name in self.names:
            REGISTRY[name] = replace(self.saved[name], chain=self.watched(self.saved[name].chain, name))
        return self

    def __exit__(self, *exc):
        REGISTRY.update(self.saved)

    def watched(self, chain, name):
        def chain_watched(d, p, q, u_tests, u_final):  # token.accept's signature
            n, token = chain(d, p, q, u_tests, u_final)
            if len(d):
                t, s = min(n + 1, len(d)), self.sums[name]
                s.pq += float((p[:t] * q[:t]).sum())
                s.mins += float(np.minimum(p[:t], q[:t]).sum())
                s.tested, s.drafts = s.tested + t, s.drafts + 1
            return n, token
        return chain_watched

    def take(self):
        out, self.sums = self.sums, {name: Sums() for name in self.names}
        return out


def expected(stats, sums, name):
    """The expectation columns of rule `name`'s row: per tested position sum_pq and sum_min (pooled over the runs'
    Sums, 95% intervals) and, for a rule in KEEP, expected_mean_acceptance_length = 1 + its chances / drafts, and
    expected_minus_measured (paired with the measured figure on the same runs; its interval should cover 0)."""
    tested = [s.tested for s in sums]
    out = {}
    for column, part in (("sum_pq", [s.pq for s in sums]), ("sum_min", [s.mins for s in sums])):
        r, se = ratio(part, tested)
        out[column], out[f"{column}_ci95"] = r, Z95 * se
    if name in KEEP:
        num, den = expected_acceptance(sums, name)
        r, se = ratio(num, den)
        measured = [FIGURES["mean_acceptance_length"](s) for s in stats]
        diff, dse = paired_difference(*zip(*measured), num, den)
        out.update(expected_mean_acceptance_length=r, expected_mean_acceptance_length_ci95=Z95 * se,
                   expected_minus_measured=diff, expected_minus_measured_ci95=Z95 * dse)
    return out


def expected_acceptance(sums, name):  # -> (num [n], den [n])
    """Per run, drafts + the rule's summed chances to keep and drafts: expected_mean_acceptance_length's ratio."""
    keep = [s.pq if KEEP[name] == "sum_pq" else s.mins for s in sums]
    return [s.drafts + k for s, k in zip(sums, keep)], [s.drafts for s in sums]


def exact_match_rows(target, draft, prompts, seeds, new_tokens, gammas, temperatures, greedy_prompts):
    """The rows of both exact-match tables: (per rule of STRICT, paired exact-match - token and - block), by
    temperature then gamma; the rules' Sums checked against each run's Stats (drafts and tested positions)."""
    speculative_generate(target, ModelDrafter(draft), prompts[0], new_tokens, gamma=gammas[0])  # warm-up
    arms = {verify: (lambda: ModelDrafter(draft), verify) for verify in STRICT}
    rows, pairs = [], []
    for gamma in common.steps(gammas, "exact-match chains, gamma"):
        for temperature in (0.0, *temperatures):
            fields = {"temperature": temperature, "top_p": TOP_P if temperature else 1.0, "gamma": gamma}
            chosen = run_list(prompts, seeds) if temperature else [(p, 0) for p in prompts[:greedy_prompts]]
            sums = {name: [] for name in arms}
            with Expectations(STRICT) as e:
                def after():
                    for name, s in e.take().items():
                        sums[name].append(s)
                gens = decode_runs(target, arms, chosen, new_tokens, gamma, temperature, after)
            stats = {name: [g.stats for g in gens[name]] for name in arms}
            plain = plain_greedy(target, chosen, new_tokens) if not temperature else None
            for name in arms:
                row = {**fields, "verify": name, "runs": len(chosen),
                       "new_tokens": sum(s.new_tokens for s in stats[name]),
                       "rounds": sum(s.rounds for s in stats[name]), **figures(stats[name], ACCEPTANCE),
                       "identical": [g.ids for g in gens[name]] == plain if plain is not None else ""}
                if temperature:  # what the rule saw is what the run counted (an accepted EOS would cut it)
                    row["tests_seen"] = all((s.drafts, s.tested) == (st.num_drafts, st.accepted + st.rejected)
                                            for s, st in zip(sums[name], stats[name]))
                    row.update(expected(stats[name], sums[name], name))
                rows.append(row)
                common.log(f"T {temperature}, gamma {gamma}, {name}: mean acceptance length "
                           f"{row['mean_acceptance_length']:.3f} +- {row['mean_acceptance_length_ci95']:.3f}"
                           + (f", expected {row['expected_mean_acceptance_length']:.3f}"
                              if "expected_mean_acceptance_length" in row else ""))
            if temperature:
                for other in STRICT[:-1]:
                    pair = {**fields, "pair": f"exact-match - {other}", "runs": len(chosen),
                            **paired(stats[other], stats["exact-match"], ACCEPTANCE)}
                    if other in KEEP:
                        diff, se = paired_difference(*expected_acceptance(sums[other], other),
                                                     *expected_acceptance(sums["exact-match"], "exact-match"))
                        pair.update(expected_mean_acceptance_length_diff=diff,
                                    expected_mean_acceptance_length_diff_ci95=Z95 * se)
                    pairs.append(pair)
    order = lambda r: (r["temperature"], r["gamma"])  # noqa: E731  (stable: by temperature, then gamma)
    return sorted(rows, key=order), sorted(pairs, key=order)


def run_list(prompts, seeds):
    """The independent (prompt, seed) runs: every prompt with `seeds` seeds, 1000 * prompt index + seed."""
    return [(prompt, 1000 * j + s) for j, prompt in enumerate(prompts) for s in range(seeds)]


def chain_rows(target, draft, prompts, seeds, new_tokens, gammas, temperatures, greedy_prompts):
    """The rows of both chain tables: (per rule, paired block - token), by temperature then gamma."""
    n_vocab = target.config.n_vocab
    speculative_generate(target, ModelDrafter(draft), prompts[0], new_tokens, gamma=gammas[0])  # warm-up
    arms = {verify: (lambda: ModelDrafter(draft), verify) for verify in RULES}
    rows, pairs = {}, {}
    for gamma in common.steps(gammas, "verification chains, gamma"):
        got = compared(target, arms, run_list(prompts, seeds), prompts, new_tokens, gamma, temperatures,
                       greedy_prompts, lambda t: {"temperature": t, "top_p": TOP_P if t else 1.0, "gamma": gamma},
                       lambda verify: rule_microseconds(verify, gamma, n_vocab))
        rows[gamma], pairs[gamma] = got
    order = lambda r: (r["temperature"], r["gamma"])  # noqa: E731  (by temperature, then gamma, as the tables read)
    return (sorted((r for g in gammas for r in rows[g]), key=order),
            [{**p, "paper_tok_s_gain": "0.05-0.08 (large models)"} for p in sorted((p for g in gammas
                                                                                       for p in pairs[g]), key=order)])


def tree_rows(target, draft, prompts, seeds, new_tokens, trees, temperatures, greedy_prompts):
    """The rows of both tree tables: today's i.i.d. children with the token rule's tree form against RSD (children
    without replacement, the "rsd" rule), each drafter picked for its rule as the CLI does (TREE_DRAFTERS)."""
    rows, pairs = [], []
    for branching in common.steps(trees, "verification trees"):
        arms = {name: ((lambda v: lambda: TREE_DRAFTERS[get_rule(v).siblings](draft, branching))(verify), verify)
                for name, verify in (("iid", "token"), ("rsd", "rsd"))}
        shape = {"tree": ",".join(map(str, branching)), "nodes": len(branching_tree(branching)),
                 "depth": len(branching)}
        got = compared(target, arms, run_list(prompts, seeds), prompts, new_tokens, len(branching), temperatures,
                       greedy_prompts, lambda t: {"temperature": t, "top_p": TOP_P if t else 1.0, **shape})
        rows += [{**r, "children": "i.i.d." if r["verify"] == "token" else "without replacement"} for r in got[0]]
        pairs += got[1]
    order = lambda r: r["temperature"]  # noqa: E731  (stable: by temperature, then the trees' order)
    return sorted(rows, key=order), sorted(pairs, key=order)


def positive(text):
    """An integer >= 1 from the command line. Raises argparse.ArgumentTypeError otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes an integer >= 1, got {text!r}")
    return value


def gamma_list(text):
    """Comma-separated gammas >= 1: "2,4" -> (2, 4). Raises argparse.ArgumentTypeError otherwise."""
    return tuple(positive(t) for t in text.split(","))


def tree_list(text):
    """Semicolon-separated branchings: "4,1;2,2,2" -> ((4, 1), (2, 2, 2)). Raises argparse.ArgumentTypeError
    otherwise."""
    trees = tuple(gamma_list(t) for t in text.split(";"))
    for branching in trees:
        try:
            branching_tree(branching)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
    return trees


def options(ap):
    ap.add_argument("--tables", choices=TABLES, nargs="+", default=list(DEFAULT_TABLES),
                    help="what to measure: chain (block vs token), tree (RSD vs i.i.d. children), exact-match (it "
                         "against token and block on chains); default chain and tree")
    ap.add_argument("--prompts", type=positive, default=None, help="validation prompts (default 16; --quick: 2)")
    ap.add_argument("--seeds", type=positive, default=None, help="seeds per prompt (default 3; --quick: 1)")
    ap.add_argument("--new-tokens", type=positive, default=None, help="new tokens per run (default 64; --quick: 24)")
    ap.add_argument("--gammas", type=gamma_list, default=None, help="chain gammas (default 2..8; --quick: 2,4)")
    ap.add_argument("--trees", type=tree_list, default=None,
                    help="tree branchings, ';'-separated (default 4,1;2,2,2; --quick: 2,1)")


def main(argv=None):
    run = common.command_line("bench.verification", __doc__, argv, options, threads=("1", "1"), many=False)
    args = run.args
    n_prompts = args.prompts or (2 if args.quick else 16)
    seeds = args.seeds or (1 if args.quick else 3)
    new_tokens = args.new_tokens or (24 if args.quick else 64)
    gammas = args.gammas or ((2, 4) if args.quick else GAMMAS)
    trees = args.trees or (((2, 1),) if args.quick else TREES)
    n, greedy_prompts = run.threads[0], min(2, n_prompts)
    t0 = time.perf_counter()
    tables = []
    with common.blas_threads(n):
        target, draft = models.get("shipped:target", threads=n), models.get("shipped:draft", threads=n)
        prompts = models.validation_prompts(models.validation_ids(target.tokenizer), n_prompts)
        if "chain" in args.tables:
            tables += chain_tables(*chain_rows(target, draft, prompts, seeds, new_tokens, gammas, TEMPERATURES,
                                               greedy_prompts))
        if "tree" in args.tables:
            tables += tree_tables(*tree_rows(target, draft, prompts, seeds, new_tokens, trees, TEMPERATURES,
                                             greedy_prompts))
        if "exact-match" in args.tables:
            tables += exact_match_tables(*exact_match_rows(target, draft, prompts, seeds, new_tokens, gammas,
                                                           TEMPERATURES, greedy_prompts))
    run.meta["runs"] = (f"{n_prompts} validation prompts of {models.PROMPT_LENGTH} ids x {seeds} seeds, {new_tokens} "
                        f"new tokens each, per (temperature, gamma or tree, rule); greedy rows: {greedy_prompts} "
                        "prompts")
    run.meta["threads"] = str(n)
    run.meta["load_average_1min_at_end"] = f"{common.load_average():.2f}"
    run.meta["seconds"] = f"{time.perf_counter() - t0:.0f}"
    if {"chain", "tree"} & set(args.tables):
        run.meta["paper"] = PAPER
    return common.finish(run, tables)


NOTE = ("Each figure pools n independent (prompt, seed) runs; _ci95 is the half-width of its 95% interval (1.96 x the "
        "ratio estimator's standard error, bench/verification.py). mean_acceptance_length: vLLM's 1 + accepted / "
        "rounds with a proposal (for a tree: the kept path). verify_ms_per_round: the target's forwards (prefill "
        "included) plus the acceptance rule, per round. identical (temperature 0): the rule's ids equal plain greedy "
        "decoding's on every prompt. Acceptance figures do not depend on the machine's load; tok_s does.")
WHY = (f"{PAPER}. npspec's tok_s gain is the gain in tokens per round minus block verification's extra work: "
       "block_accept computes a residual mass Z_i over the whole vocabulary at every position of the block (gamma "
       "rows of n_vocab float64 operations) where the token rule reads gamma probabilities and one residual; on the "
       "shipped pair (a 4-layer, 256-wide target whose verify forward takes about a millisecond) that extra work "
       "(rule_us) and the per-round Python overhead are a sizeable share of a round, while on the paper's large "
       "models the forward dominates and the rule's cost vanishes. The gain in tokens per round is what carries over.")


def chain_tables(rows, pairs):
    return [common.Table("verification_chain", rows, "Block against token verification on the shipped pair (real "
                         "acceptance), chains", NOTE + " rule_us: the rule alone (npspec.decode.rules's chain "
                         "function on gamma rows of n_vocab ids)."),
            common.Table("verification_chain_paired", pairs, "Block minus token verification, paired runs, shipped "
                         "pair", NOTE + " _diff: block - token on the same runs and uniforms; tok_s_gain: block / "
                         "token - 1. " + WHY)]


def exact_match_tables(rows, pairs):
    note = ("Each figure pools n independent (prompt, seed) runs; _ci95 is the half-width of its 95% interval (1.96 "
            "x the ratio estimator's standard error, bench/verification.py). mean_acceptance_length: vLLM's 1 + "
            "accepted / rounds with a proposal. exact-match: npspec.decode.rules.exact_match_accept, a draft kept "
            "when it equals the target's own sample (llama.cpp's server path, vLLM Model Runner V2's strict). "
            "sum_pq, sum_min: the mean over the rule's tested positions of sum_x p q and sum_x min(p, q) (p target, "
            "q draft rows there); exact-match keeps a tested draft with chance sum p q, the token rule with sum "
            "min(p, q), so expected_mean_acceptance_length = 1 + (those chances summed over the tested positions) / "
            "rounds with a proposal has the measured figure's expectation, and expected_minus_measured (paired on "
            "the same runs) should cover 0; block keeps more than its per-position sums, so it has none. tests_seen: "
            "the rule's calls tested exactly the positions the runs counted. identical (temperature 0): the rule's "
            "ids equal plain greedy decoding's on every prompt. No timing: these figures do not depend on the "
            "machine's load.")
    return [common.Table("verification_exact_match", rows, "Exact-match against token and block verification on the "
                         "shipped pair (real acceptance), chains", note),
            common.Table("verification_exact_match_paired", pairs, "Exact-match minus token and minus block "
                         "verification, paired runs, shipped pair", note + " _diff: exact-match - the other rule on "
                         "the same runs and uniforms; expected_mean_acceptance_length_diff: the same difference of "
                         "the expectations (exact-match - token only).")]


def tree_tables(rows, pairs):
    note = (NOTE + " iid: TreeDrafter, each node's children drawn i.i.d. from the draft's row, verified by the token "
            "rule's tree form (npspec.decode.rules.trees.accept_tree, SpecInfer's recursive residual); rsd: DistinctTreeDrafter, "
            "children drawn without replacement, verified by recursive rejection sampling (npspec.decode.rules."
            "accept_tree_rsd, Jeon et al. 2024), as --verify rsd picks them.")
    return [common.Table("verification_tree", rows, "RSD against i.i.d. children in token trees on the shipped pair "
                         "(real acceptance)", note),
            common.Table("verification_tree_paired", pairs, "RSD minus i.i.d. children, paired runs, shipped pair",
                         note + " _diff: rsd - iid on the same runs and uniforms; tok_s_gain: rsd / iid - 1. RSD "
                         "spends no verify row on a repeated sibling and each rejection removes that token from the "
                         "next sibling's law; the exact per-node comparison is in tests/test_tree_rules.py.")]


if __name__ == "__main__":
    sys.exit(main())
