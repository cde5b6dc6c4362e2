"""The files npspec ships: the Shakespeare pair and GPT-2's tokenizer, in the source tree or the install. Imports
npspec.sources.errors and tokenizers.
"""

import sys
from pathlib import Path

from tokenizers import Tokenizer

from .errors import CheckpointError

SHIPPED_PAIR = "shakespeare"


def shipped_dir(name, marker="model.safetensors"):
    """The directory of a shipped model or tokenizer (`shipped_dir("shakespeare/target")`, `shipped_dir("gpt2",
    "tokenizer.json")`): `weights/` beside `npspec/`, else `<sys.prefix>/share/npspec/`. Raises CheckpointError
    naming both."""
    candidates = [Path(__file__).resolve().parents[2] / "weights" / name,
                  Path(sys.prefix) / "share" / "npspec" / name]
    for c in candidates:
        if (c / marker).is_file():
            return c
    raise CheckpointError(
        f"the shipped model {name!r} is not in {candidates[0]} nor in {candidates[1]}; "
        "reinstall npspec (pip install .) or pass --target/--draft explicitly")


def gpt2_tokenizer_json():
    """The text of GPT-2's tokenizer.json (weights/gpt2/)."""
    return (shipped_dir("gpt2", "tokenizer.json") / "tokenizer.json").read_text(encoding="utf-8")


def gpt2_tokenizer():
    """GPT-2's tokenizers.Tokenizer (weights/gpt2/)."""
    return Tokenizer.from_str(gpt2_tokenizer_json())
