"""npspec convert SRC OUT_DIR: convert a Hugging Face GPT-2 checkpoint directory into npspec's layout.

SRC holds `config.json` + `model.safetensors` [+ `tokenizer.json`] (as transformers' save_pretrained
writes it); without tokenizer.json, GPT-2's is used if it fits, as `--target DIR` does (one rule:
npspec.sources.cache.fallback_tokenizer_json). OUT_DIR must be new or empty, or hold an npspec model
to replace with --force (swapped in atomically: a reader of OUT_DIR meanwhile sees the old model or the new); a
symlink is refused, whatever it points to (npspec.sources.files.out_dir_problem).
SIGTERM, like Ctrl-C, stops the conversion and deletes what it had written (exit 143; Ctrl-C 130). The conversion and its checks are npspec.sources.huggingface.convert. This module is
the command line only (argparse -> convert -> one line on stderr; progress bars on a terminal unless
--quiet, NPSPEC_QUIET or TQDM_DISABLE); only npspec.cli.main imports it.
"""

import os
import sys

from .console import Parser, Terminated, error_stream, notes_to, parse, terminate_as_interrupt
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
    """Run the command (argv: its arguments; default sys.argv[1:]); prog: the name usage shows; out, err: its streams
    (default sys.stdout and sys.stderr; a closed stderr drops messages). Returns the exit status."""
    started()  # Python's Ctrl-C handler back (npspec.cli.console: the imports had their own)
    out = sys.stdout if out is None else out
    err = error_stream(sys.stderr if err is None else err)
    try:
        args, status = parse(build_parser(prog, out, err), argv, err, "npspec.convert")
    except KeyboardInterrupt:
        print("npspec.convert: interrupted", file=err)
        return 130
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
