"""python -m bench.report: write README.md's Performance section and bench/results/README.md's tables from one run.

Both files hold a part between `<!-- bench:start -->` and `<!-- bench:end -->`, generated from one whole run's
folder of tables (bench/run_all.sh's OUT, such as bench/results/run_all-xeon-spr/): README.md gets the one command
and the speedup table (`headline`), bench/results/README.md every table of the run (`section`), each with the
machine. README's part names the folder (`--results FOLDER`, repository-relative), and a later run without
--results reads that folder again (`source`). `--check` only compares (exit status 1 if either part is stale).

Results written before npspec named its kernels (npspec.kernels.registry) say "strategy" where bench now says
"kernel", and use the old names; `current` reads both (OLD_NAMES), so a run kept in git history reports as
measured."""

import argparse
import json
import re
import sys
from pathlib import Path

from npspec.decode.evaluate import predicted_speedup

from . import common

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS_README = common.RESULTS / "README.md"  # every table of the run README quotes
SOURCE = re.compile(r"`python -m bench\.report --results ([^`\s]+)`")  # how the section names its folder
# verify_cost's old column and values -> today's: matmul strategies became kernels, layouts got plain names
OLD_COLUMNS = {"strategy": "kernel"}
OLD_NAMES = {"rows": "gemv-rows", "panels": "gemv-panels", "panels-gemm": "gemm-panels",  # "gemm" kept its name
             "C": "row-major", "panel": "column-major"}


def current(row):
    """A verify_cost row with today's column and names, whether it was written with the old or the new ones."""
    row = {OLD_COLUMNS.get(k, k): v for k, v in row.items()}
    return {k: OLD_NAMES.get(v, v) if k in ("kernel", "layout") else v for k, v in row.items()}


def verify_curves(model, threads, results):
    """One model's verify-cost curves from verify_cost.csv: ({(layout, kernel): [v(M) for M = 1, 2, ...]}, header).

    v(M) = t(M new tokens) / t(1) of the same kernel and layout, under today's names (`current`); the
    key "roofline" holds roofline_v, the bound from the run's own read bandwidth and GEMM peak (`curves_of`).
    """
    rows, meta = common.read_table(Path(results) / "verify_cost.csv")
    return curves_of([r for r in rows if r["model"] == model and int(r["threads"]) == threads]), meta


def curves_of(rows):
    """{(layout, kernel): [v(M), M = 1, 2, ...], "roofline": [roofline_v]} of one model and thread count's verify_cost
    rows (read from verify_cost.csv, or bench.verify_cost.measure's own), under today's names."""
    curves = {}
    for r in sorted(map(current, rows), key=lambda r: int(r["M"])):
        curves.setdefault((r["layout"], r["kernel"]), []).append(float(r["v"]))
        curves.setdefault("roofline", {})[int(r["M"])] = float(r["roofline_v"])
    if "roofline" in curves:
        curves["roofline"] = list(curves["roofline"].values())
    return curves


def speedup_model_check(results):
    """Each row of speedup.csv beside what claim 5's model predicts from the row's own measurements, like with like.

    The model's c and v are times over the TARGET's one-token forward, so it predicts the speedup over the target's
    own plain decoding: `measured` is that one (speedup.csv's `speedup_vs_target_ar`; files without that column
    measured nothing else and give `speedup`). Returns dicts with the row's target, draft, acceptance ("real" or
    "controlled"), a, gamma, alpha, tokens_per_round, c, v (= t(gamma + 1) / t(1)), `measured` and two
    predictions of it: `model` = npspec.decode.evaluate.predicted_speedup(alpha, gamma, c, v), i.i.d. acceptance at the
    measured alpha, and `cost_only` = tokens_per_round / (gamma c + v), the measured tokens per round over the cost
    of a round in one-token target forwards (only the cost model is tested). Where the row names the fastest plain
    decoding, `measured_vs_fastest` (speedup.csv's `speedup`) and `model_vs_fastest` = model * ar_tok_s /
    fastest_ar_tok_s (the same prediction over the faster denominator) are there too, else None.
    """
    rows, _ = common.read_table(Path(results) / "speedup.csv")
    out = []
    for r in rows:
        gamma, alpha, c, v = int(r["gamma"]), float(r["alpha"]), float(r["c"]), float(r["v"])
        model = predicted_speedup(alpha, gamma, c, v)
        fastest = r.get("fastest_ar_tok_s") and r.get("ar_tok_s")
        out.append({"target": r["target"], "draft": r["draft"], "acceptance": r["acceptance"], "a": r["a"],
                    "gamma": gamma, "alpha": alpha, "tokens_per_round": float(r["tokens_per_round"]), "c": c, "v": v,
                    "measured": float(r.get("speedup_vs_target_ar") or r["speedup"]), "model": model,
                    "cost_only": float(r["tokens_per_round"]) / (gamma * c + v),
                    "measured_vs_fastest": float(r["speedup"]) if fastest else None,
                    "model_vs_fastest": model * float(r["ar_tok_s"]) / float(r["fastest_ar_tok_s"]) if fastest else None})
    return out


