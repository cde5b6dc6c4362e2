"""What the tests share: the tiny models, the shipped pair, and the one subprocess runner.

Tiny models decode with NumPy kernels fixed here (TINY_KERNELS: a target with "gemm-blocks", a draft with
"gemv-panels"), whatever is installed; the shipped pair loads with each role's first candidate, unmeasured
(probe "off": "compiled-panels" with the fast extra, else "gemm-blocks" / "gemv-panels"; npspec.kernels.registry). The one scripted-uniforms double is
npspec.testing.ScriptedRng; the one enumeration oracle is npspec.testing.
"""

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from npspec.decode.evaluate import split_corpus
from npspec.model.tensors import params_tree
from npspec.model.gpt2 import GPT2Config
from npspec.sources.init import init_tensors
from npspec.model.model import Model
from npspec.kernels.registry import REGISTRY
from npspec.sources import load

settings.register_profile("npspec", deadline=None, print_blob=True)
settings.load_profile("npspec")

# Ctrl-C reaches the children the signal tests start: a shell starts a background job (`pytest &`) with SIGINT
# ignored, children inherit that, and Python then never installs its KeyboardInterrupt handler, so a child sent
# SIGINT ran on to the end (tests/test_convert_out.py, tests/test_hostile_signals.py timed out). A handler here
# (not SIG_IGN) is reset to the default in every child that execs.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "weights" / "shakespeare"
TINY_KERNELS = {"target": "gemm-blocks", "draft": "gemv-panels"}


def tiny_model(seed=0, role="target", **shape):
    """A randomly initialised Model (no tokenizer) of a tiny shape, built in memory, with `role`'s kernel.

    Weights are 5x GPT-2's init, so logits are far from uniform and the tests can see errors.
    """
    cfg = dict(n_vocab=67, n_ctx=32, n_embd=16, n_head=2, n_layer=2, eos_token_id=None)
    config = GPT2Config(**{**cfg, **shape})
    tensors = init_tensors(config, seed)
    tensors = {k: v * np.float32(5) if k.endswith("weight") and ".ln" not in k and "ln_f" not in k else v
               for k, v in tensors.items()}
    return Model(config, params_tree(tensors, config), None, "tiny", TINY_KERNELS[role])


def installed(kernels):
    """pytest params of the kernel names, those whose extra is not installed skipped with the reason."""
    return [pytest.param(k, marks=pytest.mark.skipif(not REGISTRY[k].available(),
                                                     reason=f"{k} needs the {REGISTRY[k].extra!r} extra (numba)"))
            for k in kernels]


def make(name, threads=1):
    """The registry's kernel `name` built with `threads`."""
    return REGISTRY[name].build(threads)


def run_python(*argv, stdin=None, env=None, cwd=ROOT, timeout=600, text=True):
    """Run this interpreter with `argv` (e.g. "-m", "npspec.generate", "--gamma", 2, or "-c", code) in a subprocess.

    Returns the CompletedProcess (stdout, stderr, returncode).
    env: variables added to this process's environment (a value None removes one). stdin: str or bytes.
    """
    full_env = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    return subprocess.run([sys.executable, *map(str, argv)], input=stdin, capture_output=True,
                          text=text, cwd=cwd, env=full_env, timeout=timeout)


@pytest.fixture(scope="session")
def tiny():
    return tiny_model()


@pytest.fixture(scope="session")
def shipped():
    return load(None, "target", probe="off"), load(None, "draft", probe="off")


@pytest.fixture(scope="session")
def card():
    return json.loads((SHIPPED / "card.json").read_text())


@pytest.fixture(scope="session")
def val_ids(shipped):
    _, val = split_corpus((SHIPPED / "input.txt").read_text(encoding="utf-8"))
    return shipped[0].tokenizer.encode(val).ids


@pytest.fixture
def notes(caplog):
    """A function returning the one-line notes npspec's loggers gave so far in the test (the commands print them)."""
    caplog.set_level(logging.INFO, logger="npspec")
    return lambda: [r.getMessage() for r in caplog.records if r.name.startswith("npspec")]
