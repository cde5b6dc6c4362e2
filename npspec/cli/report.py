"""What generate prints once it has decoded (report): the --json object, the summary line on stderr (summary) and
the --compare line. Imports numpy and npspec.cli.harness's comparison.
"""

import json
from dataclasses import dataclass

import numpy as np

from .harness import comparison


@dataclass(frozen=True)
class Outcome:
    """What a run reports (report)."""
    gen: object  # the Generation streamed
    specs: list  # compare_repeated's speculative Generations of the finished turns ([gen] without --compare)
    plain: dict  # {label: [Generation]}: its plain ones ({}: no comparison)
    kernels: dict  # kernel_choice.kernels_used's
    text: object  # ids -> str: the target's tokenizer.decode


def json_safe(x):
    """NaN (e.g. alpha when nothing was drafted) becomes null, so strict JSON parsers accept the output."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return x


def number(x, spec):
    """`x` formatted with `spec`, or "-" for a ratio with nothing to count (NaN; JSON's null)."""
    return "-" if np.isnan(x) else format(x, spec)


def counted(n, noun):  # -> "1 round", "0 rounds", "2 rounds"
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def summary(stats):
    """The one-line summary printed to stderr."""
    return (f"{counted(stats.new_tokens, 'new token')} in {counted(stats.rounds, 'round')}, "
            f"alpha {number(stats.alpha, '.3f')}, "
            f"{number(stats.tokens_per_round, '.2f')} tokens/round, {number(stats.tokens_per_s, '.1f')} tokens/s "
            f"(stop: {stats.stop_reason})")


def report(args, outcome, out, err):
    """The --json object to `out`, the summary and the --compare lines to `err` (the streamed text ends before);
    fewer turns than --compare-repeats asked (Ctrl-C) are said on `err` and in the object's `repeats`."""
    gen, specs, plain = outcome.gen, outcome.specs, outcome.plain
    greedy = args.temperature == 0
    if args.json:
        obj = {"text": outcome.text(gen.ids), "ids": gen.ids, "stats": {**gen.stats.as_dict(), **outcome.kernels}}
        if args.trace:
            obj["trace"] = gen.trace
        if plain:
            obj["compare"] = {**comparison(specs, plain, greedy), "repeats_asked": args.compare_repeats}
        out.write(json.dumps(json_safe(obj), allow_nan=False) + "\n")
        out.flush()
    print(summary(gen.stats), file=err)
    if plain:
        print_comparison(comparison(specs, plain, greedy), args.compare_repeats, err)
    elif args.compare:
        print("compare: interrupted before its decodings finished, so nothing is compared", file=err)


def print_comparison(c, asked, err):
    """The --compare line of `c` (harness.comparison's) to `err`, and one more if Ctrl-C left fewer than `asked`."""
    spread = (f" (median of {c['repeats']} in turn, {min(c['speedups']):.2f}x to {max(c['speedups']):.2f}x)"
              if c["repeats"] > 1 else "")
    print(f"compare: speculative {c['speculative_tokens_per_s']:.1f} tokens/s, plain "
          f"{c['plain_tokens_per_s']:.1f} tokens/s (fastest plain decoding: {c['plain_kernel']}), speedup "
          f"{c['speedup']:.2f}x{spread}" + ("" if c["same_ids"] is None else ", same output" if c["same_ids"]
                                             else ", DIFFERENT output"), file=err)
    if c["repeats"] < asked:
        print(f"compare: Ctrl-C stopped turn {c['repeats'] + 1} of {asked}; the line above "
              f"compares the {c['repeats']} finished", file=err)
