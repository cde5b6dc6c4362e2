"""The `npspec` command: `npspec generate ...` (= python -m npspec.generate), `npspec convert SRC OUT_DIR`,
`npspec bench NAME [options]` (= python -m bench.NAME) and `npspec --version`.

Each subcommand is its module's own `main`, given the rest of the command line. Exit status: EXIT_CODES.
`npspec bench` runs the benchmark in a child process from the source tree npspec was imported from, offering
the modules of its bench/ that run as a command (bench_commands), and says what to install when the tree or
the bench extra is missing. Imports npspec.cli's console, generate and convert; nothing imports this module.
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
    """The sorted names of `root`/bench's modules that run as a command; () without bench/ (an installed npspec)."""
    return tuple(sorted(p.stem for p in (Path(root) / "bench").glob("*.py")
                        if not p.stem.startswith("_") and '__name__ == "__main__"' in p.read_text(encoding="utf-8")))


def build_parser(out=None, err=None):
    """The top-level parser: --help, --version and the subcommand's name (console.Parser)."""
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
    """`npspec bench NAME [options]`: `python -m bench.NAME [options]` from the source tree `root`. Returns the
    benchmark's exit status, 1 with one line when `root` has no bench/, the extra (extra_installed, default: is
    matplotlib importable) is missing or stdout cannot take --help, 2 for an unknown NAME."""
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
    """Run `npspec COMMAND ...` (argv default sys.argv[1:]; out, err: console.streams). Returns the exit status."""
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