def f(x, digits=2):
    try:
        return f"{float(x):.{digits}f}"
    except (TypeError, ValueError):
        return str(x)


def short(name):
    """"random:gpt2" -> "gpt2", "shipped:target" -> "shipped target"."""
    kind, _, rest = name.partition(":")
    return f"shipped {rest}" if kind == "shipped" else rest or name


NOT_QUOTED = ("quantized_",)  # results this section does not quote (no timings): their dates and loads stay out of it
STATED_APART = ("verification_",)  # results whose lines state their own machine, date and load (verification_lines)


AR_COLUMNS = [("compiled_panels_tok_s", "compiled-panels"), ("gemm_blocks_tok_s", "gemm-blocks"), ("gemv_panels_tok_s", "gemv-panels"),
              ("gemv_rows_tok_s", "gemv-rows"), ("gemm_tok_s", "gemm"), ("minimal_tok_s", "minimal NumPy")]


def ar_lines(rows):
    """The AR table: plain greedy decoding of each random-weight shape with every kernel, the minimal decoder, the
    roofline and transformers (bench.speedup's speedup_ar.csv)."""
    cols = [(k, name) for k, name in AR_COLUMNS if rows and k in rows[0]]
    return ["", "Plain (AR) greedy decoding, tokens/s, with each kernel (`compiled-panels`, the numba kernel of the fast "
            "extra, and the panel kernels on npspec's own threads; `gemv-rows` and `gemm` threaded by BLAS) and with "
            "`bench/minimal.py`, "
            "a 60-line NumPy decoder; the roofline is the best read rate measured in the run divided by the weight "
            "bytes read per token:", "",
            "| model (random weights) | threads | " + " | ".join(name for _, name in cols)
            + " | fastest / roofline | transformers (torch CPU) |",
            "|---|---|" + "---|" * len(cols) + "---|---|"] + [
        f"| {short(r['model'])} | {r['threads']} | " + " | ".join(f(r[k], 1) for k, _ in cols)
        + f" | {f(r['of_roofline'])} | {f(r['transformers_tok_s'], 1)} |" for r in rows]


VERIFY_KERNELS = [("column-major", "compiled-panels"), ("column-major", "gemm-blocks"), ("column-major", "gemv-panels"),
                  ("column-major", "gemv-rows"),
                  ("row-major", "gemv-rows"), ("column-major", "gemm"), ("row-major", "gemm")]


def verify_lines(rows):
    """The verify-cost table: t(1) and v(5) of each kernel (and layout) the results hold, per thread count."""
    lines = []
    for n in sorted({int(r["threads"]) for r in rows}):
        mine = [r for r in rows if int(r["threads"]) == n]
        cols = [k for k in VERIFY_KERNELS if any((r["layout"], r["kernel"]) == k for r in mine)]
        label = [kernel + (" (row-major)" if layout == "row-major" else "") for layout, kernel in cols]
        lines += ["", f"Verify cost v(5) = t(5 tokens) / t(1 token) of one cached forward, {n} thread"
                  f"{'s' * (n > 1)}, on column-major matrices unless said (`compiled-panels`, `gemm-blocks`, "
                  "`gemv-panels` and `gemv-rows` are batch invariant; `gemm` is not):", "",
                  "| model | " + " | ".join(f"t(1) {k}, ms" for k in label) + " | "
                  + " | ".join(f"v(5) {k}" for k in label) + " | v(5) roofline |",
                  "|---|" + "---|" * (2 * len(cols) + 1)]
        for name in dict.fromkeys(r["model"] for r in mine):
            by = {(r["layout"], r["kernel"]): r for r in mine if r["model"] == name}
            if not any(k in by for k in cols):
                continue
            roof = next(by[k]["roofline_v5"] for k in cols if k in by)
            lines.append(f"| {short(name)} | " + " | ".join(f(by[k]["t1_ms"]) if k in by else "" for k in cols)
                         + " | " + " | ".join(f(by[k]["v5"]) if k in by else "" for k in cols) + f" | {f(roof)} |")
    return lines


