"""python -m bench.profile: where a forward's and the plain loop's time goes, as evidence for bench/results/README.md.

For one model (default random:gpt2-large; --quick: random:distilgpt2) and each kernel of `--kernels` (default
gemm-blocks, gemv-rows and compiled-panels when installed), with the run's thread count:
  * products against forward: the best-of-`--calls` seconds of a forward of ROWS tokens (Model.forward, as a target
    decodes and verifies) against the same forward's products replayed alone (the very (x, w, b) it multiplied,
    recorded once, through the same kernel and BLAS threads): the difference is what the forward does around its
    products; v(M) over the one-token forward, split into the products' part and the rest's;
  * the plain loop against its forwards: one plain greedy decoding (npspec.decode, gamma 0) of `--tokens`
    tokens with the model's prefill and forwards timed where they are called: per token, the loop's seconds, the
    prefill's share, the forwards', and the rest (sampling, bookkeeping), next to a one-token forward timed alone;
  * a cProfile listing (own time) of the one-token forwards of the first kernel; the BLAS calls have no Python
    frame of their own: their time is the own time of the function that calls np.matmul (the kernel);
  * a decoding's start, for each kernel with its own threads: the prompt's prefill (PROMPTS ids, all but the last)
    and START_TOKENS one-token forwards, with the prefill by the GEMM (Model.prefill_rows 0) and by the kernel
    (prefill_rows covering the prompt), in turn with a pause, the median of `--calls`; beside it the prefill_rows
    the kernel probe measures here (npspec.kernels.probe.choose_prefill, nothing cached).
Writes profile.md (the listings) and profile.csv/.md's tables (profile_forward, profile_loop, profile_start).
"""

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np

from npspec.kernels.probe import choose_prefill, time_prefill
from npspec.decode import speculative_generate
from npspec.kernels.registry import REGISTRY

from . import common, models
from .verify_cost import PAUSE

KERNELS = tuple(k for k in ("gemm-blocks", "gemv-rows", "compiled-panels") if REGISTRY[k].available())
PROMPTS = (4, 16, 48)  # prompt lengths (ids) whose decoding start start_by_route times
ROWS = (1, 4, 8)  # the forwards' rows products_against_forward times: a one-token forward, then verifies (v(M))
START_TOKENS = 8  # one-token forwards after the prefill in each timed start: where spinning BLAS threads cost


def best_seconds(f, calls):
    """The best of `calls` timed runs of f() after one untimed one."""
    return min(common.time_call(f, calls, warmup=1))


def products_against_forward(model, calls, context=32, m=1):
    """{rows, forward_ms, products_ms, around_ms}: an m-token forward, and its own products replayed alone (module
    doc)."""
    cache = model.new_cache()
    model.prefill(np.arange(context), cache, threads=1)  # on one BLAS thread: none left spinning into the timings
    ids, recorded, linear = np.arange(1, m + 1), [], model.linear

    def spy(x, w, b=None):
        recorded.append((x.copy(), w, b))
        return linear(x, w, b)
    model.linear = spy
    model.forward(ids, cache)
    cache.rollback(context)
    model.linear = linear

    def forward():
        model.forward(ids, cache)
        cache.rollback(context)

    def products():
        with model.blas.limit(model.blas_threads):
            for x, w, b in recorded:
                linear(x, w, b)
    t_forward, t_products = [], []
    for _ in range(calls):  # interleaved, so that a change of load hits both
        t_forward.append(best_seconds(forward, 1))
        t_products.append(best_seconds(products, 1))
    f, p = min(t_forward), min(t_products)
    return {"rows": m, "forward_ms": 1e3 * f, "products_ms": 1e3 * p, "around_ms": 1e3 * (f - p),
            "products": len(recorded)}


def against_one_token(rows):  # [products_against_forward rows of one kernel, the 1-row first] -> the same with v's
    """Each row with v = forward_ms / the 1-row forward_ms, and v's two parts over that same one-token forward:
    v_products (its products replayed) and v_around (the rest: attention row by row, layer norms, GELU, the cache)."""
    one = rows[0]["forward_ms"]
    return [{**r, "v": r["forward_ms"] / one, "v_products": r["products_ms"] / one, "v_around": r["around_ms"] / one}
            for r in rows]


