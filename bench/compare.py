"""python -m bench.compare: the one command README's Performance section leads with, run and recorded.

Runs `python -m npspec.generate --target random:<target> --draft random:<draft> --temperature 0
--simulate-acceptance A --compare --compare-repeats N --json` in a fresh process with the environment as it is (no
variable added), and writes what it printed, with the command and the machine, to compare.json. N (--repeats) is 5:
the speculative and plain decodings in turn, so that a memory rate that drifts during the run moves both sides of
each ratio (npspec.cli.harness.compare_repeated).
The acceptance is SIMULATED (npspec.decode.drafters.controlled): random weights give a draft nothing to agree on.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from npspec.sources.atomic import atomic_write

from . import common


def options(ap):
    ap.add_argument("--pair", default="gpt2-large/distilgpt2", help="target/draft shapes (default gpt2-large/distilgpt2; "
                                                                  "--quick: gpt2/distilgpt2)")
    ap.add_argument("--a", type=float, default=0.7, help="the simulated acceptance (default 0.7)")
    ap.add_argument("--gamma", type=int, default=3, help="draft tokens per round (default 3)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens to decode (default 128; --quick: 16)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="--compare-repeats: decodings in turn, the median taken (default 5; --quick: 1)")


def main(argv=None):
    run = common.command_line("bench.compare", __doc__, argv, options, threads=("2", "2"), many=False)
    args = run.args
    target, draft = ("gpt2", "distilgpt2") if args.quick and args.pair == "gpt2-large/distilgpt2" else \
        args.pair.split("/")
    command = ["npspec", "generate", "--target", f"random:{target}", "--draft", f"random:{draft}", "--temperature",
               "0", "--simulate-acceptance", f"{args.a:g}", "--gamma", str(args.gamma), "--threads",
               str(run.threads[0]), "--max-new-tokens", str(args.new_tokens or (16 if args.quick else 128)),
               "--compare", "--compare-repeats", str(args.repeats or (1 if args.quick else 5)), "The quick brown fox"]
    r = subprocess.run([sys.executable, "-m", "npspec.generate", *command[2:], "--json"], capture_output=True,
                       text=True, env=os.environ.copy())
    if r.returncode:
        print(f"bench.compare: the command failed: {r.stderr.strip()[-500:]}", file=sys.stderr)
        return 1
    record = {"command": " ".join(command), "a": args.a, "machine": run.meta, "result": json.loads(r.stdout),
              "stderr": r.stderr.strip().splitlines()[-2:]}
    path = run.out / "compare.json"
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1) + "\n"))
    print("\n".join(record["stderr"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