def speedup_lines(rows):
    """The speedup table: for each pair and acceptance, the best gamma, against the FASTEST plain decoding."""
    best = {}
    for r in rows:
        key = (r["target"], r["draft"], r["acceptance"], r["a"])
        if key not in best or float(r["speedup"]) > float(best[key]["speedup"]):
            best[key] = r
    gammas = ", ".join(sorted({r["gamma"] for r in rows}, key=int))
    return ["", "Speculative decoding against the FASTEST plain decoding of the same target (`fastest AR`, measured in "
            f"the same run), greedy, the best gamma of those timed ({gammas}). Random-weight pairs use CONTROLLED "
            "acceptance a (each "
            "draft token is the target's greedy token with probability a; the real draft forward runs):", "",
            "| target / draft | acceptance | gamma | alpha | fastest AR, tok/s | speculative tok/s | speedup | "
            "vs the target's own AR | predicted | same output |", "|---|---|---|---|---|---|---|---|---|---|"] + [
        f"| {short(r['target'])} / {short(r['draft'])} | {r['acceptance'] + (' ' + r['a'] if r['a'] else '')} | "
        f"{r['gamma']} | {f(r['alpha'])} | {f(r.get('fastest_ar_tok_s', r['ar_tok_s']), 1)} "
        f"({r.get('fastest_ar', 'target')}) | {f(r['spec_tok_s'], 1)} | {f(r['speedup'])}x | "
        f"{f(r.get('speedup_vs_target_ar', r['speedup']))}x | {f(r['predicted_speedup'])}x | {r['identical']} |"
        for r in best.values()]


def compare_lines(path):
    """The section's lead: the one command that times speculative against plain decoding, with what it printed in the committed run."""
    run = json.loads(Path(path).read_text())
    c = run["result"]["compare"]
    by_kernel = c.get("plain_by_kernel_tokens_per_s", {})  # older runs did not record it
    each = f"; the plain speed of each kernel: {', '.join(f'{k} {f(v)}' for k, v in by_kernel.items())}" if by_kernel else ""
    return [f"One command times speculative against plain decoding on this machine, with full-size GPT-2 "
            f"shapes (random weights, so the acceptance is SIMULATED at a = {run['a']}):", "", "```",
            run["command"], "```", "",
            f"In the committed run it decoded {run['result']['stats']['new_tokens']} tokens at "
            f"{f(c['speculative_tokens_per_s'])} tokens/s against {f(c['plain_tokens_per_s'])} for the fastest plain "
            f"decoding ({c['plain_kernel']}): **{f(c['speedup'])}x**, with "
            f"{'the same' if c['same_ids'] else 'DIFFERENT'} output (`{shown(Path(path))}`{each}). The shipped "
            "pair's weights (a few MB) sit in the CPU's cache, so whether it gains depends on the CPU, its load and the "
            "options (its rows below are this run's; README's introduction quotes another machine).", ""]


def found(results, name):
    """results/NAME if the run wrote that table, else None."""
    path = Path(results) / name
    return path if path.is_file() else None


def shown(path, root=ROOT):
    """How a results file or folder is named in the text: its path from the repository's root (`root`), such as
    `bench/results/run_all-xeon-spr/speedup.md`; a path outside the repository (a test's temporary folder) as
    `bench/results/NAME`."""
    path = Path(path).resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else f"bench/results/{path.name}"


def source(text, root=ROOT):
    """The results folder README's section `text` says it was generated from (`SOURCE`, relative to `root`), or None
    if it names none."""
    found_ = SOURCE.search(text)
    return root / found_.group(1) if found_ else None


