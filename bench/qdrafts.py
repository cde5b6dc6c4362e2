"""python -m bench.qdrafts: the seed's question end to end: how acceptance AND speedup change as the draft is quantized.

Rows: drafts of random:gpt2-large (--target): distilgpt2 at fp32, int8-ch, int4-g64, int4-g64+emb, and the target's
self-draft (`SCHEME:self`) at the same three schemes. Each row runs what `npspec generate --target random:gpt2-large
--draft DRAFT --temperature 0 --simulate-acceptance A --gamma G --compare --compare-repeats 5 --max-new-tokens 64`
runs, in this process (npspec.cli.generate.prepared, npspec.cli.harness.compare_repeated): every role's kernel chosen
by the probe, the speculative decoding in turn with every plain baseline, the speedup over the FASTEST plain decoding.
A (SIMULATED acceptance, npspec.decode.drafters.ControlledDraft) is the shipped-pair study's greedy beta of the same
scheme (bench/results/quantized-epyc/quantized_beta.csv): the target's own for a self-draft, and for distilgpt2
--a times the shipped 2-layer draft's beta relative to its fp32 beta. G: the fastest of --gammas, one decoding each.
Columns: bytes a draft forward reads (npspec.sources.quantize.weight_bytes) over the target's; c and v measured in
the compared runs (seconds per draft forward / per verify, over the plain decoding's seconds per token);
predicted tokens/round and speedup (npspec.decode.evaluate, claim 5) from beta, c, v; measured speedup (median of
the turns, with its range) and whether every decoding gave plain greedy's ids. --shipped adds the shipped pair's
self-drafts run for REAL (real acceptance, real text; shipped sizes are cache-bound: their c is not their bytes').
"""

import sys
from dataclasses import replace

from npspec.cli.generate import prepared
from npspec.cli.harness import comparison, compare_repeated
from npspec.cli.options import build_parser
from npspec.decode import decode
from npspec.decode.evaluate import expected_tokens_per_round, predicted_speedup
from npspec.model.tensors import tensor_shapes
from npspec.sources.names import SHAPES as CONFIGS
from npspec.sources.quantize import parse_scheme, weight_bytes

from . import common
from .qspeed import STUDY

SCHEMES = ("fp32", "int8-ch", "int4-g64", "int4-g64+emb")
BITS = {"fp32": 32, "int8-ch": 8, "int4-g64": 4, "int4-g64+emb": 4}


def options(ap):
    ap.add_argument("--target", default="gpt2-large", help="the random target's shape (default gpt2-large; "
                                                           "--quick: gpt2)")
    ap.add_argument("--draft", default="distilgpt2", help="the random draft's shape (default distilgpt2)")
    ap.add_argument("--a", type=float, default=0.7, help="distilgpt2's simulated fp32 acceptance (default 0.7)")
    ap.add_argument("--gammas", default="2,3,4,5,6", help="gammas tried, the fastest kept (default 2,3,4,5,6)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per decoding (default 64; --quick: 16)")
    ap.add_argument("--repeats", type=int, default=None, help="turns of --compare (default 5; --quick: 1)")
    ap.add_argument("--shipped", action="store_true", help="also the shipped pair's self-drafts, real acceptance")


def study_betas():
    """{(draft, scheme): greedy beta} of the study's RTN rows ("shipped target" / "shipped draft")."""
    rows, _ = common.read_table(STUDY / "quantized_beta.csv")
    return {(r["draft"], r["scheme"]): float(r["beta_greedy"]) for r in rows if r["method"] == "rtn"}


def draft_spec(scheme, shape):
    """The --draft SPEC of a row: `shape` ("self" or a random shape) quantized with `scheme` (fp32: as it is)."""
    name = "self" if shape == "self" else f"random:{shape}"
    return name if scheme == "fp32" else f"{scheme}:{name}"


def generate_args(target, draft, a, gamma, new_tokens, repeats, threads, prompt="The quick brown fox"):
    """The `npspec generate` arguments of one row, greedy: (Namespace, argv). target/draft None: the shipped one;
    a None: real acceptance, else --simulate-acceptance a."""
    argv = [*(["--target", target] if target else []), *(["--draft", draft] if draft else []),
            *(["--simulate-acceptance", f"{a:.4f}"] if a is not None else []), "--temperature", "0", "--gamma",
            str(gamma), "--max-new-tokens", str(new_tokens), "--compare", "--compare-repeats", str(repeats),
            "--threads", str(threads), "--quiet", "--json", prompt]
    return build_parser().parse_args(argv), argv


def matrix_bytes(config, scheme):
    """Bytes a one-token forward of `config` reads of its matrices under `scheme` (weight_bytes; fp32: twice every
    matrix at 16 bits)."""
    shapes = tensor_shapes(config)
    return 2 * weight_bytes(shapes, parse_scheme("fp16+emb")) if scheme == "fp32" else weight_bytes(shapes, parse_scheme(scheme))


def with_gamma(job, gamma):
    """`job` drafting `gamma` tokens a round."""
    return replace(job, options=replace(job.options, gamma=gamma))


