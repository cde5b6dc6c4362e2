import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from npspec.checkpoint import Model, params_tree
from npspec.init import init_tensors
from npspec.model import GPT2Config

settings.register_profile("npspec", deadline=None, print_blob=True)
settings.load_profile("npspec")

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "weights" / "shakespeare"


def tiny_model(seed=0, **shape):
    """A randomly initialised Model (no tokenizer) of a tiny shape, built in memory."""
    cfg = dict(n_vocab=67, n_ctx=32, n_embd=16, n_head=2, n_layer=2, eos_token_id=None)
    config = GPT2Config(**{**cfg, **shape})
    tensors = init_tensors(config, seed)
    # larger weights than GPT-2's init, so logits are far from uniform and the tests can see errors
    tensors = {k: v * np.float32(5) if k.endswith("weight") and ".ln" not in k and "ln_f" not in k else v
               for k, v in tensors.items()}
    return Model(config, params_tree(tensors, config), None, Path("tiny"), {})


@pytest.fixture(scope="session")
def tiny():
    return tiny_model()


@pytest.fixture(scope="session")
def shipped():
    from npspec.models import load

    return load(None, "target"), load(None, "draft")


@pytest.fixture(scope="session")
def card():
    return json.loads((SHIPPED / "card.json").read_text())


@pytest.fixture(scope="session")
def val_ids(shipped):
    from npspec.evaluate import split_corpus

    _, val = split_corpus((SHIPPED / "input.txt").read_text(encoding="utf-8"))
    return shipped[0].tokenizer.encode(val).ids