def measured_by(results, full):
    """The sentence naming the commands and the one folder the figures come from (`source` reads it back)."""
    commands = ("`python -m bench.compare`, `bench.speedup`, `bench.verify_cost`, `bench.drafters`, `bench.trees`, "
                "`bench.verification`, `bench.memory` and `bench.load`" if full else
                "`python -m bench.compare` and `python -m bench.speedup`")
    rest = ("" if full else " The run's other tables (plain decoding by kernel, verify cost, drafters, trees, the "
            "verification rules, loading) and where each target is met or missed: `bench/results/README.md`.")
    return [f"Measured by {commands}; `python -m bench.report --results {shown(results)}` copied the figures from "
            f"that one run's tables.{rest}"]


def hardware_lines(results, full):
    """The machine, BLAS, numpy and Python of the run, and when it ran (every table's header but those apart)."""
    results = Path(results)
    metas = [common.read_table(p)[1] for p in sorted(results.glob("*.csv"))
             if not p.name.startswith(NOT_QUOTED + STATED_APART)]
    if not metas:
        return ["", "No results are committed yet: run the commands above."]
    meta = next((common.read_table(p)[1] for p in (found(results, "speedup.csv"), found(results, "speedup_ar.csv"))
                 if p is not None), metas[-1])
    dates = sorted(m.get("date", "") for m in metas)
    loads = sorted(float(m.get("load_average_1min_at_start", "nan")) for m in metas)
    return ["", f"Hardware: {meta.get('machine')}; {meta.get('blas')} {meta.get('blas_version')} "
            f"({meta.get('blas_arch')}), numpy {meta.get('numpy')}, Python {meta.get('python')}. "
            f"Measured {dates[0]} to {dates[-1]} (1-minute load average {loads[0]:.1f} to {loads[-1]:.1f} at the "
            "starts, the previous command's own load included) on a shared virtual machine, so single timings "
            "are noisy" + ("." if full else "; `bench/results/README.md` reads them.")]


def headline(results):
    """README's Performance section (without the markers): the one command, the speedup table and the machine."""
    lines = measured_by(results, full=False)
    if (compare := found(results, "compare.json")) is not None:
        lines = compare_lines(compare) + lines
    if (speedups := found(results, "speedup.csv")) is not None:
        lines += speedup_lines(common.read_table(speedups)[0])
    return "\n".join(lines + hardware_lines(results, full=False))


def section(results):
    """bench/results/README.md's generated part (without the markers): every table of one run's folder."""
    results = Path(results)
    lines = measured_by(results, full=True)
    if (compare := found(results, "compare.json")) is not None:
        lines = compare_lines(compare) + lines
    if (ar := found(results, "speedup_ar.csv")) is not None:
        lines += ar_lines(common.read_table(ar)[0])
    if (verify := found(results, "verify_cost_summary.csv")) is not None:
        lines += verify_lines([current(r) for r in common.read_table(verify)[0]])
    if (speedups := found(results, "speedup.csv")) is not None:
        lines += speedup_lines(common.read_table(speedups)[0])
    if found(results, "drafters_controlled.csv") is not None:
        lines += drafters_lines(results)
    if found(results, "trees_controlled.csv") is not None:
        lines += trees_lines(results)
    if found(results, "verification_chain_paired.csv") is not None:
        lines += verification_lines(results)
    if (memory := found(results, "memory.csv")) is not None:
        for r in common.read_table(memory)[0]:
            lines += ["", f"Loading a converted {short(r['model'])} ({f(r['file_MB'], 0)} MB) took "
                      f"{f(r['load_seconds'])} s, reading the file included; peak RSS while loading and generating was "
                      f"{f(r['peak_rss_generate_MB'], 0)} MB, {f(r['peak_over_weights'])} x the weight bytes."]
    if found(results, "load.csv") is not None:
        lines += load_lines(results)
    return "\n".join(lines + hardware_lines(results, full=True))


