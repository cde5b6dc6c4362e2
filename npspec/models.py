"""Find models: the shipped Shakespeare pair, and model SPECs given on the command line.

A SPEC is a path to a converted npspec model directory (see npspec.checkpoint). An existing
local path always wins over any other interpretation.
"""

import sys
from pathlib import Path

from .checkpoint import CheckpointError, load_model

SHIPPED_PAIR = "shakespeare"


def shipped_dir(name, marker="model.safetensors"):
    """Directory of a shipped model or tokenizer, e.g. `shipped_dir("shakespeare/target")`, `shipped_dir("gpt2", "tokenizer.json")`.

    Looks in the source tree (`weights/` beside `npspec/`, for `pip install -e .` and a plain
    checkout), then in the installed data (`<sys.prefix>/share/npspec/`, for `pip install .`).
    Raises CheckpointError naming both places if neither holds it.
    """
    candidates = [Path(__file__).resolve().parent.parent / "weights" / name,
                  Path(sys.prefix) / "share" / "npspec" / name]
    for c in candidates:
        if (c / marker).is_file():
            return c
    raise CheckpointError(
        f"the shipped model {name!r} is not in {candidates[0]} nor in {candidates[1]}; "
        "reinstall npspec (pip install .) or pass --target/--draft explicitly")


def load(spec=None, role="target"):
    """Load a model from a SPEC (a converted model directory); None loads the shipped `role`.

    role: "target" or "draft", the shipped model used when spec is None.
    Returns a checkpoint.Model. Raises CheckpointError with the fix.
    """
    if spec is None:
        return load_model(shipped_dir(f"{SHIPPED_PAIR}/{role}"))
    path = Path(spec).expanduser()
    if path.exists():
        return load_model(path)
    raise CheckpointError(f"model {spec!r} is not an existing directory; give the path of a converted "
                          "model (python -m npspec.convert SRC OUT_DIR makes one)")
