"""Find models: the shipped Shakespeare pair, and model SPECs given on the command line.

A SPEC is resolved in this order:
  1. an existing local path: a converted npspec directory (model.safetensors + tokenizer.json),
     or a Hugging Face checkpoint directory (config.json + model.safetensors [+ tokenizer.json]),
     converted on first use into the cache;
  2. `random:<shape>`, a shape of npspec.init.SHAPES (gpt2, gpt2-medium, gpt2-large, gpt2-xl,
     distilgpt2, tiny, tiny-draft): GPT-2's initialisation, seed 0, built once into the cache;
  3. a hub name: gpt2, gpt2-medium, gpt2-large, gpt2-xl (openai-community/...), distilgpt2
     (distilbert/distilgpt2), or any `org/name`: downloaded with huggingface_hub and converted
     once into the cache.
A Hugging Face checkpoint without tokenizer.json gets GPT-2's tokenizer (weights/gpt2/). The
cache directory and its layout are described in npspec.hub.
"""

import json
import re
import sys
from pathlib import Path

from . import hub
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


def same_tokenizer(a, b):
    """True if two tokenizers.Tokenizer map text to the same ids and back.

    Compares their JSON without the runtime settings `truncation` and `padding` (the target's
    tokenizer does all encoding and decoding), so the same vocabulary saved by different
    repositories (gpt2-large, distilgpt2) still counts as the same.
    """
    def core(t):
        d = json.loads(t.to_str())
        return {k: v for k, v in d.items() if k not in ("truncation", "padding")}

    return a is b or a.to_str() == b.to_str() or core(a) == core(b)


def _is_repo_id(name):
    # org/name as the hub spells it: one slash, letters, digits, '-', '_', '.', no leading or trailing '-' / '.'
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", name) is not None and \
        ".." not in name and not name.endswith((".", "-"))


def resolve(spec, cache_dir=None):
    """The converted model directory a SPEC (see the module docstring) names, converted into the cache first if needed.

    cache_dir: npspec's cache (default hub.cache_dir(): $NPSPEC_CACHE or ~/.cache/npspec).
    Returns a Path. Raises CheckpointError naming the problem and the fix.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else hub.cache_dir()
    spec = str(spec)
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_dir() and (path / "config.json").is_file():
            return hub.from_local(path, root)
        return path  # a converted directory; load_model reports anything wrong with it
    if spec.startswith("random:"):
        return hub.from_random(spec[len("random:"):], root)
    repo_id = hub.HUB_NAMES.get(spec, spec)
    if _is_repo_id(repo_id) and not spec.startswith((".", "~", "/")):
        return hub.from_hub(repo_id, root, spec)
    if spec.startswith((".", "~", "/")) or spec.count("/") > 1 or "\\" in spec:
        raise CheckpointError(f"model {spec!r} is not an existing directory; give the path of a converted model or "
                              "of a Hugging Face checkpoint (config.json + model.safetensors)")
    raise CheckpointError(
        f"unknown model {spec!r}: not an existing directory, not random:<shape> ("
        + ", ".join(_shapes()) + "), not a hub name (" + ", ".join(hub.HUB_NAMES) + ") nor org/name")


def _shapes():
    from .init import SHAPES

    return list(SHAPES)


def load(spec=None, role="target", cache_dir=None):
    """Load a model from a SPEC (see the module docstring); None loads the shipped `role`.

    role: "target" or "draft": the shipped model used when spec is None, and the matmul strategy.
    A draft decodes with "rows" (one BLAS GEMV per row over each whole matrix, which BLAS
    threads itself: the fastest one-token product; see bench/results/README.md), a target with
    the layout's default ("panels": the cheapest verify of gamma + 1 rows). Which product the
    draft uses never changes the output: every q gives exactly the target's law, and greedy
    output is the target's argmax sequence (notes/derivation.md).
    cache_dir: npspec's conversion cache (default: $NPSPEC_CACHE, else ~/.cache/npspec).
    Returns a checkpoint.Model. Raises CheckpointError with the fix, ValueError for another role.
    """
    if role not in ("target", "draft"):
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    model = _load(spec, role, cache_dir)
    return as_draft(model) if role == "draft" else model


def as_draft(model):
    """Make `model` decode as a draft: matmul "rows" (see `load`). Returns the model."""
    model.matmul = "rows"
    return model


def _load(spec, role, cache_dir):
    if spec is None:
        return load_model(shipped_dir(f"{SHIPPED_PAIR}/{role}"))
    path = resolve(spec, cache_dir)
    try:
        return load_model(path)
    except CheckpointError as e:
        root = Path(cache_dir).expanduser() if cache_dir is not None else hub.cache_dir()
        if root.resolve() in path.resolve().parents:
            raise CheckpointError(f"{e} (the cached conversion {path} is damaged: delete it and run again)") from e
        raise