def load_lines(results):
    """The README's sentence on bench.load's results: format 2 warm and cold, peak RSS, format 1 for comparison."""
    rows, meta = common.read_table(results / "load.csv")

    def seconds(fmt, cache):
        return common.median([float(r["load_seconds"]) for r in rows
                              if r["format"] == fmt and r["page_cache"] == cache and "rewrite" not in r["case"]])

    peak = max(float(r["peak_over_weights"]) for r in rows if r["format"] == "2")
    return ["", f"Loading a converted {short(meta['model'])} ({int(meta['file_bytes']) / 1e6:.0f} MB, format 2: read "
            f"into place, no relayout) took {f(seconds('2', 'warm'))} s warm and {f(seconds('2', 'cold'))} s cold (the "
            f"file dropped from the page cache first), with peak RSS {f(peak, 3)} x the weight bytes; a format-1 file "
            f"(relaid out after the read) took {f(seconds('1', 'warm'))} s warm and {f(seconds('1', 'cold'))} s cold "
            f"(`{shown(results / 'load.md')}`, with the targets)."]


def drafter_targets(controlled, cost):
    """The drafters' benchmark targets, each as (statement, met: bool, the measured figure as text).

    controlled, cost: rows of drafters_controlled.csv and ngram_cost.csv.
    """
    out = []
    ngram = [r for r in controlled if r["strategy"] == "ngram" and r["schedule"] == "constant" and float(r["a"]) == 0.7]
    if ngram:
        best = max(ngram, key=lambda r: float(r["speedup"]))
        out.append((f"n-gram lookup on {short(best['target'])} at a = 0.7: >= 1.5x the fastest plain decoding",
                    float(best["speedup"]) >= 1.5, f"best {f(best['speedup'])}x at gamma {best['gamma']}"))
    worst = None
    for key in dict.fromkeys((r["strategy"], r["a"]) for r in controlled):
        rows = [r for r in controlled if (r["strategy"], r["a"]) == key]
        best = max((float(r["tok_s"]) for r in rows if r["schedule"] == "constant"), default=None)
        for r in rows:
            if r["schedule"] == "heuristic" and best:
                ratio = float(r["tok_s"]) / best
                if worst is None or ratio < worst[0]:
                    worst = (ratio, key)
    if worst:
        out.append(("the heuristic schedule within 5% of the best constant gamma on every controlled row",
                    worst[0] >= 0.95, f"worst {f(worst[0])} of the best constant ({worst[1][0]}, a = {worst[1][1]})"))
    shares = [r for r in cost if r.get("lookup_share") not in (None, "", "nan")]
    if shares:
        r = shares[0]
        out.append((f"the n-gram lookup under 2% of a round on the shipped target at n_ctx {r['n_ctx']}",
                    float(r["lookup_share"]) < 0.02, f"{100 * float(r['lookup_share']):.2f}%"))
    return out


def drafters_lines(results):
    """The Performance section's part on drafting strategies (bench.drafters), from its three tables."""
    controlled, _ = common.read_table(results / "drafters_controlled.csv")
    shipped = common.read_table(results / "drafters_shipped.csv")[0] if (results / "drafters_shipped.csv").is_file() else []
    cost = common.read_table(results / "ngram_cost.csv")[0] if (results / "ngram_cost.csv").is_file() else []
    lines = ["", "Drafting strategies (`python -m bench.drafters`; `speedup` is against the FASTEST plain decoding "
             "over npspec's kernels for the same prompts and options, measured in the same run). The shipped pair, "
             "real acceptance, gamma 4:", "",
             "| temperature | prompts | drafter | schedule | alpha | mean acceptance length | tokens/round | "
             "no proposal | tok/s | speedup | same output |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in shipped:
        name = r["strategy"] + (f", p_min {r['p_min']}" if r.get("p_min") else "")
        lines.append(f"| {r['temperature']} | {r['prompts']} | {name} | {r['schedule']} | {f(r['alpha'])} | "
                     f"{f(r['mean_acceptance_length'])} | {f(r['tokens_per_round'])} | {f(r['no_proposal_share'])} | "
                     f"{f(r['tok_s'], 1)} | {f(r['speedup'])}x | {r['identical'] or '-'} |")
    if controlled:
        lines += ["", f"{short(controlled[0]['target'])} with CONTROLLED acceptance a (greedy), speedup over the "
                  "fastest plain decoding; `ngram` runs the real lookup and proposes gamma steered tokens (no draft "
                  "forward), `model` drafts with random distilgpt2; `h` is the heuristic schedule from gamma 4:", ""]
        gammas = sorted({int(r["gamma"]) for r in controlled if r["schedule"] == "constant"})
        lines += ["| drafter | a | " + " | ".join(f"gamma {g}" for g in gammas) + " | h |",
                  "|---|---|" + "---|" * (len(gammas) + 1)]
        for key in dict.fromkeys((r["strategy"], r["a"]) for r in controlled):
            rows = [r for r in controlled if (r["strategy"], r["a"]) == key]
            by = {int(r["gamma"]): r for r in rows if r["schedule"] == "constant"}
            h = [r for r in rows if r["schedule"] == "heuristic"]
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{f(by[g]['speedup'])}x" if g in by else ""
                                                                 for g in gammas)
                         + f" | {f(h[0]['speedup']) + 'x' if h else ''} |")
    if cost:
        lines += ["", "The n-gram lookup per round (an index updated as ids arrive): "
                  + "; ".join(f"{f(r['lookup_us_per_round'], 1)} us at {r['n_ctx']} ids (a plain scan: "
                              f"{f(r['scan_us_per_round'], 1)} us)" for r in cost) + "."]
    targets = drafter_targets(controlled, cost)
    if targets:
        lines += ["", "Targets: " + "; ".join(f"{s}: {'met' if ok else 'MISSED'} ({m})" for s, ok, m in targets)
                  + "."]
    return lines


