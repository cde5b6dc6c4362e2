"""python -m npspec.testing vectors OUT.json [--force]: write the kit's exact laws as a versioned JSON file.

OUT `-` writes to stdout. A file is written atomically (npspec.sources.atomic) and replaces an existing one only
with --force, and then only a regular file. Errors go to stderr, one line (npspec.cli.console).
"""

import json
import sys
from pathlib import Path

from ..sources.atomic import atomic_write, replace_problem
from ..cli.console import Parser, error_stream, parse
from ..sources.errors import oneline
from .vectors import FORMAT, VERSION, vectors
from ..cli.startup import started

PROG = "python -m npspec.testing"


def build_parser(out=None, err=None):
    """The argument parser (npspec.cli.console.Parser: help to `out`, usage errors to `err`)."""
    ap = Parser(prog=PROG, description=__doc__.split("\n")[0].split(": ", 1)[1], out=out, err=err)
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("vectors", help=f"write the exact laws ({FORMAT}, version {VERSION}) as JSON", out=out, err=err)
    v.add_argument("out", help="the JSON file to write, or - for stdout")
    v.add_argument("--force", action="store_true", help="replace OUT if it exists (a regular file only)")
    return ap


def main(argv=None, out=None, err=None):
    """Run the command (argv default sys.argv[1:]; out, err default sys.stdout, sys.stderr). Returns the exit status:
    0, 1 an error (one line on err), 2 a command line argparse rejects, 130 Ctrl-C."""
    started()  # Python's Ctrl-C handler back (npspec.cli.console: the imports had their own)
    out = sys.stdout if out is None else out
    err = error_stream(sys.stderr if err is None else err)
    args, status = parse(build_parser(out, err), argv, err, "npspec.testing")
    if args is None:
        return status
    try:
        return write(args, out, err)
    except KeyboardInterrupt:  # Ctrl-C while the vectors are computed or written: atomic_write left nothing
        print("npspec.testing: interrupted (nothing was written)", file=err)
        return 130


def write(args, out, err):
    """Compute the vectors and write them where args.out says; returns the exit status (0, or 1 after one line)."""
    text = json.dumps(vectors(), indent=1) + "\n"
    if args.out == "-":
        try:
            if out is None:
                raise OSError("stdout is closed")
            out.write(text)
            out.flush()
        except OSError as e:
            return _error(f"cannot write to stdout ({e.strerror or e}); check where stdout goes", err)
        return 0
    target = Path(args.out)
    try:
        if problem := replace_problem(target):
            return _error(f"cannot write {target}: {problem}", err)
        if target.exists() and not args.force:
            return _error(f"{target} exists; pass --force to replace it (nothing was written)", err)
        if not target.parent.is_dir():
            where = "is not a directory" if target.parent.exists() else "does not exist"
            return _error(f"cannot write {target}: {target.parent} {where}; choose a path in an existing directory",
                          err)
        atomic_write(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    except OSError as e:
        return _error(f"cannot write {target} ({e.strerror or oneline(e)}); choose a writable path", err)
    print(f"wrote {target} ({FORMAT}, version {VERSION})", file=err)
    return 0


def _error(message, err):
    print(f"npspec.testing: error: {message}", file=err)
    return 1


if __name__ == "__main__":
    sys.exit(main())
