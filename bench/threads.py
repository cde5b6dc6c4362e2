"""python -m bench.threads: what a Python thread handoff and BLAS's spinning threads cost, as evidence for bench/results/README.md.

Two measurements with --threads threads (default 2: the "gemv-panels" kernel's workers and the BLAS pool):
  * handoff: the round trip of a lock ping-pong between two Python threads (microseconds), the
    least a "gemv-panels" forward pays per matrix it shares out (it pays about two per matrix);
  * spin: the target's ("gemv-panels") verify forward over 5 tokens timed alone, right after a
    one-token draft forward with "gemv-rows" (BLAS threads it itself), and right after one with
    "gemv-panels" (its own threads, no BLAS threads). OpenBLAS' idle threads spin for a while
    after a threaded call, so the verify's own workers find the second core busy.
Models: random:gpt2-large / random:distilgpt2 (--quick: random:gpt2 / random:distilgpt2).
Writes threads.csv/.md (median of --repeats runs of each).
"""

import sys
import threading
import time

import numpy as np

from . import common, models

DRAFT_KERNELS = ("gemv-rows", "gemv-panels")


def handoff_seconds(n=5000):
    """Median round trip (seconds) of a lock ping-pong between the main thread and one worker."""
    go, done = threading.Lock(), threading.Lock()
    go.acquire()
    done.acquire()
    stop = []

    def worker():
        while True:
            go.acquire()
            done.release()
            if stop:
                return

    threading.Thread(target=worker, daemon=True).start()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            go.release()
            done.acquire()
        times.append((time.perf_counter() - t0) / n)
    stop.append(True)
    go.release()
    return common.median(times)


def spin_rows(target, draft, threads, repeats, context=32):
    """Verify seconds alone, after a "gemv-rows" draft forward, after a "gemv-panels" draft forward (with `threads`)."""
    tcache, dcache = target.new_cache(), draft.new_cache()
    target.prefill(np.arange(context), tcache, threads=1)  # on one BLAS thread: only the draft's forwards spin
    draft.prefill(np.arange(context), dcache, threads=1)
    drafts = {kernel: draft.with_kernel(kernel, threads) for kernel in DRAFT_KERNELS}

    def verify():
        tcache.rollback(context)
        t0 = time.perf_counter()
        target.forward(np.arange(5), tcache)
        return time.perf_counter() - t0

    def draft_forward(kernel):
        dcache.rollback(context)
        drafts[kernel].forward(np.arange(1), dcache)

    verify()  # warm-up
    times = {"alone": [], **{f"after_{column(k)}_draft": [] for k in DRAFT_KERNELS}}
    for _ in range(repeats):
        time.sleep(0.5)  # let any spinning BLAS thread go to sleep
        times["alone"].append(verify())
        for kernel in DRAFT_KERNELS:
            draft_forward(kernel)
            times[f"after_{column(kernel)}_draft"].append(verify())
    return {k: common.median(v) for k, v in times.items()}


def column(kernel):
    """A kernel name as part of a column name: "gemv-rows" -> "gemv_rows"."""
    return kernel.replace("-", "_")


def options(ap):
    ap.add_argument("--repeats", type=int, default=None, help="runs per figure (default 7; --quick: 3)")


def main(argv=None):
    run = common.command_line("bench.threads", __doc__, argv, options, threads=("2", "2"), many=False)
    n = run.threads[0]
    repeats = run.args.repeats or (3 if run.args.quick else 7)
    pair = ("random:gpt2", "random:distilgpt2") if run.args.quick else ("random:gpt2-large", "random:distilgpt2")
    with common.blas_threads(n):
        handoff = handoff_seconds()
        draft = models.get(pair[1], seed=1, role="draft", threads=n)
        target = models.get(pair[0], threads=n, partner=draft)
        spin = spin_rows(target, draft, n, repeats)
    row = {"target": pair[0], "draft": pair[1], "threads": n, "handoff_us": 1e6 * handoff,
           **{f"verify5_{k}_ms": 1e3 * v for k, v in spin.items()},
           "after_gemv_rows_over_alone": spin["after_gemv_rows_draft"] / spin["alone"]}
    common.log(f"handoff {row['handoff_us']:.0f} us; verify(5) alone {row['verify5_alone_ms']:.1f} ms, after a "
               f"gemv-rows draft {row['verify5_after_gemv_rows_draft_ms']:.1f} ms, after a gemv-panels draft "
               f"{row['verify5_after_gemv_panels_draft_ms']:.1f} ms")
    return common.finish(run, [common.Table(
        "threads", [row], f"Thread handoff and BLAS spin ({n} threads)",
        "handoff_us: median round trip of a lock ping-pong between two Python threads. verify5_*: median seconds of "
        "the target's 5-token verify forward (gemv-panels) alone, right after a one-token draft forward that BLAS "
        "threads itself (gemv-rows), and right after one with gemv-panels.")])


if __name__ == "__main__":
    sys.exit(main())
