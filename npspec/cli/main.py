"""The `npspec` command: one entry point whose subcommands are npspec's commands.

    npspec generate [PROMPT] [options]      # = python -m npspec.generate
    npspec convert SRC OUT_DIR              # = npspec convert
    npspec bench NAME [options]             # = python -m bench.NAME (a source checkout with the bench extra)
    npspec --version

Each subcommand is the module's own `main`, given the rest of the command line unchanged, so
`npspec generate ...` and `python -m npspec.generate ...` accept the same arguments and behave
alike. Exit status (EXIT_CODES): 0 done, 1 an error (one line on stderr), 2 a command line
argparse rejects, 130 interrupted (Ctrl-C), 141 the reader of stdout left (e.g. `| head`).

The benchmarks are not part of the installed package: `npspec bench` runs `python -m bench.NAME`
in a child process from the source tree npspec was imported from (an editable install or
PYTHONPATH), and says what to install when that tree or the bench extra (matplotlib) is
missing. The benchmarks offered are the modules of that tree's bench/ that run as a command
(bench_commands: no second list). Streams are passed down explicitly (npspec.cli.console): with
stderr closed, messages are dropped, never printed to stdout; help or version that stdout cannot
take (a full disk) is an error. Imports npspec.cli.console, npspec.generate and npspec.cli.convert;
nothing in npspec imports this module.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from .. import __version__
from . import convert, generate
from .console import Parser, parse, streams
from .startup import started

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the source tree, when npspec runs from one
EXIT_CODES = {0: "done", 1: "an error, one line on stderr", 2: "a command line argparse rejects",
              130: "interrupted", 141: "stdout's reader left (e.g. | head)"}


def bench_commands(root=SOURCE_ROOT):
    """The benchmark names `npspec bench` offers: the modules of `root`/bench that run as a command (hold
    `if __name__ == "__main__"`), sorted; empty when `root` has no bench/ (an installed npspec)."""
    return tuple(sorted(p.stem for p in (Path(root) / "bench").glob("*.py")
                        if not p.stem.startswith("_") and '__name__ == "__main__"' in p.read_text(encoding="utf-8")))


def build_parser(out=None, err=None):
    """The top-level parser: --help, --version and the subcommand's name (the rest is the subcommand's); help and
    version to `out`, usage errors to `err` (npspec.cli.console.Parser)."""
    ap = Parser(
        out=out, err=err, prog="npspec", description="Speculative decoding on a hand-written NumPy GPT-2.",
        epilog="`npspec COMMAND --help` shows a command's options. Exit status: "
               + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + ".")
    ap.add_argument("--version", action="version", version=f"npspec {__version__}")
    ap.add_argument("command", choices=list(COMMANDS),
                    help="generate: text from a model pair; convert: a Hugging Face checkpoint into npspec's "
                         "layout; bench: a benchmark (source checkout + bench extra)")
    return ap


def bench(argv, root=SOURCE_ROOT, extra_installed=None, out=None, err=None):
    """`npspec bench NAME [options]`: run `python -m bench.NAME [options]` from the source tree `root`.

    argv: NAME and its options. extra_installed: whether the bench extra is importable (default:
    look for matplotlib). out, err: the streams for the usage (default sys.stdout, sys.stderr). Returns the
    exit status (the benchmark's own, or 1 with a one-line message if `root` has no bench/, the extra is
    missing or stdout cannot take --help, or 2 for an unknown NAME).
    """
    out, err = streams(out, err)
    if not (Path(root) / "bench").is_dir():
        print(f"npspec bench: error: the benchmarks live in npspec's source tree, and npspec was imported from "
              f"{Path(root) / 'npspec'}; clone the repository and run pip install -e '.[bench]' there", file=err)
        return 1
    names = bench_commands(root)
    usage = "usage: npspec bench {" + ",".join(names) + "} [options]  (npspec bench NAME --help)"
    if not argv or argv[0] in ("-h", "--help"):
        if not argv:
            print(usage, file=err)
            return 2
        try:
            if out is None:
                raise OSError("stdout is closed")
            print(usage, file=out, flush=True)
        except OSError as e:
            print(f"npspec bench: error: cannot write to stdout ({e.strerror or e}); check where stdout goes",
                  file=err)
            return 1
        return 0
    name = argv[0].replace("-", "_")
    if name not in names:
        print(f"{usage}\nnpspec bench: error: unknown benchmark {argv[0]!r}", file=err)
        return 2
    if extra_installed is None:
        extra_installed = importlib.util.find_spec("matplotlib") is not None
    if not extra_installed:
        print("npspec bench: error: the bench extra is not installed; run pip install -e '.[bench]' in "
              f"{root}", file=err)
        return 1
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run([sys.executable, "-m", f"bench.{name}", *argv[1:]], env=env).returncode


def run_generate(argv, out=None, err=None):
    """`npspec generate ...`: npspec.cli.generate.main, its usage naming `npspec generate`."""
    return generate.main(argv, prog="npspec generate", out=out, err=err)


def run_convert(argv, out=None, err=None):
    """`npspec convert ...`: npspec.cli.convert.main, its usage naming `npspec convert`."""
    return convert.main(argv, prog="npspec convert", out=out, err=err)


COMMANDS = {"generate": run_generate, "convert": run_convert, "bench": bench}


def main(argv=None, out=None, err=None):
    """Run `npspec COMMAND ...` (argv: the arguments after `npspec`; default sys.argv[1:]). Returns the exit status.

    out, err: the command's streams (default sys.stdout and sys.stderr; a closed stderr drops messages).
    """
    started()  # Python's Ctrl-C handler back (npspec.cli.console: the imports had their own)
    argv = sys.argv[1:] if argv is None else list(argv)
    out, err = streams(out, err)
    try:
        if not argv or argv[0] not in COMMANDS:  # --help, --version, or a usage error
            _, status = parse(build_parser(out, err), argv[:1], err, "npspec")
            return 2 if status is None else status
        return COMMANDS[argv[0]](argv[1:], out=out, err=err)
    except KeyboardInterrupt:
        print("npspec: interrupted", file=err)
        return 130


if __name__ == "__main__":
    sys.exit(main())
