"""python -m npspec.testing vectors OUT.json [--force]: write the kit's exact laws as a versioned JSON file.

The file (npspec.testing.vectors) lets a sampler written in any language be checked against exact
laws without Python. It is written atomically (a temporary file renamed into place) and never
replaces an existing file without --force. Imports npspec.files (atomic_write, oneline) and the kit.
"""

import argparse
import json
import sys
from pathlib import Path

from ..atomic import atomic_write
from ..errors import oneline
from .vectors import FORMAT, VERSION, vectors


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m npspec.testing", description=__doc__.split("\n")[0].split(": ", 1)[1])
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("vectors", help=f"write the exact laws ({FORMAT}, version {VERSION}) as JSON")
    v.add_argument("out", help="the JSON file to write")
    v.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not args.force:
        return _error(f"{out} exists; pass --force to replace it (nothing was written)")
    if out.is_dir():
        return _error(f"{out} is a directory; give a file name")
    if not out.parent.is_dir():
        return _error(f"cannot write {out}: the directory {out.parent} does not exist")
    text = json.dumps(vectors(), indent=1) + "\n"
    try:
        atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    except OSError as e:
        return _error(f"cannot write {out} ({oneline(e)}); choose a writable path")
    print(f"wrote {out} ({FORMAT}, version {VERSION})", file=sys.stderr)
    return 0


def _error(message):
    print(f"npspec.testing: error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