def measured_row(args, gammas):  # -> dict
    """Run one row: prepare once, decode once per gamma, keep the fastest, then --compare's turns at it."""
    prep = prepared(args, sys.stderr, None)
    tried = {g: decode(with_gamma(prep.again(), g)).stats.tokens_per_s for g in gammas}
    best = max(tried, key=tried.get)
    first = decode(with_gamma(prep.again(), best))
    specs, plain, _ = compare_repeated(with_gamma(prep.job, best), first, lambda: with_gamma(prep.again(), best),
                                       args.seed, prep.threads, args.compare_repeats)
    c = comparison(specs, plain, greedy=True)
    t1 = 1 / c["plain_tokens_per_s"]  # seconds per token of the fastest plain decoding
    draft_s = sum(s.stats.seconds_draft for s in specs) / sum(max(s.stats.draft_forwards, 1) for s in specs)
    verify_s = sum(s.stats.seconds_verify for s in specs) / sum(s.stats.target_forwards for s in specs)
    stats = specs[0].stats
    return {"gamma": best, "c": draft_s / t1, "v": verify_s / t1, "alpha": stats.alpha,
            "tokens_per_round": stats.tokens_per_round, "speedup": c["speedup"], "speedup_min": min(c["speedups"]),
            "speedup_max": max(c["speedups"]), "plain_kernel": c["plain_kernel"],
            "draft_kernel": prep.kernels.get("draft_kernel"), "target_kernel": prep.kernels.get("target_kernel"),
            "same_output": c["same_ids"]}


def row(run, label, scheme, shape, beta, gammas, new_tokens, repeats):
    """One table row of random:--target drafted by `shape` ("self" or a random shape) under `scheme`, simulated at
    `beta`: bytes, the measured row, the prediction from beta, c and v at its gamma."""
    args, argv = generate_args(f"random:{run.args.target}", draft_spec(scheme, shape), beta, gammas[0], new_tokens,
                               repeats, run.threads[0])
    draft_bytes = matrix_bytes(CONFIGS[run.args.target if shape == "self" else shape], scheme)
    ratio = draft_bytes / matrix_bytes(CONFIGS[run.args.target], "fp32")
    r = measured_row(args, gammas)
    return {"draft": label, "scheme": scheme, "bits": BITS[scheme], "a": beta, "bytes_per_token": draft_bytes,
            "bytes_ratio": ratio, **r, "c_over_bytes": r["c"] / ratio,
            "predicted_tokens_per_round": expected_tokens_per_round(beta, r["gamma"]),
            "predicted_speedup": predicted_speedup(beta, r["gamma"], r["c"], r["v"]), "command": command(argv, r)}


def shipped_row(run, scheme, beta, gammas, new_tokens, repeats):
    """The shipped target drafted by itself under `scheme` (fp32: the shipped draft), REAL acceptance: the measured
    row beside the study's greedy beta of the scheme."""
    args, argv = generate_args(None, None if scheme == "fp32" else draft_spec(scheme, "self"), None, gammas[0],
                               new_tokens, repeats, run.threads[0], prompt="ROMEO:")
    r = measured_row(args, gammas)
    return {"draft": "shipped draft" if scheme == "fp32" else "self", "scheme": scheme, "study_beta": beta, **r,
            "command": command(argv, r)}


def command(argv, r):
    """The command line of a row, at the gamma it kept."""
    i = argv.index("--gamma") + 1
    return "npspec generate " + " ".join([*argv[:i], str(r["gamma"]), *argv[i + 1:]])


def main(argv=None):
    run = common.command_line("bench.qdrafts", __doc__, argv, options, threads=("2", "2"), many=False)
    args = run.args
    if args.quick and args.target == "gpt2-large":
        args.target = "gpt2"
    gammas = [int(g) for g in args.gammas.split(",")]
    new_tokens, repeats = args.new_tokens or (16 if args.quick else 64), args.repeats or (1 if args.quick else 5)
    betas = study_betas()
    rows = []
    schemes = SCHEMES[::3] if args.quick else SCHEMES
    with common.notes():
        for scheme in common.steps(schemes, "distilgpt2 drafts"):
            relative = betas[("shipped draft", scheme)] / betas[("shipped draft", "fp32")]
            rows.append(row(run, args.draft, scheme, args.draft, args.a * relative, gammas, new_tokens, repeats))
        for scheme in common.steps([s for s in schemes if s != "fp32"], "self-drafts"):
            rows.append(row(run, "self", scheme, "self", betas[("shipped target", scheme)], gammas, new_tokens,
                            repeats))
    tables = [common.Table("qdrafts", rows, f"Quantized drafts of random:{args.target}: bytes, c, predicted and "
                           "measured speedup (SIMULATED acceptance a, greedy)")]
    if args.shipped:
        with common.notes():
            shipped = [shipped_row(run, s, betas[("shipped target", s) if s != "fp32" else ("shipped draft", s)],
                                   gammas, new_tokens, repeats) for s in common.steps(schemes, "the shipped pair")]
        tables.append(common.Table("qdrafts_shipped", shipped, "The shipped target's self-drafts, REAL acceptance "
                                   "(greedy, prompt ROMEO:; cache-bound sizes: c is not the bytes ratio)"))
    plot(rows, run.out / "qdrafts.png")
    return common.finish(run, tables, [run.out / "qdrafts.png"])


def plot(rows, path):
    """Measured (median, range) and predicted speedup against the draft's bits, one line per draft."""
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, marker in (("self", "o"), *((r["draft"], "s") for r in rows[:1])):
        mine = [r for r in rows if r["draft"] == label]
        bits = [r["bits"] - (0.3 if r["scheme"].endswith("+emb") else 0) for r in mine]
        ax.errorbar(bits, [r["speedup"] for r in mine], yerr=[[r["speedup"] - r["speedup_min"] for r in mine],
                    [r["speedup_max"] - r["speedup"] for r in mine]], marker=marker, ls="-", label=f"{label}: measured")
        ax.plot(bits, [r["predicted_speedup"] for r in mine], marker=marker, ls=":", label=f"{label}: predicted")
    ax.axhline(1, color="gray", lw=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("draft bits per weight (+emb drawn 0.3 left)")
    ax.set_ylabel("speedup over the fastest plain decoding")
    ax.legend(fontsize=8)
    common.save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
