"""python -m npspec.testing vectors OUT.json [--force]: write the kit's exact laws as a versioned JSON file.

The file (npspec.testing.vectors) lets a sampler written in any language be checked against exact
laws without Python. It is written atomically (a temporary file renamed into place) and never
replaces an existing file without --force, nor ever anything but a regular file (a directory, a device
such as /dev/null or a symlink is refused, --force or not); OUT `-` writes to stdout. Imports npspec.files (atomic_write, oneline) and the kit.
"""

import argparse
import json
import sys
from pathlib import Path

from ..files import atomic_write, oneline
from .vectors import FORMAT, VERSION, vectors


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m npspec.testing", description=__doc__.split("\n")[0].split(": ", 1)[1])
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("vectors", help=f"write the exact laws ({FORMAT}, version {VERSION}) as JSON")
    v.add_argument("out", help="the JSON file to write (a regular file; - for stdout)")
    v.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = ap.parse_args(argv)
    if args.out == "-":  # stdout
        text = json.dumps(vectors(), indent=1) + "\n"
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except (OSError, AttributeError, ValueError) as e:
            return _error(f"cannot write the vectors to stdout ({oneline(e)}); check where stdout goes")
        return 0
    out = Path(args.out)
    try:
        if out.is_symlink() or (out.exists() and not out.is_file()):
            return _error(f"{out} is not a regular file (a directory, a device, a symlink...); give the name of a "
                          "regular file (nothing was written)")
        if out.exists() and not args.force:
            return _error(f"{out} exists; pass --force to replace it (nothing was written)")
        if not out.parent.is_dir():
            return _error(f"cannot write {out}: the directory {out.parent} does not exist")
    except OSError as e:  # a name too long for the file system, a directory that cannot be read
        return _error(f"cannot use {str(out)[:80]}{'...' if len(str(out)) > 80 else ''} as the output ({oneline(e)}); "
                      "choose a shorter or accessible path")
    text = json.dumps(vectors(), indent=1) + "\n"
    try:
        atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    except OSError as e:
        return _error(f"cannot write {out} ({oneline(e)}); choose a writable path")
    print(f"wrote {out} ({FORMAT}, version {VERSION})", file=sys.stderr)
    return 0


def _error(message):
    if sys.stderr is not None:  # stderr closed: say nothing rather than write the error to stdout
        try:
            print(f"npspec.testing: error: {message}", file=sys.stderr)
        except (OSError, ValueError):
            pass
    return 1


if __name__ == "__main__":
    sys.exit(main())
