"""npspec convert SRC OUT_DIR: convert a Hugging Face GPT-2 checkpoint directory into npspec's layout.

The command line only (argparse -> npspec.sources.huggingface.convert, which holds every check and the atomic
swap of OUT_DIR -> one line on stderr); without tokenizer.json GPT-2's is used if it fits
(npspec.sources.cache.fallback_tokenizer_json); OUT_DIR must be new or empty, or an npspec model replaced with
--force, never a symlink (npspec.sources.files.out_dir_problem). Exit 0, 1 an error, 2 usage, 130 Ctrl-C, 143
SIGTERM (both delete what was written). Only npspec.cli.main imports it.
"""

import os
import sys

from .console import Parser, Terminated, notes_to, parsed, streams, terminate_as_interrupt
from ..sources.errors import CheckpointError, oneline
from ..sources.huggingface import convert
from ..sources.progress import show_progress, terminal_bars
from ..sources.cache import fallback_tokenizer_json
from .startup import started


def build_parser(prog, out=None, err=None):
    """The argument parser (npspec.cli.console.Parser: help to `out`, usage errors to `err`); prog: the name usage shows."""
    ap = Parser(prog=prog, description=__doc__.split("\n")[0].split(": ", 1)[1], out=out, err=err)
    ap.add_argument("src", help="Hugging Face GPT-2 checkpoint directory (config.json + model.safetensors)")
    ap.add_argument("out_dir", help="where to write the npspec model: a new or empty directory")
    ap.add_argument("--force", action="store_true", help="replace the npspec model OUT_DIR already holds")
    ap.add_argument("--quiet", action="store_true", help="no progress bars (nor with NPSPEC_QUIET=1 or TQDM_DISABLE=1; "
                                                         "they show only when stderr is a terminal)")
    ap.add_argument("--debug", action="store_true", help="show a traceback on error")
    return ap


def main(argv=None, prog="npspec convert", out=None, err=None):
    """Run the command (argv default sys.argv[1:]; prog: the name usage shows; out, err: console.streams).
    Returns the exit status."""
    started()  # Python's Ctrl-C handler back (npspec.cli.console: the imports had their own)
    out, err = streams(out, err)
    args, status = parsed(lambda: build_parser(prog, out, err), argv, err, "npspec.convert")
    if args is None:
        return status
    progress = terminal_bars if show_progress(args.quiet, err, os.environ) else None
    try:
        # SIGTERM cleans up as Ctrl-C does: the staging directory is deleted; notes go to err
        with terminate_as_interrupt(), notes_to(err, "npspec.convert"):
            written = convert(args.src, args.out_dir, tokenizer_json=fallback_tokenizer_json(args.src),
                              force=args.force, progress=progress)
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        print(f"npspec.convert: {how}; {args.out_dir} was left as it was", file=err)
        return 143 if isinstance(e, Terminated) else 130
    except (CheckpointError, OSError) as e:
        if args.debug:
            raise
        message = str(e) if isinstance(e, CheckpointError) else \
            f"cannot write {args.out_dir} ({oneline(e)}); choose a writable OUT_DIR"
        print(f"npspec.convert: error: {message}", file=err)
        return 1
    print(f"wrote {written}", file=err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
