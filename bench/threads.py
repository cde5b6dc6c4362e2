"""python -m bench.threads: what a Python thread handoff and BLAS's spinning threads cost, as evidence for bench/results/README.md.

Two measurements with 2 threads (npspec's "panels" workers and the BLAS pool):
  * handoff: the round trip of a lock ping-pong between two Python threads (microseconds), the
    least a "panels" forward pays per matrix it shares out (it pays about two per matrix);
  * spin: the target's verify forward over 5 tokens timed alone, right after a one-token draft
    forward that BLAS threads itself ("rows"), and right after a draft forward with "panels"
    (no BLAS threads). OpenBLAS' idle threads spin for a while after a threaded call, so the
    verify's own workers find the second core busy.
Models: random:gpt2-large / random:distilgpt2 (--quick: random:gpt2 / random:distilgpt2).
Writes threads.csv/.md (median of --repeats runs of each).
"""

import sys
import threading
import time

import numpy as np

from . import common, models


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


def spin_rows(target, draft, repeats, context=32):
    """Verify seconds alone, after a BLAS-threaded ("rows") draft forward, after a "panels" draft forward."""
    from npspec.model import gpt2

    tcache, dcache = target.new_cache(), draft.new_cache()
    target.forward(np.arange(context), tcache, invariant=False)
    draft.forward(np.arange(context), dcache, invariant=False)

    def verify():
        tcache.rollback(context)
        t0 = time.perf_counter()
        target.forward(np.arange(5), tcache)
        return time.perf_counter() - t0

    def draft_forward(matmul):
        dcache.rollback(context)
        gpt2(np.arange(1), draft.params, draft.config, dcache, matmul=matmul)

    verify()  # warm-up
    times = {"alone": [], "after_rows_draft": [], "after_panels_draft": []}
    for _ in range(repeats):
        time.sleep(0.5)  # let any spinning BLAS thread go to sleep
        times["alone"].append(verify())
        draft_forward("rows")
        times["after_rows_draft"].append(verify())
        draft_forward("panels")
        times["after_panels_draft"].append(verify())
    return {k: common.median(v) for k, v in times.items()}


def main(argv=None):
    ap = common.parser("bench.threads", __doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=None, help="runs per figure (default 7; --quick: 3)")
    args = ap.parse_args(argv)
    out = common.output_dir(args)
    repeats = args.repeats or (3 if args.quick else 7)
    pair = ("random:gpt2", "random:distilgpt2") if args.quick else ("random:gpt2-large", "random:distilgpt2")
    meta = common.machine_info()
    meta["command"] = "python -m bench.threads " + " ".join(argv if argv is not None else sys.argv[1:])
    with common.blas_threads(2):
        handoff = handoff_seconds()
        target, draft = models.get(pair[0]), models.get(pair[1], seed=1)
        spin = spin_rows(target, draft, repeats)
    row = {"target": pair[0], "draft": pair[1], "threads": 2, "handoff_us": 1e6 * handoff,
           **{f"verify5_{k}_ms": 1e3 * v for k, v in spin.items()},
           "after_rows_over_alone": spin["after_rows_draft"] / spin["alone"]}
    print(f"handoff {row['handoff_us']:.0f} us; verify(5) alone {row['verify5_alone_ms']:.1f} ms, after a rows draft "
          f"{row['verify5_after_rows_draft_ms']:.1f} ms, after a panels draft {row['verify5_after_panels_draft_ms']:.1f} ms",
          file=sys.stderr)
    common.write_table(out, "threads", [row], meta, "Thread handoff and BLAS spin (2 threads)",
                       "handoff_us: median round trip of a lock ping-pong between two Python threads. verify5_*: median "
                       "seconds of the target's 5-token verify forward (panels) alone, right after a one-token draft "
                       "forward that BLAS threads itself (rows), and right after one with panels.")
    print(f"wrote {out / 'threads.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
