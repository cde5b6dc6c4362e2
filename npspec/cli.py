"""The `npspec` command: one entry point whose subcommands are npspec's commands.

    npspec generate [PROMPT] [options]      # = python -m npspec.generate
    npspec convert SRC OUT_DIR              # = python -m npspec.convert
    npspec bench NAME [options]             # = python -m bench.NAME (a source checkout with the bench extra)
    npspec --version

Each subcommand is the module's own `main`, given the rest of the command line unchanged, so
`npspec generate ...` and `python -m npspec.generate ...` accept the same arguments and behave
alike. Exit status (EXIT_CODES): 0 done, 1 an error (one line on stderr), 2 a command line
argparse rejects, 130 interrupted (Ctrl-C), 141 the reader of stdout left (e.g. `| head`).

The benchmarks are not part of the installed package: `npspec bench` runs `python -m bench.NAME`
in a child process from the source tree npspec was imported from (an editable install or
PYTHONPATH), and says what to install when that tree or the bench extra (matplotlib) is
missing. Imports npspec.generate and npspec.convert; nothing in npspec imports this module.
"""

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from . import __version__, convert, generate

SOURCE_ROOT = Path(__file__).resolve().parent.parent  # the source tree, when npspec runs from one
BENCH_COMMANDS = ("compare", "verify_cost", "speedup", "drafters", "trees", "sweep", "memory", "load", "profile", "threads",
                  "quantized", "qspeed", "report")
EXIT_CODES = {0: "done", 1: "an error, one line on stderr", 2: "a command line argparse rejects",
              130: "interrupted", 141: "stdout's reader left (e.g. | head)"}


def build_parser():
    """The top-level parser: --help, --version and the subcommand's name (the rest is the subcommand's)."""
    ap = argparse.ArgumentParser(
        prog="npspec", description="Speculative decoding on a hand-written NumPy GPT-2.",
        epilog="`npspec COMMAND --help` shows a command's options. Exit status: "
               + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + ".")
    ap.add_argument("--version", action="version", version=f"npspec {__version__}")
    ap.add_argument("command", choices=list(COMMANDS),
                    help="generate: text from a model pair; convert: a Hugging Face checkpoint into npspec's "
                         "layout; bench: a benchmark (source checkout + bench extra)")
    return ap


def bench(argv, root=SOURCE_ROOT, extra_installed=None):
    """`npspec bench NAME [options]`: run `python -m bench.NAME [options]` from the source tree `root`.

    argv: NAME and its options. extra_installed: whether the bench extra is importable (default:
    look for matplotlib). Returns the exit status (the benchmark's own, or 1 with a one-line
    message if `root` has no bench/ or the extra is missing, or 2 for an unknown NAME).
    """
    usage = "usage: npspec bench {" + ",".join(BENCH_COMMANDS) + "} [options]  (npspec bench NAME --help)"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name = argv[0].replace("-", "_")
    if name not in BENCH_COMMANDS:
        print(f"{usage}\nnpspec bench: error: unknown benchmark {argv[0]!r}", file=sys.stderr)
        return 2
    if not (Path(root) / "bench" / f"{name}.py").is_file():
        print(f"npspec bench: error: the benchmarks live in npspec's source tree, and npspec was imported from "
              f"{Path(root) / 'npspec'}; clone the repository and run pip install -e '.[bench]' there", file=sys.stderr)
        return 1
    if extra_installed is None:
        extra_installed = importlib.util.find_spec("matplotlib") is not None
    if not extra_installed:
        print("npspec bench: error: the bench extra is not installed; run pip install -e '.[bench]' in "
              f"{root}", file=sys.stderr)
        return 1
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run([sys.executable, "-m", f"bench.{name}", *argv[1:]], env=env).returncode


def run_generate(argv):
    """`npspec generate ...`: npspec.generate.main, its usage naming `npspec generate`."""
    return generate.main(argv, prog="npspec generate")


def run_convert(argv):
    """`npspec convert ...`: npspec.convert.main, its usage naming `npspec convert`."""
    return convert.main(argv, prog="npspec convert")


COMMANDS = {"generate": run_generate, "convert": run_convert, "bench": bench}


def main(argv=None):
    """Run `npspec COMMAND ...` (argv: the arguments after `npspec`; default sys.argv[1:]). Returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if sys.stderr is None:  # stderr closed (2>&-): print(file=None) would write messages to STDOUT; drop them
        sys.stderr = open(os.devnull, "w")
    try:
        if not argv or argv[0] not in COMMANDS:
            build_parser().parse_args(argv[:1])  # --help, --version, or a usage error: argparse exits
            return 2  # not reached: a first argument that is not a command is --help, --version or an error
        return COMMANDS[argv[0]](argv[1:])
    except SystemExit as e:  # argparse's --help (0) and usage errors (2), as a status
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