def trees_lines(results):
    """The Performance section's part on token trees (bench.trees): each tree against the chains, with v."""
    lines = ["", "Token trees against chains (`python -m bench.trees`; speedup over the fastest plain decoding, v = "
             "the verify forward's cost over a one-token forward, measured in the same run):", "",
             "| target | acceptance | temperature | drafter | shape | nodes | v | mean acceptance length | "
             "tokens/round | speedup | same output |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in ("trees_shipped.csv", "trees_controlled.csv"):
        if not (results / name).is_file():
            continue
        for r in common.read_table(results / name)[0]:
            target = short(r["target"]) if r.get("target") else "shipped"
            acceptance = f"a = {r['a']}" if r.get("a") else "real"
            shape = r["tree"] or f"chain of {r['gamma']}"
            lines.append(f"| {target} | {acceptance} | {r.get('temperature', '0.0') or '0.0'} | {r['strategy']} | "
                         f"{shape} | {r['nodes']} | {f(r['v'])} | {f(r['mean_acceptance_length'])} | "
                         f"{f(r['tokens_per_round'])} | {f(r['speedup'])}x | {r['identical'] or '-'} |")
    return lines


def interval(value, half, digits=2):
    """"value (low to high)": a figure with its 95% interval."""
    value, half = float(value), float(half)
    return f"{value:+.{digits}f} ({value - half:+.{digits}f} to {value + half:+.{digits}f})"


def measured_on(meta):
    """Where and when a table was measured, from its header: machine, date, load average at start and end."""
    return (f"{meta.get('machine')}, {meta.get('threads', '1')} thread, {meta.get('date')}, 1-minute load average "
            f"{meta.get('load_average_1min_at_start')} at the start and {meta.get('load_average_1min_at_end')} at the "
            "end")


def verification_lines(results):
    """The Performance section's part on the verification rules (bench.verification): block against token on chains,
    RSD against i.i.d. children on trees, each paired difference with its 95% interval."""
    results = Path(results)
    rows, meta = common.read_table(results / "verification_chain.csv")
    pairs, _ = common.read_table(results / "verification_chain_paired.csv")
    by = {(r["temperature"], r["gamma"], r["verify"]): r for r in rows}
    rule_us = {r["verify"]: r["rule_us"] for r in rows if r["temperature"] == "1.0" and r["gamma"] == "4"}
    identical = all(r["identical"] == "True" for r in rows if float(r["temperature"]) == 0)
    lines = ["", f"Block against token verification (`python -m bench.verification`, "
             f"`{shown(results / 'verification_chain_paired.md')}`): the shipped pair with its real acceptance, top-p "
             f"1.0, {meta.get('runs')}; {measured_on(meta)}. Mean acceptance length (vLLM's) and the paired "
             "differences block - token with 95% intervals (the same runs and uniforms); at temperature 0 both are "
             f"plain greedy decoding ({'the same ids on every prompt and gamma' if identical else 'NOT the same ids'}):",
             "", "| temperature | gamma | token | block | block - token | tokens/round, block - token | "
             "tok/s, block / token - 1 |", "|---|---|---|---|---|---|---|"]
    for p in pairs:
        t, b = (by[(p["temperature"], p["gamma"], v)] for v in ("token", "block"))
        lines.append(f"| {p['temperature']} | {p['gamma']} | {f(t['mean_acceptance_length'])} | "
                     f"{f(b['mean_acceptance_length'])} | "
                     f"{interval(p['mean_acceptance_length_diff'], p['mean_acceptance_length_diff_ci95'])} | "
                     f"{interval(p['tokens_per_round_diff'], p['tokens_per_round_diff_ci95'])} | "
                     f"{interval(100 * float(p['tok_s_gain']), 100 * float(p['tok_s_gain_ci95']), 1)}% |")
    lines += ["", "Sun et al. (2025) report 5-8% wall-clock gains of block over token verification on large models. "
              "Here the tokens/s gain is the tokens-per-round gain less block verification's extra work per round: "
              f"the rule alone takes {f(rule_us.get('block', 'nan'), 0)} us against the token rule's "
              f"{f(rule_us.get('token', 'nan'), 0)} us at gamma 4 (a residual mass over the whole vocabulary at every "
              "position of the block), on a target whose verify forward takes about a millisecond and a round "
              "with a Python overhead of its own, where a large model's forward would dominate. The acceptance "
              "figures do not depend on the machine's load; tokens/s does, and the machine was shared."]
    if (results / "verification_tree_paired.csv").is_file():
        rows, meta = common.read_table(results / "verification_tree.csv")
        pairs, _ = common.read_table(results / "verification_tree_paired.csv")
        by = {(r["temperature"], r["tree"], r["verify"]): r for r in rows}
        lines += ["", f"RSD (`--verify rsd`: children drawn without replacement) against today's i.i.d. children "
                  f"in token trees (`{shown(results / 'verification_tree_paired.md')}`): {meta.get('runs')}; "
                  f"{measured_on(meta)}:", "",
                  "| temperature | tree | nodes | i.i.d. | RSD | RSD - i.i.d. | tok/s, RSD / i.i.d. - 1 |",
                  "|---|---|---|---|---|---|---|"]
        for p in pairs:
            i, r = (by[(p["temperature"], p["tree"], v)] for v in ("token", "rsd"))
            lines.append(f"| {p['temperature']} | {p['tree']} | {p['nodes']} | {f(i['mean_acceptance_length'])} | "
                         f"{f(r['mean_acceptance_length'])} | "
                         f"{interval(p['mean_acceptance_length_diff'], p['mean_acceptance_length_diff_ci95'])} | "
                         f"{interval(100 * float(p['tok_s_gain']), 100 * float(p['tok_s_gain_ci95']), 1)}% |")
    return lines


def rewrite(text, body):
    """`text` with the part between the markers replaced by `body`. Raises ValueError without both markers."""
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise ValueError(f"README.md has no {START} ... {END} section; add the two markers where the table goes")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{body}\n{END}{tail}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n")[0])
    ap.add_argument("--readme", default=str(README), help="the README to rewrite (default: the repository's)")
    ap.add_argument("--results-readme", default=str(RESULTS_README),
                    help="the results' README to rewrite with every table (default: bench/results/README.md)")
    ap.add_argument("--results", default=None,
                    help="one run's results folder (default: the folder the README's section names)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated section is stale; write nothing")
    args = ap.parse_args(argv)
    readme, full = Path(args.readme), Path(args.results_readme)
    results = Path(args.results) if args.results is not None else source(readme.read_text(encoding="utf-8"))
    if results is None:
        ap.error(f"{readme} names no results folder: give --results FOLDER")
    if not results.is_dir():
        ap.error(f"--results {results}: no such folder; give the folder a bench run wrote its tables into")
    stale = []
    for path, body in ((readme, headline(results)), (full, section(results))):
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, body)
        if new != text:
            stale.append(path)
            if not args.check:
                common.atomic_write(path, lambda tmp, new=new: Path(tmp).write_text(new, encoding="utf-8"))
        if not args.check:
            print(f"wrote {path}")
    if args.check and stale:
        for path in stale:
            print(f"{path}: its generated section is stale; run python -m bench.report", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