def loop_against_forwards(model, prompt, tokens, calls):
    """Per token of one plain greedy decoding: loop, prefill, forwards and the rest (ms), the loop's forwards' median
    and fastest (a slow tail against a slower forward), and a forward timed alone (best of `calls`)."""
    spent, each = {"prefill": 0.0, "forward": 0.0}, []
    forward, prefill = model.forward, model.prefill

    def timed(kind, f):
        def run(*args):
            start = time.perf_counter()
            try:
                return f(*args)
            finally:
                spent[kind] += time.perf_counter() - start
                if kind == "forward":
                    each.append(time.perf_counter() - start)
        return run
    speculative_generate(model, None, prompt, 2, gamma=0, temperature=0)  # warm-up
    model.forward, model.prefill = timed("forward", forward), timed("prefill", prefill)
    try:
        gen = speculative_generate(model, None, prompt, tokens, gamma=0, temperature=0)
    finally:
        del model.forward, model.prefill  # the class's methods again
    cache = model.new_cache()
    model.prefill(np.asarray(prompt), cache)
    alone = best_seconds(lambda: (model.forward(np.arange(1, 2), cache), cache.rollback(len(prompt))), calls)
    n = gen.stats.new_tokens
    loop = gen.stats.seconds
    return {"tokens": n, "loop_ms_per_token": 1e3 * loop / n, "prefill_ms_per_token": 1e3 * spent["prefill"] / n,
            "forwards_ms_per_token": 1e3 * spent["forward"] / n,
            "rest_ms_per_token": 1e3 * (loop - spent["prefill"] - spent["forward"]) / n,
            "loop_forward_median_ms": 1e3 * common.median(each), "loop_forward_min_ms": 1e3 * min(each),
            "forward_alone_ms": 1e3 * alone}


def start_by_route(model, length, tokens, calls, pause=PAUSE):
    """{gemm_ms, kernel_ms, ratio}: the medians of `calls` decoding starts of a `length`-id prompt by `model` (the
    prefill of all ids but the last into a fresh cache, then `tokens` one-token forwards), its prefill by the GEMM
    (prefill_rows 0) and by the kernel, in turn after a warm-up round, `pause` seconds before each (common.in_turn);
    ratio: gemm_ms / kernel_ms. Each start is the kernel probe's own (npspec.kernels.probe.time_prefill, once, its pause
    left to common.in_turn)."""
    def start(by_kernel):
        return lambda: time_prefill(model, length - 1, by_kernel, repeats=1, sleep=lambda seconds: None, after=tokens)
    times = common.in_turn({"gemm": start(False), "kernel": start(True)}, calls, pause)
    gemm, kernel = 1e3 * common.median(times["gemm"]), 1e3 * common.median(times["kernel"])
    return {"gemm_ms": gemm, "kernel_ms": kernel, "ratio": gemm / kernel}


def profile_forward(model, m, calls, context=32):
    """The top of a cProfile listing (own time) of `calls` model.forward calls over m tokens, and seconds per call."""
    cache = model.new_cache()
    model.prefill(np.arange(context), cache, threads=1)  # on one BLAS thread: none left spinning into the timings
    ids = np.arange(1, m + 1)

    def run():
        for _ in range(calls):
            model.forward(ids, cache)
            cache.rollback(context)

    run()  # warm-up
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).sort_stats("tottime")
    stats.print_stats(8)
    text = buf.getvalue()
    return text[text.index("ncalls"):].rstrip(), stats.total_tt / calls


