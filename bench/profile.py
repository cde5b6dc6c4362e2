"""python -m bench.profile: where a forward's time goes (cProfile), as evidence for bench/results/README.md.

For one model (default random:gpt2-large in panel layout; --quick: random:distilgpt2) and one
BLAS thread count, profiles `--calls` one-token forwards (AR decode) and as many 5-token
forwards (a gamma = 4 verify) and writes the functions with the most own time to profile.md.
The BLAS calls have no Python frame of their own: their time is the own time of the function
that calls np.matmul (linear_panels, linear_rows, lm_head).
"""

import cProfile
import io
import pstats
import sys

import numpy as np

from npspec.model import gpt2

from . import common, models


def profile_forward(model, m, calls, context=32):
    """The top of a cProfile listing (own time) of `calls` invariant forwards over m tokens, and seconds per call."""
    cache = model.new_cache()
    model.forward(np.arange(context), cache, invariant=False)
    ids = np.arange(1, m + 1)

    def run():
        for _ in range(calls):
            gpt2(ids, model.params, model.config, cache)
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


def main(argv=None):
    ap = common.parser("bench.profile", __doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model name (default random:gpt2-large; --quick: random:distilgpt2)")
    ap.add_argument("--calls", type=int, default=5, help="forwards profiled per M (default 5)")
    args = ap.parse_args(argv)
    out = common.output_dir(args)
    name = args.model or ("random:distilgpt2" if args.quick else "random:gpt2-large")
    n = common.thread_counts(args)[-1]
    model = models.get(name)
    meta = common.machine_info()
    parts = [f"# Profile of {name} forwards ({n} BLAS thread{'s' * (n > 1)}, panel layout)", ""]
    parts += [f"- {k}: {v}" for k, v in meta.items()]
    with common.blas_threads(n):
        for m in (1, 5):
            text, per_call = profile_forward(model, m, args.calls)
            parts += ["", f"## {m}-token forward: {1e3 * per_call:.1f} ms per call (under the profiler)", "", "```",
                      text, "```"]
    parts += ["", __doc__.split("\n\n")[1].replace("\n", " ")]
    path = out / "profile.md"
    common.atomic_write(path, lambda tmp: open(tmp, "w", encoding="utf-8").write("\n".join(parts) + "\n"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
