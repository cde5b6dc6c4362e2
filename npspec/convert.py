"""python -m npspec.convert SRC OUT_DIR: convert a Hugging Face GPT-2 checkpoint directory into npspec's layout.

SRC holds `config.json` + `model.safetensors` [+ `tokenizer.json`] (as transformers' save_pretrained
writes it); without tokenizer.json, GPT-2's is used if it fits, as `--target DIR` does (one rule:
npspec.sources.cache.fallback_tokenizer_json). OUT_DIR must be new or empty, or hold an npspec model
to replace with --force. The conversion and its checks are npspec.huggingface.convert. This module is
the command line only (argparse -> convert -> one line on stderr; progress bars on a terminal unless
--quiet, NPSPEC_QUIET or TQDM_DISABLE); only npspec.cli imports it.
"""

import argparse
import os
import sys

from .files import CheckpointError, oneline
from .huggingface import convert
from .progress import show_progress, terminal_bars
from .sources.cache import fallback_tokenizer_json


def main(argv=None, prog="python -m npspec.convert"):
    """Run the command (argv: its arguments; default sys.argv[1:]); prog: the name usage shows. Returns the exit status."""
    if sys.stderr is None:  # stderr closed (2>&-): print(file=None) would write messages to STDOUT; drop them
        sys.stderr = open(os.devnull, "w")
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0].split(": ", 1)[1])
    ap.add_argument("src", help="Hugging Face GPT-2 checkpoint directory (config.json + model.safetensors)")
    ap.add_argument("out_dir", help="where to write the npspec model: a new or empty directory")
    ap.add_argument("--force", action="store_true", help="replace the npspec model OUT_DIR already holds")
    ap.add_argument("--quiet", action="store_true", help="no progress bars (nor with NPSPEC_QUIET=1 or TQDM_DISABLE=1; "
                                                         "they show only when stderr is a terminal)")
    ap.add_argument("--debug", action="store_true", help="show a traceback on error")
    args = ap.parse_args(argv)
    progress = terminal_bars if show_progress(args.quiet, sys.stderr, os.environ) else None
    try:
        out = convert(args.src, args.out_dir, tokenizer_json=fallback_tokenizer_json(args.src), force=args.force,
                      progress=progress)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"npspec.convert: interrupted; {args.out_dir} was left as it was", file=sys.stderr)
        return 130
    except (CheckpointError, OSError) as e:
        if args.debug:
            raise
        message = str(e) if isinstance(e, CheckpointError) else \
            f"cannot write {args.out_dir} ({oneline(e)}); choose a writable OUT_DIR"
        print(f"npspec.convert: error: {message}", file=sys.stderr)
        return 1
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