def summary_lines(forward_rows, loop_rows, start_rows):
    """The two decompositions and the decoding starts as markdown tables (ms), the summary at the top of profile.md."""
    lines = ["", "## An M-token forward against its own products replayed alone (best of --calls, ms), and v(M) = "
             "t(M) / t(1) split the same way over t(1)", "",
             "| kernel | M | forward | its products alone | around the products | products | v | v products | "
             "v around |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['rows']} | {r['forward_ms']:.1f} | {r['products_ms']:.1f} | {r['around_ms']:.1f} | "
              f"{r['products']} | {r['v']:.3f} | {r['v_products']:.3f} | {r['v_around']:.3f} |" for r in forward_rows]
    lines += ["", "## The plain loop per token, where its time goes (ms per token)", "",
              "| kernel | loop | prefill | forwards | rest | loop forward: median, fastest | forward alone |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['loop_ms_per_token']:.1f} | {r['prefill_ms_per_token']:.1f} | "
              f"{r['forwards_ms_per_token']:.1f} | {r['rest_ms_per_token']:.2f} | {r['loop_forward_median_ms']:.1f}, "
              f"{r['loop_forward_min_ms']:.1f} | {r['forward_alone_ms']:.1f} |" for r in loop_rows]
    lines += ["", f"## A decoding's start: the prompt's prefill and {START_TOKENS} one-token forwards, the prefill by the "
              "GEMM or by the kernel (median of --calls, ms)", "",
              "| kernel | prompt ids | by the GEMM | by the kernel | GEMM / kernel | probe's prefill_rows |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['prompt']} | {r['gemm_ms']:.1f} | {r['kernel_ms']:.1f} | {r['ratio']:.2f} | "
              f"{r['prefill_rows']} |" for r in start_rows]
    return lines


def options(ap):
    ap.add_argument("--model", default=None, help="model name (default random:gpt2-large; --quick: random:distilgpt2)")
    ap.add_argument("--calls", type=int, default=5, help="forwards timed or profiled per point (default 5)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens of the plain loop timed (default 32)")
    ap.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated (default {','.join(KERNELS)})")


def main(argv=None):
    run = common.command_line("bench.profile", __doc__, argv, options, threads=("2", "1"), many=False)
    name = run.args.model or ("random:distilgpt2" if run.args.quick else "random:gpt2-large")
    n = run.threads[0]
    kernels = run.args.kernels.split(",")
    base = models.get(name, threads=n)
    prompt = models.random_prompt() if name.startswith("random:") else list(range(1, models.PROMPT_LENGTH + 1))
    forward_rows, loop_rows, start_rows = [], [], []
    with common.blas_threads(n):
        for kernel in common.steps(kernels, "profile, kernel"):
            model = base.with_kernel(kernel, n)
            cols = {"model": name, "kernel": kernel, "threads": n}
            forward_rows += against_one_token([{**cols, **products_against_forward(model, run.args.calls, m=m),
                                                "load_average": common.load_average()} for m in ROWS])
            loop_rows.append({**cols, **loop_against_forwards(model, prompt, run.args.tokens, run.args.calls),
                              "load_average": common.load_average()})
            common.log(f"{kernel}: {forward_rows[-1]} {loop_rows[-1]}")
            if REGISTRY[kernel].own_threads:
                rows = choose_prefill(model, mode="bypass")
                for length in PROMPTS:
                    start_rows.append({**cols, "prompt": length, "prefill_rows": rows,
                                       **start_by_route(model, length, START_TOKENS, run.args.calls),
                                       "load_average": common.load_average()})
                    common.log(f"{kernel}: {start_rows[-1]}")
        model = base.with_kernel(kernels[0], n)
        parts = [f"# Profile of {name} forwards and of the plain loop ({n} thread{'s' * (n > 1)})", ""]
        parts += [f"- {k}: {v}" for k, v in run.meta.items()]
        parts += summary_lines(forward_rows, loop_rows, start_rows)
        parts += ["", f"## cProfile listings: {model.kernel}"]
        for m in (1, 5):
            text, per_call = profile_forward(model, m, run.args.calls)
            parts += ["", f"## {m}-token forward: {1e3 * per_call:.1f} ms per call (under the profiler)", "", "```",
                      text, "```"]
    parts += ["", __doc__.split("\n\n")[1].replace("\n", " ")]
    path = run.out / "profile.md"
    common.atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(parts) + "\n", encoding="utf-8"))
    note = "Best of --calls runs, interleaved; load_average: the 1-minute load when the row ended (module docstring)."
    return common.finish(run, [common.Table("profile_forward", forward_rows, "A forward against its products alone",
                                            note),
                               common.Table("profile_loop", loop_rows, "The plain loop against its forwards", note),
                               common.Table("profile_start", start_rows, "A decoding's start, its prefill by the GEMM "
                                            "or by the kernel", "Medians of --calls, in turn (module docstring).")],
                         [path])


if __name__ == "__main__":
    sys.exit(main())
