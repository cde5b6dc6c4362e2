"""The files npspec ships: the Shakespeare model pair and GPT-2's tokenizer, found in the source tree or the install.

Imports npspec.sources.files (CheckpointError) and tokenizers.
"""

import sys
from pathlib import Path

from tokenizers import Tokenizer

from .errors import CheckpointError

SHIPPED_PAIR = "shakespeare"


def shipped_dir(name, marker="model.safetensors"):
    """Directory of a shipped model or tokenizer, e.g. `shipped_dir("shakespeare/target")`, `shipped_dir("gpt2", "tokenizer.json")`.

    Looks in the source tree (`weights/` beside `npspec/`, for `pip install -e .` and a plain
    checkout), then in the installed data (`<sys.prefix>/share/npspec/`, for `pip install .`).
    Raises CheckpointError naming both places if neither holds it.
    """
    candidates = [Path(__file__).resolve().parents[2] / "weights" / name,
                  Path(sys.prefix) / "share" / "npspec" / name]
    for c in candidates:
        if (c / marker).is_file():
            return c
    raise CheckpointError(
        f"the shipped model {name!r} is not in {candidates[0]} nor in {candidates[1]}; "
        "reinstall npspec (pip install .) or pass --target/--draft explicitly")


def gpt2_tokenizer_json():
    """The text of GPT-2's tokenizer.json, shipped in weights/gpt2/."""
    return (shipped_dir("gpt2", "tokenizer.json") / "tokenizer.json").read_text(encoding="utf-8")


def gpt2_tokenizer():
    """GPT-2's tokenizer (a tokenizers.Tokenizer), shipped in weights/gpt2/."""
    return Tokenizer.from_str(gpt2_tokenizer_json())
