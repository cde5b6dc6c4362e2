"""python -m bench.profile: where a forward's time goes (cProfile), as evidence for bench/results/README.md.

For one model (default random:gpt2-large; --quick: random:distilgpt2), decoding as a target does
("gemv-panels" with the run's thread count, BLAS limited to the same count), profiles `--calls`
one-token forwards (AR decode) and as many 5-token forwards (a gamma = 4 verify) and writes the
functions with the most own time to profile.md. The BLAS calls have no Python frame of their
own: their time is the own time of the function that calls np.matmul (the kernel,
npspec/kernels.py GemvPanels.__call__, listed as `__call__`).
"""

import cProfile
import io
import pstats
import sys
from pathlib import Path

import numpy as np

from . import common, models


def profile_forward(model, m, calls, context=32):
    """The top of a cProfile listing (own time) of `calls` model.forward calls over m tokens, and seconds per call."""
    cache = model.new_cache()
    model.prefill(np.arange(context), cache)
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


def options(ap):
    ap.add_argument("--model", default=None, help="model name (default random:gpt2-large; --quick: random:distilgpt2)")
    ap.add_argument("--calls", type=int, default=5, help="forwards profiled per M (default 5)")


def main(argv=None):
    run = common.command_line("bench.profile", __doc__, argv, options, threads=("2", "1"), many=False)
    name = run.args.model or ("random:distilgpt2" if run.args.quick else "random:gpt2-large")
    n = run.threads[0]
    model = models.get(name, threads=n)
    parts = [f"# Profile of {name} forwards ({model.kernel}, {n} thread{'s' * (n > 1)}, BLAS and kernel)", ""]
    parts += [f"- {k}: {v}" for k, v in run.meta.items()]
    with common.blas_threads(n):
        for m in (1, 5):
            text, per_call = profile_forward(model, m, run.args.calls)
            parts += ["", f"## {m}-token forward: {1e3 * per_call:.1f} ms per call (under the profiler)", "", "```",
                      text, "```"]
    parts += ["", __doc__.split("\n\n")[1].replace("\n", " ")]
    path = run.out / "profile.md"
    common.atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(parts) + "\n", encoding="utf-8"))
    return common.finish(run, [], [path])


if __name__ == "__main__":
    sys.exit(main())
